// SimOptions::sync_cost (measured by `piper calibrate --ranks R`): every collective of more than one rank completes
// its measured excess later than its flows would, all-to-alls and other collectives apart; zero changes nothing;
// simulate_compiled takes it from the cluster's node only when the node shares its cores. The CPU a transfer takes
// from its node (SyncCost::cpu_*) slows the node's tasks through the core pool when its cores are full.
#include <gtest/gtest.h>

#include <tuple>
#include <utility>

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

// Measured across nodes, the world's figures carry the transport between them: a collective whose ranks all lie on
// one node takes the figures measured inside a node (node_*_s), one that spans nodes the world's.
TEST(SyncCost, ACollectiveInsideOneNodeTakesTheNodesFigures) {
  const double base = step_s(ir::NodeKind::kAllReduce, {});
  const double a2a = step_s(ir::NodeKind::kAllToAll, {});
  SyncCost c{0.5, 0.25};
  c.node_all_to_all_s = 0.0625;
  c.node_other_s = 0.03125;
  c.ranks_per_node = 2;  // both ranks on node 0, but no figures measured inside a node: the world's
  EXPECT_NEAR(step_s(ir::NodeKind::kAllReduce, c) - base, 0.25, 1e-9);
  c.node_figures = true;
  EXPECT_NEAR(step_s(ir::NodeKind::kAllReduce, c) - base, 0.03125, 1e-9);
  EXPECT_NEAR(step_s(ir::NodeKind::kAllToAll, c) - a2a, 0.0625, 1e-9);
  c.ranks_per_node = 1;  // one rank a node: the collective spans two nodes
  EXPECT_NEAR(step_s(ir::NodeKind::kAllReduce, c) - base, 0.25, 1e-9);
  EXPECT_NEAR(step_s(ir::NodeKind::kAllToAll, c) - a2a, 0.5, 1e-9);
  c.ranks_per_node = 2;  // measured inside a node as 0: taken
  c.node_other_s = 0;
  EXPECT_EQ(step_s(ir::NodeKind::kAllReduce, c), base);
  // The pair figure (the calibration's pairs lie inside a node): a pair inside one node, not one across nodes.
  c.pair_s = 0.125;
  EXPECT_NEAR(step_s(ir::NodeKind::kAllReduce, c) - base, 0.125, 1e-9);
  c.ranks_per_node = 1;
  EXPECT_NEAR(step_s(ir::NodeKind::kAllReduce, c) - base, 0.25, 1e-9);
  c.node_figures = false;  // without figures inside a node every pair takes it, as before
  EXPECT_NEAR(step_s(ir::NodeKind::kAllReduce, c) - base, 0.125, 1e-9);
}

// SyncCost::exchange_lag: the last rank to arrive at an all-to-all completes it the lag later than the others, the lag
// read at the other ranks' mean compute task (1 s here: between the points at 0.5 s and 2 s, 0.25 + 0.75 / 3). Both
// ranks arrive at 1 s; the later in the event order (rank 1) is the last. Other collectives take none.
TEST(SyncCost, TheLastRankToArriveAtAnAllToAllLeavesItTheLagLater) {
  SyncCost c;
  c.exchange_lag = {{0.5, 0.25}, {2.0, 1.0}};
  EXPECT_DOUBLE_EQ(c.exchange_lag_at(0.1), 0.25);  // below the first point: the first point's
  EXPECT_DOUBLE_EQ(c.exchange_lag_at(1.0), 0.5);
  EXPECT_DOUBLE_EQ(c.exchange_lag_at(3.0), 1.0);  // beyond the last: the last point's
  EXPECT_EQ(SyncCost{}.exchange_lag_at(1.0), 0);
  const double a2a = step_s(ir::NodeKind::kAllToAll, {});
  EXPECT_NEAR(step_s(ir::NodeKind::kAllToAll, c) - a2a, 0.5, 1e-9);
  EXPECT_EQ(step_s(ir::NodeKind::kAllReduce, c), step_s(ir::NodeKind::kAllReduce, {}));
  Network net = Network::build(testing::make_cluster(1, 2, 1e9, 0, 0)).value();
  SimOptions o;
  o.full = true;
  o.sync_cost = c;
  auto r = simulate_plan(plan_with(ir::NodeKind::kAllToAll), net, one_second(), o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->ranks.size(), 2u);
  EXPECT_NEAR(r->ranks[1].finish_s - r->ranks[0].finish_s, 0.5, 1e-9);  // rank 0 left first
  // The lag is the late rank's communication (its engine idle while its exchange goes on), not a bubble.
  EXPECT_NEAR(r->ranks[1].exposed_comm_s - r->ranks[0].exposed_comm_s, 0.5, 1e-9);
  EXPECT_NEAR(r->ranks[1].bubble_s, 0, 1e-9);
}

