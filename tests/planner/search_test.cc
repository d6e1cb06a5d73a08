// planner::search against the brute-force oracle, hand-counted rules, and properties of every returned plan.
#include "piper/planner/search.h"

#include <gtest/gtest.h>

#include <set>

#include "piper/base/check.h"
#include "search_case.h"

namespace piper::planner {
namespace {

using Case = test_support::SearchCase;
using test_support::make_case;

void expect_same_plans(const SearchResult& a, const SearchResult& b) {
  ASSERT_EQ(a.top.size(), b.top.size());
  for (size_t i = 0; i < a.top.size(); ++i) {
    EXPECT_EQ(a.top[i].strategy.to_string(), b.top[i].strategy.to_string()) << "plan " << i;
    EXPECT_EQ(a.top[i].estimate.step_time_s, b.top[i].estimate.step_time_s) << "plan " << i;
  }
}

void expect_matches_brute_force(const Case& c, SearchOptions o) {
  o.verify = false;  // the oracle scores with the closed form only
  auto fast = search(c.model, c.cluster, c.train, o);
  auto slow = brute_force(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(fast.ok()) << fast.status().message();
  ASSERT_TRUE(slow.ok()) << slow.status().message();
  ASSERT_FALSE(fast->top.empty());
  expect_same_plans(*fast, *slow);
  EXPECT_EQ(fast->stats.considered, slow->stats.considered);
  EXPECT_EQ(fast->stats.rejected[static_cast<int>(Rule::kInvalid)], 0) << "a validate_for rule is not mirrored";
  EXPECT_EQ(fast->stats.considered, fast->stats.rejected_total() + fast->stats.fitting);
  EXPECT_LT(fast->stats.scored, slow->stats.scored);
  // Brute force scores duplicates too, so it finds at least as many fitting candidates.
  EXPECT_GE(slow->stats.fitting, fast->stats.fitting);
}

TEST(SearchTest, TinyMoeOnTwoCoresMatchesBruteForce) {
  SearchOptions o;
  o.top_k = 8;
  expect_matches_brute_force(make_case("tiny-moe", "local-cpu", 1, 8, 128), o);
}

// Measured expert loads (SearchOptions::expert_load_by_ep): a candidate is priced with the calibration of its ep,
// and the search still returns what brute force finds.
TEST(SearchTest, ExpertLoadByEpPricesEachCandidateAtItsEp) {
  const Case c = make_case("tiny-moe", "dgx-h100", 1, 16, 128);
  SearchOptions o;
  o.top_k = 40;
  o.expert_load_by_ep = {{1, {1.0, 1.0}}, {2, {1.5, 1.25}}, {4, {2.0, 1.75}}, {8, {3.0, 2.5}}};
  expect_matches_brute_force(c, o);
  o.verify = false;
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::set<int> eps;
  for (const Plan& p : r->top) {
    TrainSpec t = c.train;
    t.micro_batch_size = p.strategy.mbs;
    cost::Calibration cal;
    cal.expert_load_imbalance = o.expert_load_by_ep.at(p.strategy.ep).time;
    cal.expert_memory_load = o.expert_load_by_ep.at(p.strategy.ep).memory;
    auto cm = cost::CostModel::create(c.model, c.cluster, t, cal);
    ASSERT_TRUE(cm.ok());
    auto e = cm->estimate(p.strategy);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->step_time_s, p.estimate.step_time_s) << p.strategy.to_string();
    EXPECT_EQ(e->memory.total(), p.peak_memory_bytes()) << p.strategy.to_string();
    eps.insert(p.strategy.ep);
  }
  EXPECT_GE(eps.size(), 2u) << "the top plans span one ep only";
  EXPECT_EQ(o.calibration_for(4).expert_load_imbalance, 2.0);
  EXPECT_EQ(o.calibration_for(16).expert_load_imbalance, o.calibration.expert_load_imbalance);
}

TEST(SearchTest, TinyMoeOnTwoH800NodesMatchesBruteForce) {
  SearchOptions o;
  o.top_k = 6;
  o.space.mbs = {1, 2};
  expect_matches_brute_force(make_case("tiny-moe", "h800", 2, 32, 128), o);
}

TEST(SearchTest, DenseModelMatchesBruteForce) {
  SearchOptions o;
  o.top_k = 5;
  o.space.zero = {0, 1, 3};
  expect_matches_brute_force(make_case("gpt-1.7b", "dgx-a100", 2, 64, 2048), o);
}

TEST(SearchTest, DeepSeekV2LiteOnFourNodesMatchesBruteForce) {
  SearchOptions o;
  o.top_k = 5;
  o.space.mbs = {1, 2};
  o.space.zero = {1, 3};
  o.space.recompute = {Recompute::kNone, Recompute::kFull};
  o.space.orders = {{"tp", "ep", "dp", "pp"}, {"tp", "dp", "ep", "pp"}, {"tp", "pp", "ep", "dp"}};
  expect_matches_brute_force(make_case("deepseek-v2-lite", "h800", 4, 64, 4096), o);
}

// World 2 (one node of two cores): every count below is worked out by hand in the comments.
TEST(SearchTest, RuleCountsByHand) {
  Case c = make_case("tiny-moe", "local-cpu", 1, 8, 128);
  SearchOptions o;
  o.space.mbs = {1};
  o.space.schedules = {"1f1b"};
  o.space.zero = {0};
  o.space.recompute = {Recompute::kNone};
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto count = [&](Rule rule) { return r->stats.rejected[static_cast<int>(rule)]; };
  // Items (tp, pp) in {(1,1), (1,2), (2,1)} x ep in {1,2,4,8}; a block is sp(2) x a2a(2) x order(6) = 24
  // candidates, twice that for tp=2 (etp in {1,2}): 8 * 24 + 4 * 48 = 384.
  EXPECT_EQ(r->stats.considered, 384);
  // ep must divide dp: dp=2 rejects ep 4,8 (2 * 24); pp=2 (dp=1) rejects ep 2,4,8 (3 * 24); tp=2 (dp=1) rejects
  // ep 4,8 (2 * 48) and folds ep=2 over tp*dp = 2 (Strategy::fold), whose etp=2 block is rejected (24).
  EXPECT_EQ(count(Rule::kEpDividesDp), 48 + 72 + 96 + 24);
  EXPECT_EQ(count(Rule::kSpNeedsTp), 3 * 12);     // three tp=1 items with sp=1, 12 each
  EXPECT_EQ(count(Rule::kMoeTpNeedsSp), 3 * 12);  // tp=2, sp=0: ep=1 for both etp, folded ep=2
  // Six (item, etp) blocks remain; the four with ep=1 drop halo (6 each).
  EXPECT_EQ(count(Rule::kDuplicateA2a), 4 * 6);
  // Each block has one non-trivial axis, so 5 of its 6 orders are duplicates (ep=2 keeps both a2a: 10); folded,
  // every order lays the ranks out alike (tp only): 10.
  EXPECT_EQ(count(Rule::kDuplicateOrder), 5 + 10 + 5 + 10 + 10);
  EXPECT_EQ(r->stats.scored, 8);
  EXPECT_EQ(r->stats.fitting, 8);
  EXPECT_EQ(r->stats.rejected_total(), 376);
}

// The HALO memo shared by the search's cost models (one per micro batch size, so keys differ in tokens and the
// memo must tell them apart) gives the same estimates, bit for bit, as recomputing the traffic per candidate.
TEST(SearchTest, ClosedFormMemoGivesTheSameSearch) {
  Case c = make_case("deepseek-v2-lite", "h800", 8, 256, 4096);
  SearchOptions o;
  o.top_k = 40;
  o.verify = false;
  o.space.a2a = {"halo"};
  o.memoise_closed_form = false;
  auto off = search(c.model, c.cluster, c.train, o);
  o.memoise_closed_form = true;
  auto on = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(off.ok() && on.ok());
  expect_same_plans(*off, *on);
  EXPECT_EQ(off->stats.rejected, on->stats.rejected);
  EXPECT_EQ(off->stats.scored, on->stats.scored);
  EXPECT_EQ(off->stats.fitting, on->stats.fitting);
  std::set<int> ep_sizes, mbs_sizes;
  for (size_t i = 0; i < on->top.size(); ++i) {
    const Plan& a = off->top[i];
    const Plan& b = on->top[i];
    EXPECT_EQ(a.estimate.comm.ep_s, b.estimate.comm.ep_s) << "plan " << i;
    EXPECT_EQ(a.estimate.t_f_s, b.estimate.t_f_s) << "plan " << i;
    EXPECT_EQ(a.peak_memory_bytes(), b.peak_memory_bytes()) << "plan " << i;
    if (b.strategy.ep > 1) ep_sizes.insert(b.strategy.ep);
    mbs_sizes.insert(b.strategy.mbs);
  }
  // The comparison covers several EP groups and micro batch sizes (distinct memo keys).
  EXPECT_GE(ep_sizes.size(), 2u);
  EXPECT_GE(mbs_sizes.size(), 2u);
}

TEST(SearchTest, ResultDoesNotDependOnThreadCount) {
  Case c = make_case("deepseek-v2-lite", "h800", 4, 64, 4096);
  SearchOptions o;
  o.top_k = 10;
  o.verify = false;
  o.threads = 1;
  auto one = search(c.model, c.cluster, c.train, o);
  o.threads = 2;
  auto two = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(one.ok() && two.ok());
  expect_same_plans(*one, *two);
  EXPECT_EQ(one->stats.rejected, two->stats.rejected);
  EXPECT_EQ(one->stats.scored, two->stats.scored);
  EXPECT_EQ(two->stats.threads, 2);
}

TEST(SearchTest, EveryPlanValidatesFitsCompilesAndRoundTrips) {
  Case c = make_case("qwen3-30b-a3b", "h800", 2, 128, 4096);
  SearchOptions o;
  o.top_k = 4;
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->top.size(), 4u);
  EXPECT_GE(r->stats.verified, 4);
  for (size_t i = 0; i < r->top.size(); ++i) {
    const Plan& p = r->top[i];
    EXPECT_TRUE(p.verified) << p.verification.message;
    EXPECT_GT(p.verification.compiled_peak_bytes, 0);
    EXPECT_LE(p.verification.compiled_peak_bytes,
              o.memory_fraction * static_cast<double>(c.cluster.device.memory_bytes));
    if (i > 0) {
      EXPECT_LE(r->top[i - 1].estimate.step_time_s, p.estimate.step_time_s);
    }
    auto parsed = Strategy::parse(p.strategy.to_string());
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    EXPECT_EQ(*parsed, p.strategy);
    TrainSpec t = c.train;
    t.micro_batch_size = p.strategy.mbs;
    Status v = parsed->validate_for(c.model, t, c.cluster.world_size());
    EXPECT_TRUE(v.ok()) << v.message();
    auto cm = cost::CostModel::create(c.model, c.cluster, t);
    ASSERT_TRUE(cm.ok());
    auto e = cm->estimate(*parsed);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->step_time_s, p.estimate.step_time_s);
    EXPECT_TRUE(e->fits);
    EXPECT_LE(e->memory.total(), o.memory_fraction * static_cast<double>(c.cluster.device.memory_bytes));
  }
}

