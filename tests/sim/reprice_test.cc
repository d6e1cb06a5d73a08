// reprice_for_simulation: without expert parallelism, the compile of a strategy's etp variant, re-priced for the
// strategy, is the strategy's own compile (the planner's re-scoring simulates an etp variant from it instead of
// compiling it again).
#include <gtest/gtest.h>

#include <string>

#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::sim {
namespace {

struct Case {
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
};

Case load(const std::string& model, const std::string& cluster, int nodes) {
  auto m = load_model(model);
  auto c = load_cluster(cluster, nodes);
  EXPECT_TRUE(m.ok() && c.ok());
  TrainSpec t;
  t.seq_len = 1024;
  return {*m, *c, t};
}

compile::CompileResult compiled(const Case& c, const Strategy& s) {
  TrainSpec t = c.train;
  t.micro_batch_size = s.mbs;
  t.global_batch = s.global_batch();
  auto r = compile_for_simulation(c.model, c.cluster, t, s, cost::Calibration{}, SimOptions{}, 0);
  EXPECT_TRUE(r.ok()) << s.to_string() << ": " << r.status().message();
  return r.ok() ? std::move(r).value() : compile::CompileResult{};
}

// For every strategy without expert parallelism (DeepSeek-V2-Lite, several schedules, tp_overlap pieces,
// recomputation; with ep > 1 the compiler slices the experts over etp and the plans differ in more than prices, so
// the planner shares no compile there: rescore_test): compile etp=1, re-price for etp=2 and the other way round;
// each must equal the direct compile, and the two direct compiles must differ (else the test would not see a
// missing re-pricing).
TEST(RepriceTest, AnEtpVariantRepricedEqualsItsOwnCompile) {
  const Case c = load("deepseek-v2-lite", "h800", 2);
  for (const std::string base : {"dp=4,tp=2,pp=2,ep=1,sp=1,zero=1,schedule=1f1b,microbatches=4,mbs=1",
                                 "dp=4,tp=2,pp=2,ep=1,sp=1,zero=1,schedule=dualpipev,microbatches=8,mbs=1,"
                                 "recompute=selective",
                                 "dp=2,tp=2,pp=4,ep=1,sp=1,zero=2,schedule=zb-h1,microbatches=8,mbs=2,tp_overlap=1"}) {
    auto one = Strategy::parse(base + ",etp=1");
    auto two = Strategy::parse(base + ",etp=2");
    ASSERT_TRUE(one.ok() && two.ok()) << base << ": " << (one.ok() ? two.status() : one.status()).message();
    const compile::CompileResult own_one = compiled(c, *one);
    const compile::CompileResult own_two = compiled(c, *two);
    ASSERT_FALSE(own_one.plan.templates.empty()) << base;
    EXPECT_FALSE(own_one.plan == own_two.plan) << base << ": etp does not change the prices; the test sees nothing";
    TrainSpec t = c.train;
    t.global_batch = one->global_batch();
    compile::CompileResult from_one = compiled(c, *one);
    ASSERT_TRUE(reprice_for_simulation(&from_one, c.model, c.cluster, t, *two, cost::Calibration{}).ok());
    EXPECT_TRUE(from_one.plan == own_two.plan) << base;
    EXPECT_EQ(from_one.stats.peak_bytes, own_two.stats.peak_bytes) << base;
    compile::CompileResult from_two = compiled(c, *two);
    ASSERT_TRUE(reprice_for_simulation(&from_two, c.model, c.cluster, t, *one, cost::Calibration{}).ok());
    EXPECT_TRUE(from_two.plan == own_one.plan) << base;
    // And the simulator gives the same step time from either.
    auto direct = simulate_compiled(own_two, c.model, c.cluster, t, *two);
    auto reused = simulate_compiled(std::move(from_one), c.model, c.cluster, t, *two);
    ASSERT_TRUE(direct.ok() && reused.ok()) << base;
    EXPECT_EQ(direct->step_time_s, reused->step_time_s) << base;
  }
}

// SimOptions::data_edges = false (the planner's compiles): the same step time as the compile with data edges.
TEST(RepriceTest, CompilesWithoutDataEdgesSimulateToTheSameStepTime) {
  const Case c = load("deepseek-v2-lite", "h800", 2);
  for (const std::string text : {"dp=4,tp=2,pp=2,ep=4,etp=2,sp=1,zero=1,schedule=dualpipev,microbatches=8,a2a=halo",
                                 "dp=2,tp=2,pp=4,ep=2,sp=1,zero=2,schedule=zb-h1,microbatches=8,mbs=2,tp_overlap=1"}) {
    auto s = Strategy::parse(text);
    ASSERT_TRUE(s.ok()) << text;
    TrainSpec t = c.train;
    t.global_batch = s->global_batch();
    SimOptions lean;
    lean.data_edges = false;
    auto with = simulate(c.model, c.cluster, t, *s, cost::Calibration{}, SimOptions{});
    auto without = simulate(c.model, c.cluster, t, *s, cost::Calibration{}, lean);
    ASSERT_TRUE(with.ok() && without.ok()) << text;
    EXPECT_EQ(with->step_time_s, without->step_time_s) << text;
    EXPECT_EQ(with->peak_memory_max_bytes, without->peak_memory_max_bytes) << text;
  }
}

}  // namespace
}  // namespace piper::sim