// dp = 2 ranks on one node of 2 cores (one per rank): a compute stream (1 s, 1 s) and a communication stream whose
// collective starts at t = 0, while both ranks compute: the node's cores are full.
compile::Plan beside_compute() {
  compile::Plan plan = plan_with(ir::NodeKind::kAllReduce);
  compile::Program& prog = plan.templates[0];
  prog.streams[0].instrs = {compute(), compute()};
  compile::Stream comm;
  comm.name = "comm";
  comm.instrs = {collective(ir::NodeKind::kAllReduce)};
  prog.streams.push_back(comm);
  return plan;
}

// pp = 2: each rank computes 1 s, 1 s on its compute stream while a send (rank 0) and its recv (rank 1) start at t = 0.
compile::Plan p2p_beside_compute() {
  compile::Plan plan;
  plan.mesh.pp = 2;
  plan.world_size = 2;
  for (int rank = 0; rank < 2; ++rank) {
    compile::Program prog;
    compile::Stream main;
    main.name = "main";
    main.instrs = {compute(), compute()};
    compile::Stream comm;
    comm.name = "comm";
    Instruction x;
    x.op = rank == 0 ? OpKind::kSend : OpKind::kRecv;
    x.label = "x";
    x.peer = 1 - rank;
    x.tag = 7;
    x.comm_bytes = 1000;
    comm.instrs = {x};
    prog.streams = {main, comm};
    plan.templates.push_back(prog);
    compile::RankCoord c;
    c.pp = rank;
    plan.coords.push_back(c);
    plan.rank_template.push_back(rank);
  }
  return plan;
}