// A plan the verifier rejects is replaced by the next one in the closed-form ranking.
TEST(SearchTest, VerificationReplacesRejectedPlans) {
  Case c = make_case("tiny-moe", "h800", 2, 32, 128);
  SearchOptions o;
  o.top_k = 40;  // deep enough to hold three plans the verifier accepts (ZeRO-2/3 rank below ZeRO-0/1 here)
  o.verify = false;
  auto plain = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(plain.ok());
  ASSERT_EQ(plain->top.size(), 40u);
  // Reject every plan with zero=1 (some of the plain top 3 have it).
  auto pred = [](const Strategy& s) { return s.zero != 1; };
  int rejected_in_top = 0;
  for (size_t i = 0; i < 3; ++i) rejected_in_top += pred(plain->top[i].strategy) ? 0 : 1;
  ASSERT_GT(rejected_in_top, 0);
  o.verify = true;
  o.top_k = 3;
  o.verify_attempts_per_plan = 13;  // the 39 best plans may be compiled: the three accepted ones are among them
  o.verifier = [&](const Strategy& s, const TrainSpec& t) {
    Verification v;
    v.ok = pred(s) && t.micro_batch_size == s.mbs;
    v.message = v.ok ? "" : "rejected by the test";
    return v;
  };
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok());
  std::vector<std::string> expected;
  for (const auto& p : plain->top) {
    if (pred(p.strategy) && expected.size() < 3) expected.push_back(p.strategy.to_string());
  }
  ASSERT_EQ(expected.size(), 3u);
  ASSERT_EQ(r->top.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r->top[i].strategy.to_string(), expected[i]);
    EXPECT_TRUE(r->top[i].verified);
  }
  EXPECT_GT(r->stats.verify_failed, 0);
  EXPECT_NE(r->stats.first_verify_failure.find("rejected by the test"), std::string::npos);
  EXPECT_NE(r->stats.first_verify_failure.find("zero=1"), std::string::npos);
}

