// The planner's compile reuse (SearchOptions::reuse_compiles): a plan verified with the compile the simulator runs
// (verify_strategy_for_simulation) gets the verifier's verdict, and the search returns the same plans and simulated
// step times as with separate compiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "piper/planner/search.h"
#include "piper/planner/verify.h"
#include "search_case.h"

namespace piper::planner {
namespace {

TEST(VerifyReuseTest, VerdictsEqualThoseOfTheVerifierCompile) {
  const test_support::SearchCase c = test_support::make_case("deepseek-v2-lite", "h800", 2, 64, 1024);
  const TrainSpec& train = c.train;
  SearchOptions o;
  o.top_k = 8;
  o.verify = false;
  auto r = search(c.model, c.cluster, train, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_GE(r->top.size(), 4u);
  // Peaks without a limit, then a limit between the smallest and the largest so that both verdicts occur.
  std::vector<double> peaks;
  for (const Plan& p : r->top) {
    TrainSpec t = train;
    t.micro_batch_size = p.strategy.mbs;
    const Verification v = verify_strategy(c.model, t, p.strategy, 0);
    ASSERT_TRUE(v.ok) << p.strategy.to_string() << ": " << v.message;
    peaks.push_back(v.compiled_peak_bytes);
  }
  const auto [lo, hi] = std::minmax_element(peaks.begin(), peaks.end());
  ASSERT_LT(*lo, *hi) << "the candidates need distinct peaks for this test";
  const double capacity = (*lo + *hi) / 2;
  int accepted = 0, rejected = 0;
  for (const Plan& p : r->top) {
    TrainSpec t = train;
    t.micro_batch_size = p.strategy.mbs;
    const Verification old_path = verify_strategy(c.model, t, p.strategy, capacity);
    std::shared_ptr<compile::CompileResult> compiled;
    const Verification new_path =
        verify_strategy_for_simulation(c.model, c.cluster, t, p.strategy, o.calibration, capacity, &compiled);
    EXPECT_EQ(new_path.ok, old_path.ok) << p.strategy.to_string();
    EXPECT_EQ(new_path.message, old_path.message) << p.strategy.to_string();
    EXPECT_EQ(new_path.compiled_peak_bytes, old_path.compiled_peak_bytes) << p.strategy.to_string();
    EXPECT_EQ(compiled != nullptr, new_path.ok) << p.strategy.to_string();
    (old_path.ok ? accepted : rejected) += 1;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

TEST(VerifyReuseTest, SearchReturnsTheSamePlansAndSimulatedTimes) {
  const test_support::SearchCase c = test_support::make_case("tiny-moe", "local-cpu", 1, 8, 128);
  SearchOptions o;
  o.top_k = 3;
  o.simulate_top = 3;
  o.local_search_steps = 2;
  o.reuse_compiles = false;
  auto before = search(c.model, c.cluster, c.train, o);
  o.reuse_compiles = true;
  auto after = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(before.ok() && after.ok());
  ASSERT_EQ(after->top.size(), before->top.size());
  for (size_t i = 0; i < before->top.size(); ++i) {
    const Plan& a = after->top[i];
    const Plan& b = before->top[i];
    EXPECT_EQ(a.strategy.to_string(), b.strategy.to_string());
    EXPECT_EQ(a.verified, b.verified);
    EXPECT_EQ(a.simulated, b.simulated);
    EXPECT_EQ(a.sim_step_time_s, b.sim_step_time_s) << a.strategy.to_string();
    EXPECT_EQ(a.compiled, nullptr);  // released once simulated
  }
  EXPECT_EQ(after->stats.verified, before->stats.verified);
  EXPECT_EQ(after->stats.simulated, before->stats.simulated);
}

}  // namespace
}  // namespace piper::planner
