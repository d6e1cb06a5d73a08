// SimOptions::sync_cost (measured by `piper calibrate --ranks R`): every collective of more than one rank completes
// its measured excess later than its flows would, all-to-alls and other collectives apart; zero changes nothing;
// simulate_compiled takes it from the cluster's node only when the node shares its cores.
#include <gtest/gtest.h>

#include "piper/sim/plan_exec.h"
#include "piper/sim/simulate.h"
#include "test_clusters.h"

namespace piper::sim {
namespace {

using compile::Instruction;
using compile::OpKind;

Instruction compute() {
  Instruction in;
  in.op = OpKind::kCompute;
  in.label = "c";
  in.part = Part::kAttention;
  in.pass = ir::Pass::kF;
  return in;
}

Instruction collective(ir::NodeKind kind) {
  Instruction in;
  in.op = OpKind::kCollective;
  in.comm = kind;
  in.label = "coll";
  in.group = "dp";
  in.comm_bytes = 1000;
  return in;
}

// dp = 2 ranks, one stream: compute 1 s, the collective, compute 1 s.
compile::Plan plan_with(ir::NodeKind kind) {
  compile::Plan plan;
  plan.mesh.dp = 2;
  plan.world_size = 2;
  compile::Program prog;
  compile::Stream s;
  s.name = "main";
  s.instrs = {compute(), collective(kind), compute()};
  prog.streams.push_back(s);
  plan.templates.push_back(prog);
  for (int rank = 0; rank < 2; ++rank) {
    compile::RankCoord c;
    c.dp = rank;
    plan.coords.push_back(c);
    plan.rank_template.push_back(0);
  }
  return plan;
}

TaskTimeFn one_second() {
  return [](const compile::Program&, const Instruction& in) { return in.op == OpKind::kCompute ? 1.0 : 0.0; };
}

double step_s(ir::NodeKind kind, SyncCost cost) {
  // 1 GB/s, no latency: the 1,000-byte collective's flows take microseconds.
  Network net = Network::build(testing::make_cluster(1, 2, 1e9, 0, 0)).value();
  SimOptions o;
  o.full = true;
  o.sync_cost = cost;
  auto r = simulate_plan(plan_with(kind), net, one_second(), o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->step_time_s : 0;
}

TEST(SyncCost, EachCollectiveCompletesItsMeasuredExcessLater) {
  const double base = step_s(ir::NodeKind::kAllReduce, {});
  EXPECT_NEAR(base, 2.0, 1e-3);
  EXPECT_NEAR(step_s(ir::NodeKind::kAllReduce, {0.5, 0.25}) - base, 0.25, 1e-9);  // other_s
  const double a2a = step_s(ir::NodeKind::kAllToAll, {});
  EXPECT_NEAR(step_s(ir::NodeKind::kAllToAll, {0.5, 0.25}) - a2a, 0.5, 1e-9);  // all_to_all_s
  EXPECT_EQ(step_s(ir::NodeKind::kAllReduce, {0, 0}), base);
  EXPECT_NEAR(step_s(ir::NodeKind::kAllToAll, {0.5, 0.25, 0.125}) - a2a, 0.125, 1e-9);  // two ranks: pair_s
}

TEST(SyncCost, TakenFromTheNodeOnlyWhenItSharesCores) {
  ClusterSpec c = testing::make_cluster(1, 4, 1e9, 0, 0);
  c.node.sync_excess_all_to_all_s = 2e-3;
  c.node.sync_excess_other_s = 1e-3;
  EXPECT_EQ(sync_cost_of(c).all_to_all_s, 0);  // a GPU node: its ranks do not share cores
  c.node.shared_cores = 2;
  EXPECT_EQ(sync_cost_of(c).all_to_all_s, 2e-3);
  EXPECT_EQ(sync_cost_of(c).other_s, 1e-3);
  EXPECT_EQ(sync_cost_of(c).pair_s, 0);
  c.node.sync_excess_other_s = -1;
  EXPECT_FALSE(c.validate().ok());
}

}  // namespace
}  // namespace piper::sim
