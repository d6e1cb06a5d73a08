// SimOptions::core_pool: CPU ranks sharing their node's cores (processor sharing), hand-computed on small plans;
// a pipeline on a shared core is as long as its total work; the pool changes nothing where it cannot bind; and on
// a machine like the build machine (4 ranks on 2 cores) a pipeline is predicted faster than at the static share
// while pure data parallelism (all ranks always computing together) is not.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "piper/base/check.h"
#include "piper/compile/compile.h"
#include "piper/sim/plan_exec.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "test_clusters.h"

namespace piper::sim {
namespace {

using compile::Instruction;
using compile::OpKind;

Instruction compute(const std::string& label) {
  Instruction in;
  in.op = OpKind::kCompute;
  in.label = label;
  in.part = Part::kAttention;
  in.pass = ir::Pass::kF;
  return in;
}

Instruction p2p(OpKind op, int peer, int64_t bytes) {
  Instruction in;
  in.op = op;
  in.label = op == OpKind::kSend ? "send" : "recv";
  in.role = compile::CommRole::kPipeline;
  in.peer = peer;
  in.tag = 7;
  in.comm_bytes = bytes;
  return in;
}

// A plan of `pp` pipeline ranks by `dp` data-parallel ranks (tp = 1) with the given streams per pipeline rank.
compile::Plan plan_of(int pp, int dp, std::vector<std::vector<compile::Stream>> streams) {
  compile::Plan plan;
  plan.mesh.pp = pp;
  plan.mesh.dp = dp;
  plan.world_size = pp * dp;
  for (int p = 0; p < pp; ++p) {
    compile::Program prog;
    prog.pp_rank = p;
    prog.streams = std::move(streams[static_cast<size_t>(p)]);
    plan.templates.push_back(std::move(prog));
  }
  for (int rank = 0; rank < plan.world_size; ++rank) {
    compile::RankCoord c;
    c.pp = rank / dp;
    c.dp = rank % dp;
    plan.coords.push_back(c);
    plan.rank_template.push_back(c.pp);
  }
  return plan;
}

// Every compute instruction costs `seconds`.
TaskTimeFn constant(double seconds) {
  return
      [seconds](const compile::Program&, const Instruction& in) { return in.op == OpKind::kCompute ? seconds : 0.0; };
}

SimOptions pooled(double cores, double rank_cores, double price_cores, int ranks_per_node) {
  SimOptions o;
  o.full = true;
  o.record_timeline = true;
  o.core_pool = {cores, rank_cores, price_cores, ranks_per_node, {}};
  return o;
}

// Two ranks on one core, a 1 s task each, both at t = 0: each runs on half the core, both end at 2 s. Priced at
// the static share instead (0.5 core: 2 s), the same.
TEST(CorePoolTest, TwoRanksOnOneCoreTakeTwiceAsLong) {
  compile::Plan plan = plan_of(1, 2, {{{"compute", {compute("a")}}}});
  Network net = Network::build(testing::make_cluster(1, 2, 1e3, 0, 0)).value();
  for (auto [price_cores, price_s] : {std::pair{1.0, 1.0}, std::pair{0.5, 2.0}}) {
    auto r = simulate_plan(plan, net, constant(price_s), pooled(1, 1, price_cores, 2));
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->step_time_s, 2.0);
    ASSERT_EQ(r->ranks.size(), 2u);
    for (const RankStats& k : r->ranks) {
      EXPECT_EQ(k.finish_s, 2.0) << "rank " << k.rank;
      EXPECT_EQ(k.busy_s, 2.0) << "rank " << k.rank;
      // Its CPU: half the core for 2 s, one core-second (RankStats::cpu_s_by_stream), at either price.
      ASSERT_EQ(k.cpu_s_by_stream.size(), 1u);
      EXPECT_DOUBLE_EQ(k.cpu_s_by_stream[0], 1.0) << "rank " << k.rank;
    }
  }
  // Two cores: each rank has its own, 1 s.
  auto r = simulate_plan(plan, net, constant(1.0), pooled(2, 1, 1, 2));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step_time_s, 1.0);
}

