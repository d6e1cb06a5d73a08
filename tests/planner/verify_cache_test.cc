// The verdict cache (VerifyCache, SearchOptions::verify_cache): candidates that differ only in mesh order or
// all-to-all algorithm get the verdict, message and peak that their own compile gives, and the search returns the
// same plans with and without the cache. Candidates that differ in etp are compiled each (the compiler slices the
// experts over etp).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "piper/planner/search.h"
#include "piper/planner/verify.h"
#include "piper/spec/model_loader.h"
#include "search_case.h"

namespace piper::planner {
namespace {

// DeepSeek-V2-Lite on 16 ranks with 32 microbatches (the memory screen applies: more than 2·pp + 4·pp). Each "hit"
// differs from an earlier candidate only in order or a2a; the others differ in what the compiler reads (ZeRO
// stage, recomputation, etp, mesh) and must be compiled.
struct CacheCase {
  std::string strategy;
  bool hit;
};

std::vector<CacheCase> cache_cases() {
  const std::string mesh = "dp=2,tp=2,pp=4,vpp=1,ep=2,sp=1,mbs=1,microbatches=32,schedule=1f1b,";
  return {{mesh + "zero=1,recompute=none,etp=1,a2a=flat,order=tp-ep-dp-pp", false},
          {mesh + "zero=1,recompute=none,etp=2,a2a=flat,order=tp-ep-dp-pp", false},
          {mesh + "zero=1,recompute=none,etp=1,a2a=halo,order=tp-dp-ep-pp", true},
          {mesh + "zero=1,recompute=none,etp=2,a2a=halo,order=tp-pp-ep-dp", true},
          {mesh + "zero=0,recompute=none,etp=1,a2a=flat,order=tp-ep-dp-pp", false},
          {mesh + "zero=0,recompute=none,etp=1,a2a=halo,order=tp-pp-ep-dp", true},
          {mesh + "zero=1,recompute=full,etp=1,a2a=flat,order=tp-ep-dp-pp", false},
          {mesh + "zero=1,recompute=full,etp=1,a2a=halo,order=tp-ep-dp-pp", true},
          {"dp=4,tp=1,pp=4,vpp=1,ep=4,etp=1,sp=0,mbs=1,microbatches=32,schedule=1f1b,zero=1,recompute=none,a2a=flat",
           false}};
}

TrainSpec train_for(const Strategy& s) {
  TrainSpec t;
  t.seq_len = 1024;
  t.micro_batch_size = s.mbs;
  t.global_batch = s.global_batch();
  return t;
}

TEST(VerifyCacheTest, VerdictsEqualThoseOfTheirOwnCompiles) {
  auto model = load_model("deepseek-v2-lite");
  ASSERT_TRUE(model.ok());
  std::vector<Strategy> strategies;
  std::vector<double> peaks;
  for (const CacheCase& c : cache_cases()) {
    auto s = Strategy::parse(c.strategy);
    ASSERT_TRUE(s.ok()) << c.strategy << ": " << s.status().message();
    ASSERT_TRUE(s->validate_for(*model, train_for(*s), s->world_size()).ok()) << c.strategy;
    const Verification unlimited = verify_strategy(*model, train_for(*s), *s, 0);
    ASSERT_TRUE(unlimited.ok) << c.strategy << ": " << unlimited.message;
    strategies.push_back(*s);
    peaks.push_back(unlimited.compiled_peak_bytes);
  }
  // A capacity between the distinct peaks, so that about half the candidates are rejected.
  std::vector<double> sorted = peaks;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  ASSERT_GE(sorted.size(), 3u) << "the candidates need distinct peaks for this test";
  const size_t mid = sorted.size() / 2;
  const double capacity = (sorted[mid - 1] + sorted[mid]) / 2;

  VerifyCache cache;
  int accepted = 0, rejected = 0, hits = 0;
  for (size_t i = 0; i < strategies.size(); ++i) {
    const Strategy& s = strategies[i];
    const Verification own = verify_strategy(*model, train_for(s), s, capacity);
    const Verification cached = cache.verify(*model, train_for(s), s, capacity);
    EXPECT_EQ(cached.cached, cache_cases()[i].hit) << s.to_string();
    EXPECT_EQ(cached.ok, own.ok) << s.to_string();
    EXPECT_EQ(cached.message, own.message) << s.to_string();
    EXPECT_EQ(cached.compiled_peak_bytes, own.compiled_peak_bytes) << s.to_string();
    EXPECT_EQ(cached.screened, own.screened) << s.to_string();
    EXPECT_EQ(cached.full_compile_estimate_s > 0, own.full_compile_estimate_s > 0) << s.to_string();
    (own.ok ? accepted : rejected) += 1;
    hits += cache_cases()[i].hit ? 1 : 0;
  }
  EXPECT_EQ(cache.hits(), hits);
  EXPECT_GE(accepted, 3);
  EXPECT_GE(rejected, 3);
  // The same candidate at another capacity or micro batch size is a different key.
  const TrainSpec t = train_for(strategies[0]);
  EXPECT_NE(VerifyCache::key(*model, t, strategies[0], capacity, {}),
            VerifyCache::key(*model, t, strategies[0], capacity + (1 << 20), {}));
  EXPECT_NE(VerifyCache::key(*model, t, strategies[0], capacity, {}),
            VerifyCache::key(*model, t, strategies[0], capacity, VerifyOptions{false}));
}

TEST(VerifyCacheTest, ConcurrentCallsWithOneKeyCompileOnce) {
  auto model = load_model("deepseek-v2-lite");
  ASSERT_TRUE(model.ok());
  auto a = Strategy::parse(cache_cases()[0].strategy);
  auto b = Strategy::parse(cache_cases()[2].strategy);
  ASSERT_TRUE(a.ok() && b.ok());
  VerifyCache cache;
  Verification va, vb;
  std::thread ta([&] { va = cache.verify(*model, train_for(*a), *a, 0); });
  std::thread tb([&] { vb = cache.verify(*model, train_for(*b), *b, 0); });
  ta.join();
  tb.join();
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_NE(va.cached, vb.cached);
  EXPECT_TRUE(va.ok && vb.ok) << va.message << vb.message;
  EXPECT_EQ(va.compiled_peak_bytes, vb.compiled_peak_bytes);
}

// The simulation compile of the planner's first plans offers the verdict verify_strategy would give: a plan that
// differs from it only in order or a2a then gets its own compile's verdict, accepted (from the full compile,
// whose peaks equal the first small compile's) or rejected (from the screen).
TEST(VerifyCacheTest, SimulationCompilesOfferTheVerifiersVerdict) {
  auto model = load_model("deepseek-v2-lite");
  auto cluster = load_cluster("h800", 2);
  ASSERT_TRUE(model.ok() && cluster.ok());
  auto a = Strategy::parse(cache_cases()[0].strategy);
  auto b = Strategy::parse(cache_cases()[2].strategy);
  ASSERT_TRUE(a.ok() && b.ok());
  const Verification unlimited = verify_strategy(*model, train_for(*a), *a, 0);
  ASSERT_TRUE(unlimited.ok) << unlimited.message;
  for (const double capacity : {unlimited.compiled_peak_bytes, unlimited.compiled_peak_bytes - (1 << 20)}) {
    VerifyCache cache;
    std::shared_ptr<compile::CompileResult> compiled;
    const Verification sim =
        verify_strategy_for_simulation(*model, *cluster, train_for(*a), *a, {}, capacity, &compiled, {}, &cache);
    const Verification own = verify_strategy(*model, train_for(*b), *b, capacity);
    const Verification cached = cache.verify(*model, train_for(*b), *b, capacity);
    EXPECT_EQ(sim.ok, own.ok);
    EXPECT_TRUE(cached.cached) << capacity;
    EXPECT_EQ(cached.ok, own.ok) << capacity;
    EXPECT_EQ(cached.message, own.message) << capacity;
    EXPECT_EQ(cached.compiled_peak_bytes, own.compiled_peak_bytes) << capacity;
    EXPECT_EQ(cached.screened, own.screened) << capacity;
    EXPECT_EQ(cached.full_compile_estimate_s > 0, own.full_compile_estimate_s > 0) << capacity;
  }
}

TEST(VerifyCacheTest, SearchReturnsTheSamePlansWithAndWithoutTheCache) {
  const test_support::SearchCase c = test_support::make_case("deepseek-v2-lite", "h800", 2, 64, 1024);
  SearchOptions o;
  o.top_k = 6;
  o.verify_cache = false;
  auto before = search(c.model, c.cluster, c.train, o);
  o.verify_cache = true;
  auto after = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(before.ok() && after.ok());
  ASSERT_EQ(after->top.size(), before->top.size());
  for (size_t i = 0; i < before->top.size(); ++i) {
    const Plan& x = after->top[i];
    const Plan& y = before->top[i];
    EXPECT_EQ(x.strategy.to_string(), y.strategy.to_string());
    EXPECT_EQ(x.verification.ok, y.verification.ok);
    EXPECT_EQ(x.verification.compiled_peak_bytes, y.verification.compiled_peak_bytes) << x.strategy.to_string();
    EXPECT_EQ(x.verification.screened, y.verification.screened) << x.strategy.to_string();
  }
  EXPECT_EQ(after->stats.verified, before->stats.verified);
  EXPECT_EQ(after->stats.verify_failed, before->stats.verify_failed);
  EXPECT_EQ(after->stats.verify_screened, before->stats.verify_screened);
  EXPECT_EQ(after->stats.first_verify_failure, before->stats.first_verify_failure);
  EXPECT_EQ(before->stats.verify_cached, 0);
  EXPECT_GT(after->stats.verify_cached, 0) << "no candidate of this search differs only in order or a2a";
}

}  // namespace
}  // namespace piper::planner
