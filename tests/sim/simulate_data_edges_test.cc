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

// SimOptions::data_edges = false (the planner's compiles): the same step time as the compile with data edges.
TEST(SimulateDataEdgesTest, CompilesWithoutDataEdgesSimulateToTheSameStepTime) {
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