// Rank 1 starts its 1 s task at 0.5 s (it first receives 500 B over a 1,000 B/s link). Rank 0 runs alone until
// 0.5 s (half its work done), then both at half speed: rank 0's other half takes 1 s and ends at 1.5 s, by when
// rank 1 has done 0.5 s of work; alone again, rank 1 ends its remaining 0.5 s at 2.0 s.
TEST(CorePoolTest, StaggeredStartsShareTheCoreWhileBothCompute) {
  compile::Plan plan = plan_of(2, 1,
                               {{{"compute", {compute("a")}}, {"comm", {p2p(OpKind::kSend, 1, 500)}}},
                                {{"main", {p2p(OpKind::kRecv, 0, 500), compute("b")}}}});
  Network net = Network::build(testing::make_cluster(1, 2, 1e3, 0, 0)).value();
  auto r = simulate_plan(plan, net, constant(1.0), pooled(1, 1, 1, 2));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(r->ranks[0].finish_s, 1.5);
  EXPECT_DOUBLE_EQ(r->ranks[1].finish_s, 2.0);
  EXPECT_DOUBLE_EQ(r->step_time_s, 2.0);
  // Rank 1's task ran from 0.5 s (after its receive) to 2.0 s; its engine was busy 1.5 s.
  EXPECT_DOUBLE_EQ(r->ranks[1].busy_s, 1.5);
  EXPECT_DOUBLE_EQ(r->ranks[0].busy_s, 1.5);
  // Without the pool each task takes its 1 s: rank 0 ends at 1 s, rank 1 at 1.5 s.
  SimOptions alone;
  alone.full = true;
  auto a = simulate_plan(plan, net, constant(1.0), alone);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_DOUBLE_EQ(a->ranks[0].finish_s, 1.0);
  EXPECT_DOUBLE_EQ(a->ranks[1].finish_s, 1.5);
}

// A rank computing alone on a pool of 2 cores uses rank_cores = 2 of them when its kernels have 2 threads; with
// 1 thread it cannot use the second core.
TEST(CorePoolTest, ARankAloneUsesAtMostItsOwnCores) {
  compile::Plan plan = plan_of(1, 1, {{{"compute", {compute("a")}}}});
  Network net = Network::build(testing::make_cluster(1, 1, 1e3, 0, 0)).value();
  // Priced at 1 core (2 s of work at one core): 2 threads take 1 s, 1 thread 2 s.
  auto two = simulate_plan(plan, net, constant(2.0), pooled(2, 2, 1, 1));
  auto one = simulate_plan(plan, net, constant(2.0), pooled(2, 1, 1, 1));
  ASSERT_TRUE(two.ok() && one.ok());
  EXPECT_DOUBLE_EQ(two->step_time_s, 1.0);
  EXPECT_DOUBLE_EQ(one->step_time_s, 2.0);
}

