// reprice_for_simulation: where the compiler keeps whole experts whatever etp says (compile::lowered_etp: only
// disaggregated attention/FFN, where Strategy::validate refuses etp > 1 since session 22), the compile of a
// strategy's etp variant, re-priced, would be the strategy's own compile; every plan the compiler accepts with
// etp > 1 slices the experts, and re-pricing an etp variant of it is refused. (Until session 22 the compiler kept
// whole experts with ep = 1, and AnEtpVariantRepricedEqualsItsOwnCompile checked the re-priced plans there.)
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

// Without disaggregation the compiler slices the experts over etp, with ep > 1 or ep = 1: an etp variant's compile
// is another plan (the etp exchanges, sliced expert weights), and re-pricing it is refused by name.
TEST(RepriceTest, AnEtpVariantOfASlicedPlanIsRefused) {
  const Case c = load("deepseek-v2-lite", "h800", 2);
  for (const std::string base : {"dp=4,tp=2,pp=2,ep=1,sp=1,zero=1,schedule=1f1b,microbatches=4,mbs=1",
                                 "dp=4,tp=2,pp=2,ep=4,sp=1,zero=1,schedule=dualpipev,microbatches=8,mbs=1"}) {
    auto one = Strategy::parse(base + ",etp=1");
    auto two = Strategy::parse(base + ",etp=2");
    ASSERT_TRUE(one.ok() && two.ok()) << base;
    const compile::CompileResult own_one = compiled(c, *one);
    const compile::CompileResult own_two = compiled(c, *two);
    EXPECT_EQ(own_two.plan.mesh.etp, 2) << base;
    TrainSpec t = c.train;
    t.global_batch = one->global_batch();
    compile::CompileResult from_one = compiled(c, *one);
    const Status st = reprice_for_simulation(&from_one, c.model, c.cluster, t, *two, cost::Calibration{});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << base;
    EXPECT_NE(st.message().find("needs another plan"), std::string::npos) << st.to_string();
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