// The step, and when the communication stream's first instruction ended on rank 0.
std::pair<double, double> pooled_run(const compile::Plan& plan, SyncCost cost, double cores) {
  Network net = Network::build(testing::make_cluster(1, 2, 1e9, 0, 0)).value();
  SimOptions o;
  o.full = true;
  o.record_timeline = true;
  o.sync_cost = cost;
  o.core_pool.cores = cores;  // 0: off
  o.core_pool.rank_cores = 1;
  o.core_pool.price_cores = 1;
  o.core_pool.ranks_per_node = 2;
  auto r = simulate_plan(plan, net, one_second(), o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {0, 0};
  double comm_end = -1;
  for (const auto& span : r->ranks[0].spans) {
    if (span.stream == 1 && span.instr == 0) comm_end = span.end_s;
  }
  return {r->step_time_s, comm_end};
}

TEST(SyncCost, CommunicationsCpuSlowsTheComputeOfAFullNode) {
  SyncCost cost;
  cost.cpu_other_s = 1.0;  // each member's collective takes 1 s of one core
  // Both ranks compute 1 s + 1 s beside their collective on 2 cores: 4 tasks share them until the collectives' CPU
  // is spent (t = 2: each first compute has had 1 s), then the second computes run alone: 3 s.
  EXPECT_NEAR(pooled_run(beside_compute(), cost, 2).first, 3.0, 1e-9);
  EXPECT_NEAR(pooled_run(beside_compute(), {}, 2).first, 2.0, 1e-9);
  // On 4 cores the collectives' CPU finds free cores: nothing changes.
  EXPECT_NEAR(pooled_run(beside_compute(), cost, 4).first, 2.0, 1e-9);
  // A point-to-point transfer's CPU, on each side.
  SyncCost p2p;
  p2p.cpu_p2p_s = 1.0;
  EXPECT_NEAR(pooled_run(p2p_beside_compute(), p2p, 2).first, 3.0, 1e-9);
}

// The CPU a collective takes from the node's cores: inside one node the figure measured there, across nodes the
// world's.
TEST(SyncCost, TheCpuOfACollectiveInsideOneNodeIsTheNodes) {
  SyncCost world;
  world.cpu_other_s = 0.5;
  SyncCost node = world;
  node.node_figures = true;
  node.cpu_node_other_s = 0.125;
  node.ranks_per_node = 2;
  const double world_step = pooled_run(beside_compute(), world, 2).first;
  const double node_step = pooled_run(beside_compute(), node, 2).first;
  const double free_step = pooled_run(beside_compute(), SyncCost{}, 2).first;
  // Each rank's share of the node's 2 cores pays the transfer's CPU: the step grows by it.
  EXPECT_NEAR(world_step - free_step, 0.5, 1e-6);
  EXPECT_NEAR(node_step - free_step, 0.125, 1e-6);
  node.ranks_per_node = 1;  // the two ranks on two nodes
  EXPECT_NEAR(pooled_run(beside_compute(), node, 2).first - free_step, 0.5, 1e-6);
}

// Each stream's CPU (RankStats::cpu_s_by_stream): its compute tasks' core-seconds, and the transfers' CPU on the
// stream that ran them, whether the cores were full (2) or not (4).

TEST(SyncCost, EachStreamIsChargedItsTasksAndItsTransfersCpu) {
  SyncCost cost;
  cost.cpu_other_s = 1.0;
  for (double cores : {2.0, 4.0}) {
    Network net = Network::build(testing::make_cluster(1, 2, 1e9, 0, 0)).value();
    SimOptions o;
    o.full = true;
    o.sync_cost = cost;
    o.core_pool = {cores, 1, 1, 2, {}};
    auto r = simulate_plan(beside_compute(), net, one_second(), o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (const RankStats& k : r->ranks) {
      ASSERT_EQ(k.cpu_s_by_stream.size(), 2u);
      EXPECT_NEAR(k.cpu_s_by_stream[0], 2.0, 1e-9) << "cores " << cores << " rank " << k.rank;  // two 1 s tasks
      EXPECT_NEAR(k.cpu_s_by_stream[1], 1.0, 1e-9) << "cores " << cores << " rank " << k.rank;  // its collective
    }
  }
}

// SyncCost::a2a_wait_cpu_share: each member of an all-to-all burns that share of its wait (arrival to completion) on
// its node's cores. Both ranks post the all-to-all at t = 0 beside their compute (1 s + 1 s on 2 cores, the pool full)
// on a link slow enough that it takes a while; at its completion each adds share x wait of pool work, which the step
// pays in full (the cores stay full). Not for an all-reduce, and nothing without the pool.
TEST(SyncCost, AnAllToAllsWaitBurnsItsShareOfTheNodesCores) {
  compile::Plan plan = beside_compute();
  plan.templates[0].streams[1].instrs[0].comm = ir::NodeKind::kAllToAll;
  auto run = [&](const compile::Plan& p, double share, double cores) -> std::pair<double, double> {
    Network net = Network::build(testing::make_cluster(1, 2, 2e3, 0, 0)).value();  // 2 KB/s: 1,000 bytes, ~0.25 s
    SimOptions o;
    o.full = true;
    o.record_timeline = true;
    o.sync_cost.a2a_wait_cpu_share = share;
    o.core_pool = {cores, 1, 1, 2, {}};
    auto r = simulate_plan(p, net, one_second(), o);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (!r.ok()) return {0, 0};
    double end = 0;
    for (const auto& span : r->ranks[0].spans) end = span.stream == 1 ? span.end_s : end;
    return {r->step_time_s, end};
  };
  const auto [free_step, waited] = run(plan, 0, 2);
  ASSERT_GT(waited, 0.1);
  ASSERT_LT(waited, 1.0);  // completes while both ranks still compute
  EXPECT_NEAR(run(plan, 0.5, 2).first - free_step, 0.5 * waited, 1e-6);
  EXPECT_NEAR(run(beside_compute(), 0.5, 2).first, run(beside_compute(), 0, 2).first, 1e-12);  // an all-reduce
  EXPECT_NEAR(run(plan, 0.5, 0).first, run(plan, 0, 0).first, 1e-12);                          // no pool
}

// SyncCost::cpu_per_byte_s: the bytes of a transfer's flows, shared by its members, are copied by the node's cores.
// A 2-rank ring all-reduce moves 2(p - 1)/p = 1 payload per rank, 2,000 bytes in all; a point-to-point transfer
// its payload, 1,000 bytes, half on each side.
TEST(SyncCost, CopiesOfATransfersBytesTakeTheNodesCores) {
  SyncCost copy;
  copy.cpu_per_byte_s = 1e-3;  // 1,000 bytes a rank: 1 s of one core, as cpu_other_s = 1 above
  EXPECT_NEAR(pooled_run(beside_compute(), copy, 2).first, 3.0, 1e-9);
  EXPECT_NEAR(pooled_run(beside_compute(), copy, 4).first, 2.0, 1e-9);  // free cores: nothing changes
  // 0.5 s on each side: four tasks on two cores until t = 1 (the copies done, each compute half done), then the
  // computes alone: 1.5 + 1 s.
  EXPECT_NEAR(pooled_run(p2p_beside_compute(), copy, 2).first, 2.5, 1e-9);
  // Added to a per-call figure.
  copy.cpu_other_s = 1.0;
  EXPECT_NEAR(pooled_run(beside_compute(), copy, 2).first, 4.0, 1e-9);
}

// Bytes gathered and exchanged cost the cores their own figure (SyncCost::per_byte_s, cost::CopyKind): a 2-rank
// all-gather of 1,000 bytes moves 500 a rank, a point-to-point transfer 500 a side; unset, the summed figure.
TEST(SyncCost, GatheredAndExchangedBytesTakeTheirOwnFigure) {
  SyncCost copy;
  copy.cpu_per_byte_s = 1e-3;
  compile::Plan gather = beside_compute();
  gather.templates[0].streams[1].instrs[0].comm = ir::NodeKind::kAllGather;
  EXPECT_NEAR(pooled_run(gather, copy, 2).first, 2.5, 1e-9);  // 0.5 s a rank at the summed figure
  EXPECT_NEAR(pooled_run(p2p_beside_compute(), copy, 2).first, 2.5, 1e-9);
  copy.gather_cpu_per_byte_s = 0.5e-3;
  copy.exchange_cpu_per_byte_s = 0.25e-3;
  EXPECT_NEAR(pooled_run(gather, copy, 2).first, 2.25, 1e-9);
  EXPECT_NEAR(pooled_run(p2p_beside_compute(), copy, 2).first, 2.125, 1e-9);
  EXPECT_NEAR(pooled_run(beside_compute(), copy, 2).first, 3.0, 1e-9);  // an all-reduce: still the summed figure

  ClusterSpec c = testing::make_cluster(1, 4, 1e9, 0, 0);
  c.node.shared_cores = 2;
  c.node.copy_cpu_s_per_byte = 0.6e-9;
  c.node.gather_copy_cpu_s_per_byte = 0.4e-9;
  EXPECT_DOUBLE_EQ(sync_cost_of(c).per_byte_s(cost::CopyKind::kGathered), 0.4e-9);
  EXPECT_DOUBLE_EQ(sync_cost_of(c).per_byte_s(cost::CopyKind::kExchanged), 0.6e-9);  // unmeasured: the summed one
}

// SyncCost::staging_s_per_byte: each member of a data-parallel collective adds the copies the runtime stages it with
// (cost::dp_staged_bytes of its 1,000 bytes over 2 ranks) to the pool; a collective of any other role none. Both
// ranks compute 2 s on 2 cores beside it: the step is (4 core-s + both ranks' staging) / 2 cores.
TEST(SyncCost, DataParallelCollectivesTakeTheirStagingCopiesFromTheCores) {
  SyncCost cost;
  cost.staging_s_per_byte = 0.25e-3;  // 4,000 bytes: 1 s of one core
  auto step = [&](compile::CommRole role, ir::NodeKind kind, int mb, ir::Pass pass) {
    compile::Plan plan = beside_compute();
    Instruction& c = plan.templates[0].streams[1].instrs[0];
    c.role = role;
    c.comm = kind;
    c.mb = mb;
    c.pass = pass;
    return pooled_run(plan, cost, 2).first;
  };
  using compile::CommRole;
  using ir::NodeKind;
  EXPECT_NEAR(step(CommRole::kNone, NodeKind::kAllReduce, -1, ir::Pass::kBW), 2.0, 1e-9);
  EXPECT_NEAR(step(CommRole::kGradReduce, NodeKind::kAllReduce, -1, ir::Pass::kBW), 3.0, 1e-9);  // 4 N
  // 2 N + 2 N/2 = 3,000 bytes: 0.75 s each
  EXPECT_NEAR(step(CommRole::kGradReduce, NodeKind::kReduceScatter, -1, ir::Pass::kBW), 2.75, 1e-9);
  // per microbatch, added to the accumulated shard: 2 N + 3 N/2
  EXPECT_NEAR(step(CommRole::kGradReduce, NodeKind::kReduceScatter, 0, ir::Pass::kBW), 2.875, 1e-9);
  EXPECT_NEAR(step(CommRole::kParamGather, NodeKind::kAllGather, -1, ir::Pass::kU), 2.75, 1e-9);  // 2 N/2 + 2 N
  EXPECT_NEAR(step(CommRole::kParamGather, NodeKind::kAllGather, 0, ir::Pass::kF), 3.0, 1e-9);    // 2 N/2 + 3 N
  EXPECT_NEAR(step(CommRole::kTpReduce, NodeKind::kAllReduce, 0, ir::Pass::kF), 2.0, 1e-9);
}

// The staging rate: one thread's measured copy rate, else its measured streaming bandwidth, else the device's over
// the rank's cores; only where the node shares its cores.
TEST(SyncCost, StagingRateFromTheOneThreadStreamingBandwidth) {
  ClusterSpec c = testing::make_cluster(1, 4, 1e9, 0, 0);
  c.device.memory_bw_bytes_per_s = 8e9;
  c.node.device_cores = 2;
  cost::Calibration cal;
  cal.memory_bw_efficiency = 0.5;
  EXPECT_EQ(sync_cost_of(c, cal).staging_s_per_byte, 0);
  c.node.shared_cores = 2;
  EXPECT_DOUBLE_EQ(sync_cost_of(c, cal).staging_s_per_byte, 1 / 2e9);  // 8 GB/s x 0.5 over 2 cores
  cal.thread_figures = {{1, 1e9, 1, 5e9, 0}, {2, 2e9, 1, 9e9, 0}};
  EXPECT_DOUBLE_EQ(sync_cost_of(c, cal).staging_s_per_byte, 1 / 5e9);
  cal.copy_bw_bytes_per_s = 1.6e10;  // the measured copy rate first
  EXPECT_DOUBLE_EQ(sync_cost_of(c, cal).staging_s_per_byte, 1 / 1.6e10);
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
  c.node.busy_cpu_pair_s = 4e-4;
  EXPECT_EQ(sync_cost_of(c).cpu_pair_s, 4e-4);
  c.node.intra.bw_bytes_per_s = 2e9;  // the node's copy rate: one core-second per 2 GB
  EXPECT_DOUBLE_EQ(sync_cost_of(c).cpu_per_byte_s, 0.5e-9);
  c.node.shared_cores = 0;
  EXPECT_EQ(sync_cost_of(c).cpu_per_byte_s, 0);
  c.node.shared_cores = 2;
  c.node.busy_cpu_all_to_all_s = -1;
  EXPECT_FALSE(c.validate().ok());
  c.node.busy_cpu_all_to_all_s = 0;
  c.node.sync_excess_other_s = -1;
  EXPECT_FALSE(c.validate().ok());
}

}  // namespace
}  // namespace piper::sim