// Measured sharing (CorePool::sharing, from `piper calibrate`'s core_sharing): with n ranks computing together each
// keeps sharing[n - 2] of its processor share. Two ranks on two cores at 0.8: a 1 s task each takes 1.25 s. Two
// ranks on one core at 0.8: 1 / (0.5 x 0.8) = 2.5 s. A rank alone is never slowed (n = 1), and all-ones sharing on
// a pool that cannot bind otherwise leaves it off, to the bit.
TEST(CorePoolTest, MeasuredSharingSlowsRanksComputingTogether) {
  compile::Plan plan = plan_of(1, 2, {{{"compute", {compute("a")}}}});
  Network net = Network::build(testing::make_cluster(1, 2, 1e3, 0, 0)).value();
  SimOptions o = pooled(2, 1, 1, 2);
  o.core_pool.sharing = {0.8};
  auto r = simulate_plan(plan, net, constant(1.0), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->step_time_s, 1.25);
  // Each held its core for 1.25 s: running together costs CPU, not only time.
  EXPECT_DOUBLE_EQ(r->ranks[0].cpu_s_by_stream[0], 1.25);
  o = pooled(1, 1, 1, 2);
  o.core_pool.sharing = {0.8, 0.7};  // n = 3 never happens with two ranks
  r = simulate_plan(plan, net, constant(1.0), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->step_time_s, 2.5);
  compile::Plan single = plan_of(1, 1, {{{"compute", {compute("a")}}}});
  Network net1 = Network::build(testing::make_cluster(1, 1, 1e3, 0, 0)).value();
  o = pooled(2, 1, 1, 1);
  o.core_pool.sharing = {0.5};
  r = simulate_plan(single, net1, constant(1.0), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step_time_s, 1.0);
  EXPECT_EQ(r->ranks[0].cpu_s_by_stream, std::vector<double>{1.0});  // a pool that cannot slow it is off: its price
  o.core_pool.cores = 0;                                             // no pool at all: no CPU to account
  r = simulate_plan(single, net1, constant(1.0), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->ranks[0].cpu_s_by_stream.empty());
  o = pooled(2, 1, 1, 2);
  o.core_pool.sharing = {1.0};
  r = simulate_plan(plan, net, constant(1.0), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step_time_s, 1.0);
}

// Staggered as in StaggeredStartsShareTheCoreWhileBothCompute (one core, rank 1 starts at 0.5 s), with sharing 0.8:
// rank 0 does 0.5 s of work alone; together each advances at 0.5 x 0.8 = 0.4 per second, so rank 0's other half
// ends 1.25 s later, at 1.75 s, when rank 1 has done 0.5; alone again, rank 1 ends its last 0.5 at 2.25 s.
TEST(CorePoolTest, SharingAppliesOnlyWhileRanksComputeTogether) {
  compile::Plan plan = plan_of(2, 1,
                               {{{"compute", {compute("a")}}, {"comm", {p2p(OpKind::kSend, 1, 500)}}},
                                {{"main", {p2p(OpKind::kRecv, 0, 500), compute("b")}}}});
  Network net = Network::build(testing::make_cluster(1, 2, 1e3, 0, 0)).value();
  SimOptions o = pooled(1, 1, 1, 2);
  o.core_pool.sharing = {0.8};
  auto r = simulate_plan(plan, net, constant(1.0), o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->ranks[0].finish_s, 1.75);
  EXPECT_DOUBLE_EQ(r->ranks[1].finish_s, 2.25);
}

ModelSpec model(const std::string& name) {
  auto m = load_model(name);
  PIPER_CHECK_OK(m.status());
  return *m;
}

Strategy strategy(const std::string& text) {
  auto s = Strategy::parse(text);
  PIPER_CHECK_OK(s.status());
  return *s;
}

// pp=2, 1F1B, 4 microbatches, unit costs, no communication time. On two cores each rank has its own: the pool
// cannot slow anyone, so it is off and the step is the unpooled one to the bit. On one core, whenever a rank
// computes the core is fully used (one rank: all of it; two: half each), and with free communication some rank
// always has a task ready, so the step is the two ranks' total work.
TEST(CorePoolTest, PipelineOnOneCoreTakesItsTotalWork) {
  ModelSpec m = model("gpt-1.7b");
  m.num_layers = 2;
  Strategy s = strategy("pp=2,schedule=1f1b,microbatches=4");
  TrainSpec t;
  t.seq_len = 128;
  t.global_batch = s.global_batch();
  auto compiled = compile::compile_strategy(m, t, s);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  Network net = Network::build(testing::make_cluster(1, 2, 1e12, 1, 1e11)).value();
  SimOptions base;
  base.full = true;
  base.zero_comm = true;
  auto alone = simulate_plan(compiled->plan, net, unit_task_time(Part::kAttention), base);
  ASSERT_TRUE(alone.ok()) << alone.status().message();
  SimOptions two = base, one = base;
  two.core_pool = {2, 1, 1, 2, {}};
  one.core_pool = {1, 1, 1, 2, {}};
  auto r2 = simulate_plan(compiled->plan, net, unit_task_time(Part::kAttention), two);
  auto r1 = simulate_plan(compiled->plan, net, unit_task_time(Part::kAttention), one);
  ASSERT_TRUE(r2.ok() && r1.ok());
  EXPECT_EQ(r2->step_time_s, alone->step_time_s);
  // Unit work per rank: 4 microbatches x (F + B + W) = 12, on both ranks 24; alone, the 1F1B makespan
  // (m + pp - 1) x 3 = 15.
  EXPECT_DOUBLE_EQ(alone->step_time_s, 15.0);
  EXPECT_NEAR(r1->step_time_s, 24.0, 1e-12);
  for (const RankStats& k : alone->ranks) EXPECT_DOUBLE_EQ(k.busy_s, 12.0);
}