TEST(SearchTest, CompilerVerifierRejectsAPlanOverCapacity) {
  Case c = make_case("tiny-moe", "local-cpu", 1, 8, 128);
  SearchOptions o;
  o.top_k = 1;
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->top.size(), 1u);
  const double compiled = r->top[0].verification.compiled_peak_bytes;
  ASSERT_GT(compiled, 0);
  TrainSpec t = c.train;
  t.micro_batch_size = r->top[0].strategy.mbs;
  Verification v = verify_strategy(c.model, t, r->top[0].strategy, compiled / 2);
  EXPECT_FALSE(v.ok);
  EXPECT_FALSE(v.message.empty());
  EXPECT_TRUE(verify_strategy(c.model, t, r->top[0].strategy, 0).ok);
}

TEST(SearchTest, FitsNowhereReportsTheSmallestCandidate) {
  Case c = make_case("deepseek-v3", "h800", 1, 64, 4096);
  SearchOptions o;
  auto r = search(c.model, c.cluster, c.train, o);
  auto b = brute_force(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok() && b.ok());
  EXPECT_TRUE(r->top.empty());
  ASSERT_TRUE(r->has_smallest);
  EXPECT_GT(r->smallest.peak_memory_bytes(), static_cast<double>(c.cluster.device.memory_bytes));
  EXPECT_EQ(r->stats.fitting, 0);
  EXPECT_EQ(r->stats.rejected_total(), r->stats.considered);
  EXPECT_GT(r->stats.rejected[static_cast<int>(Rule::kMemory)], 0);
  // The memory shortcut must not hide a smaller candidate.
  ASSERT_TRUE(b->has_smallest);
  EXPECT_EQ(r->smallest.peak_memory_bytes(), b->smallest.peak_memory_bytes());
  EXPECT_EQ(r->smallest.strategy.to_string(), b->smallest.strategy.to_string());
}

