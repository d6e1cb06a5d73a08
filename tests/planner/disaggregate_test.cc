// The disaggregation allocator: MILP against exhaustive enumeration, the roofline formulas, and the
// sequence-length trend DisagMoE reports.
#include "piper/planner/disaggregate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "piper/base/check.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "search_case.h"

namespace piper::planner {
namespace {

AfModel make_model(const std::string& model, const std::string& cluster, int nodes, int64_t batch, int64_t seq,
                   AfOptions options = {}) {
  const test_support::SearchCase c = test_support::make_case(model, cluster, nodes, batch, seq);
  auto a = AfModel::create(c.model, c.cluster, c.train, options);
  PIPER_CHECK(a.ok(), a.status().message());
  return *a;
}

void expect_milp_matches_enumeration(const AfModel& af) {
  if (!have_cbc()) GTEST_SKIP() << "built without COIN-OR CBC";
  auto cands = af.candidates(nullptr);
  ASSERT_FALSE(cands.empty());
  auto exhaustive = enumerate_allocation(af, cands);
  ASSERT_TRUE(exhaustive.ok()) << exhaustive.status().message();
  auto solver = make_cbc_solver();
  ASSERT_TRUE(solver.ok());
  bool proven = false;
  auto milp = milp_allocation(af, cands, **solver, &proven);
  ASSERT_TRUE(milp.ok()) << milp.status().message();
  EXPECT_TRUE(proven);
  EXPECT_NEAR(milp->objective, exhaustive->objective, 1e-9 * exhaustive->objective);
  EXPECT_TRUE(af.ports_feasible(milp->candidate, milp->ports_attn));
  // The exhaustive answer is no worse than any feasible pair.
  for (const auto& c : cands) {
    for (int n = 1; n < af.total_ports(); ++n) {
      if (af.ports_feasible(c, n)) {
        EXPECT_LE(exhaustive->objective, af.objective(c, n));
      }
    }
  }
}

TEST(DisaggregateTest, MilpMatchesEnumerationDeepSeekV2LiteFourNodes) {
  expect_milp_matches_enumeration(make_model("deepseek-v2-lite", "h800", 4, 240, 4096));
}

TEST(DisaggregateTest, MilpMatchesEnumerationQwen3On8NodesLongSequence) {
  expect_milp_matches_enumeration(make_model("qwen3-30b-a3b", "h800", 8, 480, 16384));
}

TEST(DisaggregateTest, MilpMatchesEnumerationWholeNodePlacement) {
  AfOptions o;
  o.placement = AfPlacement::kNode;
  expect_milp_matches_enumeration(make_model("qwen3-30b-a3b", "h800", 8, 480, 4096, o));
}

TEST(DisaggregateTest, MilpMatchesEnumerationOnOneNode) {
  expect_milp_matches_enumeration(make_model("tiny-moe", "h800", 1, 64, 128));
}

TEST(DisaggregateTest, FfnIntensityMatchesHandFormula) {
  // SwiGLU expert: F + B + W = 18 h f_e FLOPs per (token, expert); bytes per direction h * 2 * (k + 1):
  // intensity = 9 f_e k / (k + 1). tiny-moe: f_e = 256, k = 2 -> 1536 FLOP/B.
  AfModel af = make_model("tiny-moe", "local-cpu", 1, 8, 128);
  EXPECT_NEAR(af.ffn_intensity(), 9.0 * 256 * 2 / 3, 1e-6);
  EXPECT_GT(af.attn_intensity(), 0);
}

TEST(DisaggregateTest, TurningPointIsWhereAttentionMeetsTheBalance) {
  AfModel af = make_model("qwen3-235b-a22b", "h800", 16, 480, 4096);
  const double balance = af.balance(64, 64);
  ASSERT_GT(af.attn_intensity(), 0);
  EXPECT_LT(af.attn_intensity(), balance);  // network-bound at 4K with one NIC per GPU
  const double s = af.attn_turning_seq(balance);
  ASSERT_GT(s, 4096);
  AfModel at = make_model("qwen3-235b-a22b", "h800", 16, 480, static_cast<int64_t>(std::llround(s)));
  EXPECT_NEAR(at.attn_intensity() / balance, 1.0, 0.01);
}

TEST(DisaggregateTest, CandidatesAreValidStrategies) {
  auto m = load_model("deepseek-v2-lite");
  auto c = load_cluster("h800", 4);
  ASSERT_TRUE(m.ok() && c.ok());
  TrainSpec t;
  t.global_batch = 240;
  AfModel af = make_model("deepseek-v2-lite", "h800", 4, 240, 4096);
  std::vector<std::pair<std::string, int64_t>> rejected;
  auto cands = af.candidates(&rejected);
  ASSERT_FALSE(cands.empty());
  int64_t rejected_total = 0;
  for (const auto& r : rejected) rejected_total += r.second;
  EXPECT_GT(rejected_total, 0);
  for (const auto& cand : cands) {
    EXPECT_EQ(cand.attn + cand.ffn, c->world_size());
    Strategy s = cand.strategy();
    Status v = s.validate_for(*m, t, c->world_size());
    EXPECT_TRUE(v.ok()) << s.to_string() << ": " << v.message();
    auto parsed = Strategy::parse(s.to_string());
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, s);
    EXPECT_LE(cand.mem_attn_bytes, 0.95 * static_cast<double>(c->device.memory_bytes));
    EXPECT_LE(cand.mem_ffn_bytes, 0.95 * static_cast<double>(c->device.memory_bytes));
  }
}

TEST(DisaggregateTest, PlacementBoundsThePorts) {
  AfOptions node;
  node.placement = AfPlacement::kNode;
  AfModel whole = make_model("qwen3-30b-a3b", "h800", 8, 480, 4096, node);
  AfModel spread = make_model("qwen3-30b-a3b", "h800", 8, 480, 4096);
  for (const auto& c : whole.candidates(nullptr)) {
    EXPECT_EQ(c.max_ports_attn, 8 * ((c.attn + 7) / 8));
    EXPECT_EQ(c.max_ports_ffn, 8 * ((c.ffn + 7) / 8));
  }
  for (const auto& c : spread.candidates(nullptr)) {
    EXPECT_EQ(c.max_ports_attn, 8 * std::min(8, c.attn));
  }
}

// DisagMoE: the best A:F GPU ratio moves toward attention as the sequence grows (attention's FLOPs per token
// grow with the sequence, the experts' do not). Same token budget per step at both lengths.
TEST(DisaggregateTest, AttentionShareGrowsWithSequenceLength) {
  AfModel short_seq = make_model("qwen3-235b-a22b", "h800", 32, 960, 4096);
  AfModel long_seq = make_model("qwen3-235b-a22b", "h800", 32, 960, 32768);
  auto a = disaggregate(short_seq, nullptr);
  auto b = disaggregate(long_seq, nullptr);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  const double ra = static_cast<double>(a->best.candidate.attn) / a->best.candidate.ffn;
  const double rb = static_cast<double>(b->best.candidate.attn) / b->best.candidate.ffn;
  EXPECT_GT(rb, ra);
  EXPECT_GT(long_seq.attn_intensity(), short_seq.attn_intensity());
  EXPECT_DOUBLE_EQ(long_seq.ffn_intensity(), short_seq.ffn_intensity());
}

TEST(DisaggregateTest, BadInputsAreErrors) {
  auto dense = load_model("gpt-1.7b");
  auto cluster = load_cluster("h800", 2);
  ASSERT_TRUE(dense.ok() && cluster.ok());
  TrainSpec t;
  t.global_batch = 64;
  auto a = AfModel::create(*dense, *cluster, t, {});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("MoE"), std::string::npos);
  auto moe = load_model("tiny-moe");
  ASSERT_TRUE(moe.ok());
  AfOptions o;
  o.pp = {};
  EXPECT_FALSE(AfModel::create(*moe, *cluster, t, o).ok());
  EXPECT_FALSE(parse_af_placement("racks").ok());
  // One sequence per step cannot feed 2 pp microbatches: nothing is feasible, and the error says why.
  t.global_batch = 1;
  auto tiny = AfModel::create(*moe, *cluster, t, {});
  ASSERT_TRUE(tiny.ok());
  auto r = disaggregate(*tiny, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("microbatches_lt_2pp"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace piper::planner