// simulate_plan refuses a pool it cannot apply: representative ranks (not every rank of a node simulated) and
// values out of range.
TEST(CorePoolTest, RefusesAPoolItCannotApply) {
  compile::Plan plan = plan_of(1, 2, {{{"compute", {compute("a")}}}});
  Network net = Network::build(testing::make_cluster(1, 2, 1e3, 0, 0)).value();
  SimOptions o = pooled(1, 1, 1, 2);
  o.full = false;
  auto r = simulate_plan(plan, net, constant(1.0), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("set SimOptions::full"), std::string::npos) << r.status().message();
  r = simulate_plan(plan, net, constant(1.0), pooled(1, 2, 1, 2));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rank_cores (2"), std::string::npos) << r.status().message();
  r = simulate_plan(plan, net, constant(1.0), pooled(1, 1, 0, 2));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("price_cores > 0"), std::string::npos) << r.status().message();
  o = pooled(1, 1, 1, 2);
  o.core_pool.sharing = {0.0};
  r = simulate_plan(plan, net, constant(1.0), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("core_pool.sharing"), std::string::npos) << r.status().message();
}

// Without shared cores (every GPU cluster) nothing moved: step times pinned, to the bit, from 1c77cb4, the commit
// before the core pool (tiny-moe, h800, 512 tokens; representative and full); the tp rows re-pinned after the
// vocabulary-parallel head's cross-entropy exchange was priced (8cd7123: +12 us over the step's 4 head forwards), and
// again when the plan reduced the experts over dp x tp under sequence parallelism (issue 27: 4-rank rings instead of
// 2-rank ones, +43 us), and when the plan summed the partial gradients over tp (session 32: -11.6 us; the sums are
// small, and the inserted nodes move the updates' topological order, so the experts, whose reduction ends first,
// update first on the compute stream). A deliberate change of the cost
// model or the simulator moves them: check that it should, and pin the new values (the message prints them).
TEST(CorePoolTest, WithoutSharedCoresStepTimesAreUnchanged) {
  struct Row {
    const char* strategy;
    bool full;
    double step_time_s;
  };
  const Row rows[] = {
      {"dp=2,pp=4,schedule=1f1b,microbatches=8", false, 0x1.ccb3fbad8acd9p-13},
      {"dp=2,pp=4,schedule=1f1b,microbatches=8", true, 0x1.ccb3fbad8acd9p-13},
      {"dp=4,ep=4,pp=2,zero=1,microbatches=4", false, 0x1.6715073413875p-12},
      {"dp=4,ep=4,pp=2,zero=1,microbatches=4", true, 0x1.6715073413875p-12},
      {"dp=2,tp=2,sp=1,pp=2,schedule=interleaved,vpp=2,microbatches=4", false, 0x1.686fc10496ed8p-12},
      {"dp=2,tp=2,sp=1,pp=2,schedule=interleaved,vpp=2,microbatches=4", true, 0x1.694ba80365ab6p-12},
      {"dp=8,ep=8,a2a=halo,microbatches=2", false, 0x1.2c36d2a50eb4ep-11},
      {"dp=8,ep=8,a2a=halo,microbatches=2", true, 0x1.2c36d2a50eb4ep-11},
  };
  const ModelSpec m = model("tiny-moe");
  const ClusterSpec c = load_cluster("h800", 1).value();
  for (const Row& row : rows) {
    TrainSpec t;
    t.seq_len = 512;
    SimOptions o;
    o.full = row.full;
    auto r = simulate(m, c, t, strategy(row.strategy), {}, o);
    ASSERT_TRUE(r.ok()) << row.strategy << ": " << r.status().message();
    char got[64];
    std::snprintf(got, sizeof(got), "%a", r->step_time_s);
    EXPECT_EQ(r->step_time_s, row.step_time_s) << row.strategy << (row.full ? " full" : "") << ": now " << got;
  }
}