TEST(SearchTest, MemoryFractionTightensFit) {
  Case c = make_case("tiny-moe", "local-cpu", 1, 8, 128);
  SearchOptions o;
  o.verify = false;
  auto loose = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(loose.ok() && !loose->top.empty());
  // Just below the best plan's own memory: that plan (and any needing as much) must drop out.
  o.memory_fraction = 0.999 * loose->top[0].peak_memory_bytes() / static_cast<double>(c.cluster.device.memory_bytes);
  auto tight = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(tight.ok());
  for (const auto& p : tight->top) EXPECT_LT(p.peak_memory_bytes(), loose->top[0].peak_memory_bytes());
  EXPECT_LT(tight->stats.fitting, loose->stats.fitting);
}

TEST(SearchTest, BadInputsAreErrors) {
  Case c = make_case("tiny-moe", "local-cpu", 1, 8, 128);
  SearchOptions o;
  TrainSpec no_batch = c.train;
  no_batch.global_batch = 0;
  auto r = search(c.model, c.cluster, no_batch, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("global_batch"), std::string::npos) << r.status().message();
  SearchOptions bad = o;
  bad.memory_fraction = 0;
  EXPECT_FALSE(search(c.model, c.cluster, c.train, bad).ok());
  bad = o;
  bad.space.mbs = {};
  EXPECT_FALSE(search(c.model, c.cluster, c.train, bad).ok());
  bad = o;
  bad.space.schedules = {"af-pipe"};
  r = search(c.model, c.cluster, c.train, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--disaggregate"), std::string::npos);
  bad = o;
  bad.space.orders = {{"tp", "ep", "dp"}};
  EXPECT_FALSE(search(c.model, c.cluster, c.train, bad).ok());
  bad = o;
  bad.verify_attempts_per_plan = 0;
  EXPECT_FALSE(search(c.model, c.cluster, c.train, bad).ok());
  bad = o;
  bad.top_k = 0;
  EXPECT_FALSE(search(c.model, c.cluster, c.train, bad).ok());
}

}  // namespace
}  // namespace piper::planner