// The build machine as `piper train --ranks 4` sees it: local-cpu cores, 4 ranks of one kernel thread on 2 shared
// cores (cli/train_report.h local_cluster), fp32 training; and the static share it was priced at before: each
// rank a device of half a core, nothing shared.
ClusterSpec local_machine(bool shared) {
  ClusterSpec c = load_cluster("local-cpu", 1).value();
  c.node.devices_per_node = 4;
  if (shared) {
    c.node.shared_cores = 2;
    c.node.device_cores = 1;
  } else {
    for (double* v : {&c.device.peak_flops_fp32, &c.device.peak_flops_bf16, &c.device.memory_bw_bytes_per_s}) *v *= 0.5;
  }
  return c;
}

TrainSpec fp32_train() {
  TrainSpec t;
  t.seq_len = 128;
  t.global_batch = 16;
  t.param_dtype = t.grad_dtype = t.master_dtype = DType::kFP32;
  t.optimizer_dtype = t.activation_dtype = DType::kFP32;
  return t;
}

// Representative ranks (and the closed form's compute) price a shared-core cluster at the static share: to the bit
// what a device of half a core gave. Simulated in full, the pipelines, whose ranks wait in bubbles while the others
// compute, run faster; pure data parallelism, whose ranks all compute together, gains nothing and pays the copies
// of its transfers' bytes (SyncCost::cpu_per_byte_s: 6.8 % for dp=4, 1.9 % for dp=4 ep=4 when written) and, since
// session 35, the copies that stage its collectives (SyncCost::staging_s_per_byte: 15 % for dp=4 ZeRO-1 in all). Since
// session 34 the closed form's bubble follows (estimate.cc shared_core_bubble_s): a pipeline's ranks fill each
// other's bubbles on the shared cores, so its bubble shrinks to what the critical path at a rank's own cores exceeds
// the compute (none for these two), and its step comes within 10 % of the full simulation's.
TEST(CorePoolTest, SharedCoresSpeedUpPipelinesNotDataParallelism) {
  const ModelSpec m = model("tiny-moe");
  const ClusterSpec shared = local_machine(true), halves = local_machine(false);
  const cost::Calibration cal = [] {
    cost::Calibration c;
    c.workspace_bytes = 0;
    return c;
  }();
  for (const char* text : {"dp=4,zero=1,microbatches=1,mbs=4", "pp=4,schedule=1f1b,microbatches=8,mbs=2",
                           "dp=2,pp=2,schedule=1f1b,microbatches=4,mbs=2", "dp=4,ep=4,microbatches=1,mbs=4"}) {
    const Strategy s = strategy(text);
    TrainSpec t = fp32_train();
    t.micro_batch_size = s.mbs;
    SimOptions rep, full;
    full.full = true;
    auto static_rep = simulate(m, halves, t, s, cal, rep);
    auto static_full = simulate(m, halves, t, s, cal, full);
    auto shared_rep = simulate(m, shared, t, s, cal, rep);
    auto shared_full = simulate(m, shared, t, s, cal, full);
    ASSERT_TRUE(static_rep.ok() && static_full.ok() && shared_rep.ok() && shared_full.ok()) << text;
    EXPECT_EQ(shared_rep->step_time_s, static_rep->step_time_s) << text;
    auto cm_shared = cost::CostModel::create(m, shared, t, cal);
    auto cm_halves = cost::CostModel::create(m, halves, t, cal);
    ASSERT_TRUE(cm_shared.ok() && cm_halves.ok());
    auto est_shared = cm_shared->estimate(s);
    auto est_halves = cm_halves->estimate(s);
    ASSERT_TRUE(est_shared.ok() && est_halves.ok()) << text << ": " << est_shared.status().message();
    // The closed form: the same compute, bubble and optimizer to the bit; its communication costs at least the
    // copies of its bytes on the shared cores (cost/copy_cost.h), a few per cent here.
    EXPECT_EQ(est_shared->time.compute_s, est_halves->time.compute_s) << text;
    EXPECT_EQ(est_shared->time.optimizer_s, est_halves->time.optimizer_s) << text;
    EXPECT_GT(est_shared->time.exposed_comm_s, est_halves->time.exposed_comm_s) << text;
    if (s.pp > 1) {
      EXPECT_GT(est_halves->time.bubble_s, 0) << text;
      EXPECT_EQ(est_shared->time.bubble_s, 0) << text;  // (compute + bubble) / 2 <= compute on half the cores
      EXPECT_NEAR(est_shared->step_time_s / shared_full->step_time_s, 1.0, 0.1) << text;
    } else {
      EXPECT_EQ(est_shared->time.bubble_s, est_halves->time.bubble_s) << text;
      EXPECT_LT(est_shared->step_time_s, 1.2 * est_halves->step_time_s) << text;
    }
    const double ratio = shared_full->step_time_s / static_full->step_time_s;
    std::printf("%-48s static %.3f ms, shared %.3f ms (%.3fx)\n", text, 1e3 * static_full->step_time_s,
                1e3 * shared_full->step_time_s, ratio);
    if (s.pp > 1) {
      EXPECT_LT(ratio, 0.85) << text;  // 0.72 (pp=4, 1F1B, 8 microbatches) and 0.78 (dp=2, pp=2) when written
    } else {
      EXPECT_GT(ratio, 1.0) << text;
      EXPECT_LT(ratio, 1.2) << text;
    }
  }
}

// Two emulated hosts of one 2-core machine (scripts/two-node-emulation.sh: network namespaces, 4 ranks each, each
// host priced with 1 core): with NodeSpec::nodes_per_machine = 2 they pool the machine's 2 cores, so the pipeline
// stage that computes while the other waits in its bubble runs on the cores the other leaves idle; pure data
// parallelism, every rank busy, gains nothing. A count that does not divide the nodes, or hosts sharing a machine
// without shared cores, is refused by name.
TEST(CorePoolTest, HostsOfOneMachinePoolItsCores) {
  ClusterSpec c = load_cluster("local-cpu", 1).value();
  c.num_nodes = c.max_nodes = 2;
  c.fabric.topology = FabricTopology::kFatTree;
  c.node.nics.push_back(NicSpec{1.25e8, {}});
  c.node.nic_latency_s = 5e-5;
  c.node.devices_per_node = 4;
  c.node.shared_cores = 1;
  c.node.device_cores = 1;
  ASSERT_TRUE(c.validate().ok()) << c.validate().message();
  ClusterSpec machine = c;
  machine.node.nodes_per_machine = 2;
  ASSERT_TRUE(machine.validate().ok()) << machine.validate().message();
  SimOptions full;
  full.full = true;
  const CorePool pool = core_pool_of(machine, full, {});
  EXPECT_EQ(pool.cores, 2);
  EXPECT_EQ(pool.ranks_per_node, 8);
  EXPECT_EQ(core_pool_of(c, full, {}).cores, 1);

  const ModelSpec m = model("tiny-moe");
  cost::Calibration cal;
  cal.workspace_bytes = 0;
  auto step = [&](const ClusterSpec& cluster, const char* text) {
    const Strategy s = strategy(text);
    TrainSpec t = fp32_train();
    t.micro_batch_size = s.mbs;
    auto r = simulate(m, cluster, t, s, cal, full);
    EXPECT_TRUE(r.ok()) << text << ": " << r.status().message();
    return r.ok() ? r->step_time_s : 0.0;
  };
  const char* pipeline = "dp=4,pp=2,schedule=1f1b,microbatches=4,mbs=1";
  const char* data = "dp=8,zero=1,microbatches=1,mbs=2";
  EXPECT_LT(step(machine, pipeline), 0.9 * step(c, pipeline));
  EXPECT_NEAR(step(machine, data) / step(c, data), 1.0, 1e-6);

  machine.node.nodes_per_machine = 3;
  EXPECT_NE(machine.validate().message().find("node.nodes_per_machine: 3 does not divide the 2 nodes"),
            std::string::npos);
  machine.node.nodes_per_machine = 2;
  machine.node.shared_cores = 0;
  EXPECT_NE(machine.validate().message().find("needs node.shared_cores"), std::string::npos);
}

// The closed form on a node that shares its cores: a rank's data-parallel communication costs at least the copies
// of its bytes at the node's copy rate (1 / intra-node bandwidth) and its static share of the cores (half a core):
// ZeRO-1 reduce-scatters the gradients and gathers the parameters, 3/4 of each on 4 ranks (fp32: 4 B each); ZeRO-3
// with 2 microbatches carries three times as much (a gather before each F and B and a reduce-scatter, per
// microbatch). Beside them the copies that stage each collective (copy_cost.h dp_staged_bytes) at one thread's
// streaming rate: ZeRO-1 2 N + 2 N/4 for the reduce-scatter and as much for the gather (5 N); ZeRO-3 per microbatch
// 2 N + 3 N/4 and two gathers of 2 N/4 + 3 N (19.5 N in all).
TEST(CorePoolTest, TheClosedFormChargesATransfersCopiesToTheSharedCores) {
  const ModelSpec m = model("tiny-moe");
  const ClusterSpec shared = local_machine(true);
  cost::Calibration cal;
  cal.workspace_bytes = 0;
  auto est = [&](const char* text) {
    const Strategy s = strategy(text);
    TrainSpec t = fp32_train();
    t.micro_batch_size = s.mbs;
    return cost::CostModel::create(m, shared, t, cal).value().estimate(s).value();
  };
  const cost::Estimate z1 = est("dp=4,zero=1,microbatches=2,mbs=2");
  const cost::Estimate z3 = est("dp=4,zero=3,microbatches=2,mbs=2");
  const double n = z1.memory.grads;  // ZeRO-1 keeps whole gradients; fp32 parameters as large
  const double copy_s = 0.75 * 2 * n / shared.node.intra.bw_bytes_per_s;
  const double stage_per_byte = 1 / (shared.device.memory_bw_bytes_per_s * cal.memory_bw_efficiency);
  EXPECT_NEAR(z1.comm.dp_s, (copy_s + 5 * n * stage_per_byte) / 0.5, 1e-9 * z1.comm.dp_s);
  EXPECT_NEAR(z3.comm.dp_s, (3 * copy_s + 19.5 * n * stage_per_byte) / 0.5, 1e-9 * z3.comm.dp_s);
  // Measured one-thread streaming bandwidth (Calibration::thread_figures) prices the staging instead.
  cal.thread_figures = {{1, 0, 0, 2 * shared.device.memory_bw_bytes_per_s * cal.memory_bw_efficiency, 0}};
  EXPECT_NEAR(est("dp=4,zero=1,microbatches=2,mbs=2").comm.dp_s, (copy_s + 2.5 * n * stage_per_byte) / 0.5,
              1e-9 * z1.comm.dp_s);
}

// The af-pipe closed form charges the copies too: its m2n exchanges per microbatch and its data-parallel bytes per
// step cost a shared-core node's cores, so halving the node's copy rate lengthens its exposed communication, and a
// node that does not share its cores (each rank half as fast, no copies) gains nothing from the rate.
TEST(CorePoolTest, TheAfPipeClosedFormChargesItsCopiesToTheSharedCores) {
  const ModelSpec m = model("tiny-moe");
  cost::Calibration cal;
  cal.workspace_bytes = 0;
  const Strategy s = strategy("dp=2,ep=2,pp=1,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=2,microbatches=8,mbs=1");
  TrainSpec t = fp32_train();
  t.micro_batch_size = s.mbs;
  auto est = [&](ClusterSpec c, double bw_scale) {
    c.node.intra.bw_bytes_per_s *= bw_scale;
    return cost::CostModel::create(m, c, t, cal).value().estimate(s).value();
  };
  auto exposed = [](const cost::Estimate& e) { return e.comm.ep_s + e.comm.dp_s; };
  const cost::Estimate fast = est(local_machine(true), 1.0), slow = est(local_machine(true), 0.5);
  EXPECT_GT(exposed(slow), 1.5 * exposed(fast));
  EXPECT_GT(slow.step_time_s, fast.step_time_s);
  const cost::Estimate own_fast = est(local_machine(false), 1.0), own_slow = est(local_machine(false), 0.5);
  EXPECT_LT(exposed(own_slow) - exposed(own_fast), 0.5 * (exposed(slow) - exposed(fast)));
}

// A calibration's measured core_sharing reaches the prices and the pool: dp=4 on the build machine's 2 cores (all
// four ranks computing together) at sharing 0.5 for n = 4 takes longer, by at most 2x (only its compute slows), in
// the closed form, with representative ranks and in full alike (every rank always computes with the three others,
// so the pool runs each task at its price, the copies of its transfers' bytes and their staging beside them: 6.8 %
// more in full when written, 15 % since session 35); a pipeline, whose ranks also compute alone or in pairs (sharing 1
// here), slows in full by less than its all-busy price says.
TEST(CorePoolTest, ACalibrationsSharingReachesPricesAndPool) {
  const ModelSpec m = model("tiny-moe");
  const ClusterSpec shared = local_machine(true);
  cost::Calibration ideal;
  ideal.workspace_bytes = 0;
  cost::Calibration measured = ideal;
  measured.core_sharing = {1.0, 1.0, 0.5};
  EXPECT_EQ(cost::rate_share(shared.node, ideal), 0.5);
  EXPECT_EQ(cost::rate_share(shared.node, measured), 0.25);
  SimOptions rep, full;
  full.full = true;
  const Strategy dp = strategy("dp=4,zero=1,microbatches=1,mbs=4");
  TrainSpec t = fp32_train();
  t.micro_batch_size = dp.mbs;
  auto a = simulate(m, shared, t, dp, ideal, full);
  auto b = simulate(m, shared, t, dp, measured, full);
  auto br = simulate(m, shared, t, dp, measured, rep);
  auto ea = cost::CostModel::create(m, shared, t, ideal).value().estimate(dp);
  auto eb = cost::CostModel::create(m, shared, t, measured).value().estimate(dp);
  ASSERT_TRUE(a.ok() && b.ok() && br.ok() && ea.ok() && eb.ok());
  EXPECT_GT(b->step_time_s, 1.3 * a->step_time_s);
  EXPECT_LE(b->step_time_s, 2.0 * a->step_time_s);
  EXPECT_GT(b->step_time_s, br->step_time_s);
  EXPECT_LT(b->step_time_s, 1.2 * br->step_time_s);
  EXPECT_GT(eb->step_time_s, 1.3 * ea->step_time_s);
  const Strategy pp = strategy("pp=4,schedule=1f1b,microbatches=8,mbs=2");
  t.micro_batch_size = pp.mbs;
  auto pa = simulate(m, shared, t, pp, ideal, full);
  auto pb = simulate(m, shared, t, pp, measured, full);
  auto pr = simulate(m, shared, t, pp, measured, rep);
  ASSERT_TRUE(pa.ok() && pb.ok() && pr.ok());
  EXPECT_GT(pb->step_time_s, pa->step_time_s);
  EXPECT_LT(pb->step_time_s, pr->step_time_s);
}

}  // namespace
}  // namespace piper::sim
