// simulate_plan / simulate: agreement with the closed-form estimate and the unit-cost schedule simulator,
// DP all-reduce overlap, representative vs full simulation, memory, and errors.
#include "piper/sim/plan_exec.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "piper/base/check.h"
#include "piper/compile/compile.h"
#include "piper/compile/pipeline_schedule.h"
#include "piper/compile/schedule_sim.h"
#include "piper/cost/estimate.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/schedules/schedule.h"
#include "test_clusters.h"

namespace piper::sim {
namespace {

ModelSpec model(const std::string& name) {
  auto m = load_model(name);
  PIPER_CHECK_OK(m.status());
  return *m;
}

ClusterSpec cluster(const std::string& name, int nodes) {
  auto c = load_cluster(name, nodes);
  PIPER_CHECK_OK(c.status());
  return *c;
}

Strategy strategy(const std::string& text) {
  auto s = Strategy::parse(text);
  PIPER_CHECK_OK(s.status());
  return *s;
}

TrainSpec train(int64_t seq) {
  TrainSpec t;
  t.seq_len = seq;
  return t;
}

// Without contention the simulated step equals the closed-form estimate: both price every task with the same
// cost tables. The rows keep the closed form's assumptions true: stages of equal cost (a 32-layer GPT-7.5B with a
// 256-token vocabulary, so embedding and head are negligible: the closed form prices every stage like the slowest)
// and data-parallel gradient reductions that fit behind the last microbatch's backward (sequences of 4,096).
// docs/simulator.md explains the rows where the two differ and why.
TEST(PlanExecTest, MatchesTheClosedFormEstimateWithoutContention) {
  struct Row {
    bool balanced;  // the 32-layer, 256-vocabulary GPT-7.5B (else GPT-1.7B)
    int nodes;
    const char* strategy;
    int64_t seq;
  };
  const Row rows[] = {
      {false, 1, "dp=8,microbatches=4", 4096},
      {false, 2, "dp=16,microbatches=4", 4096},
      {true, 1, "dp=2,pp=4,schedule=1f1b,microbatches=8", 2048},
      {true, 1, "pp=8,schedule=gpipe,microbatches=16", 2048},
      {true, 1, "pp=8,vpp=2,schedule=interleaved,microbatches=16", 2048},
      {true, 1, "pp=8,schedule=zb-h1,microbatches=16", 2048},
      {true, 1, "tp=8,microbatches=4", 2048},
      {true, 1, "tp=4,dp=2,microbatches=4", 2048},
  };
  for (const Row& row : rows) {
    ModelSpec m = model(row.balanced ? "gpt-7.5b" : "gpt-1.7b");
    if (row.balanced) {
      m.num_layers = 32;
      m.vocab_size = 256;
    }
    ClusterSpec c = cluster("dgx-h100", row.nodes);
    Strategy s = strategy(row.strategy);
    TrainSpec t = train(row.seq);
    t.micro_batch_size = s.mbs;
    auto cm = cost::CostModel::create(m, c, t);
    ASSERT_TRUE(cm.ok()) << cm.status().message();
    auto est = cm->estimate(s);
    ASSERT_TRUE(est.ok()) << est.status().message();
    auto sim = simulate(m, c, t, s);
    ASSERT_TRUE(sim.ok()) << row.strategy << ": " << sim.status().message();
    EXPECT_NEAR(sim->step_time_s / est->step_time_s, 1.0, 0.02)
        << row.strategy << ": simulated " << sim->step_time_s << " s, estimate " << est->step_time_s << " s";
    EXPECT_NEAR(sim->mfu / est->mfu, 1.0, 0.02) << row.strategy;
    // The compute itself is priced identically: busy time on the bottleneck rank = compute + optimizer.
    double busy = 0;
    for (const RankStats& k : sim->sim.ranks) busy = std::max(busy, k.busy_s);
    EXPECT_NEAR(busy / (est->time.compute_s + est->time.optimizer_s), 1.0, 1e-3) << row.strategy;
  }
}

// Tensor-parallel collectives carry the hidden states of one microbatch (tokens x hidden x 2 bytes), never the
// activations a chunk keeps for its own backward (ir shard tp used to route the F -> BW edge through them). The
// gradient sums over tp (CommRole::kTpGradSum) carry gradients, not hidden states.
TEST(PlanExecTest, TensorParallelCollectivesCarryHiddenStates) {
  ModelSpec m = model("gpt-1.7b");
  m.num_layers = 2;
  for (const char* text : {"tp=2,microbatches=2", "tp=2,sp=1,microbatches=2"}) {
    Strategy s = strategy(text);
    TrainSpec t = train(256);
    t.global_batch = s.global_batch();
    auto compiled = compile::compile_strategy(m, t, s);
    ASSERT_TRUE(compiled.ok()) << compiled.status().message();
    int tp_ops = 0;
    for (const auto& st : compiled->plan.templates[0].streams) {
      for (const auto& in : st.instrs) {
        if (in.op != compile::OpKind::kCollective || in.group != "tp") continue;
        if (in.role == compile::CommRole::kTpGradSum) continue;  // a chunk's partial gradients, once per step
        ++tp_ops;
        EXPECT_EQ(in.comm_bytes, 256 * m.hidden_size * 2) << text << " " << in.label;
      }
    }
    // Per layer and microbatch: attention and MLP, forward and backward, one all-reduce each; per microbatch, the
    // vocabulary-parallel embedding's output (forward) and the head's input gradient (backward).
    if (!s.sp) {
      EXPECT_EQ(tp_ops, 2 * (2 * 2 * 2 + 2)) << text;
    }
    EXPECT_GT(tp_ops, 0) << text;
  }
}

// With unit costs (attention chunk F = B = W = 1, everything else free, one layer per stage) the plan's makespan
// is the unit-cost schedule simulator's (`piper schedule`).
TEST(PlanExecTest, UnitCostMakespansEqualTheScheduleSimulator) {
  struct Row {
    const char* schedule;
    int pp, vpp, m;
  };
  const Row rows[] = {
      {"gpipe", 4, 1, 8}, {"1f1b", 4, 1, 8}, {"1f1b", 3, 1, 5}, {"interleaved", 2, 2, 4}, {"zb-h1", 4, 1, 8}};
  for (const Row& row : rows) {
    Strategy s;
    s.pp = row.pp;
    s.vpp = row.vpp;
    s.schedule = row.schedule;
    s.microbatches = row.m;
    ModelSpec m = model("gpt-1.7b");
    m.num_layers = s.num_stages();
    TrainSpec t = train(128);
    t.global_batch = s.global_batch();
    auto compiled = compile::compile_strategy(m, t, s);
    ASSERT_TRUE(compiled.ok()) << compiled.status().message();
    Network net = Network::build(testing::make_cluster(1, 8, 1e12, 1, 1e11)).value();
    SimOptions o;
    o.zero_comm = true;
    auto r = simulate_plan(compiled->plan, net, unit_task_time(Part::kAttention), o);
    ASSERT_TRUE(r.ok()) << r.status().message();

    schedules::ScheduleParams params{s.pp, s.microbatches, s.vpp};
    auto dirs = schedules::schedule_directives(s.schedule, params);
    ASSERT_TRUE(dirs.ok());
    auto sched = compile::realize_schedule(*dirs, s.pp, s.num_stages(), s.microbatches);
    ASSERT_TRUE(sched.ok()) << sched.status().message();
    auto timeline = compile::simulate_schedule(*sched, compile::UnitCosts{1, 1, 1});
    ASSERT_TRUE(timeline.ok());
    EXPECT_DOUBLE_EQ(r->step_time_s, timeline->makespan) << row.schedule << " pp=" << row.pp << " m=" << row.m;
    // Per-rank busy time is the rank's unit work: m * (1 + 2) per stage it holds.
    for (const RankStats& k : r->ranks) EXPECT_DOUBLE_EQ(k.busy_s, 3.0 * row.m * row.vpp) << row.schedule;
  }
}

// A DP gradient all-reduce overlapped with the remaining backward is hidden when it is shorter; on a slow network
// it shows as exposed communication. Two single-GPU nodes so that the all-reduce crosses a NIC of chosen speed.
TEST(PlanExecTest, DataParallelAllReduceHiddenWhenShorterThanBackward) {
  ModelSpec m = model("gpt-1.7b");
  auto run = [&](double nic_bw, const std::string& text) {
    ClusterSpec c = testing::make_cluster(2, 1, 450e9, 1, nic_bw, 3e-6, 5e-6);
    c.device = cluster("dgx-h100", 1).device;
    Strategy s = strategy(text);
    TrainSpec t = train(2048);
    auto r = simulate(m, c, t, s);
    PIPER_CHECK_OK(r.status());
    return std::move(r).value();
  };
  // Reference: the same per-rank work without data parallelism (one node).
  ClusterSpec one = testing::make_cluster(1, 1, 450e9, 1, 50e9);
  one.device = cluster("dgx-h100", 1).device;
  auto ref = simulate(m, one, train(2048), strategy("dp=1,microbatches=2"));
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  SimReport fast = run(400e9, "dp=2,microbatches=2");
  SimReport slow = run(1e9, "dp=2,microbatches=2");
  // Fast network: only the last layer's all-reduce (the embedding, nothing left to hide it) may show.
  EXPECT_LT(fast.exposed_comm_fraction, 0.02);
  EXPECT_NEAR(fast.step_time_s / ref->step_time_s, 1.0, 0.02);
  EXPECT_GT(fast.sim.ranks[0].comm_s, 0.0);
  // Slow network: ~3.4 GB of fp32 gradients at 1 GB/s cannot hide behind a backward of ~0.1 s.
  EXPECT_GT(slow.exposed_comm_fraction, 0.5);
  EXPECT_GT(slow.step_time_s, 3 * ref->step_time_s);
}

// Representative ranks give the same step as simulating every rank on a symmetric cluster, for a pipeline x
// expert x data parallel MoE plan with ZeRO-1 (EP all-to-all, DP reduce-scatter/all-gather and P2P on shared NICs).
TEST(PlanExecTest, RepresentativeRanksEqualTheFullSimulation) {
  ModelSpec m = model("tiny-moe");
  for (const char* text :
       {"dp=4,ep=4,pp=2,zero=1,microbatches=4", "dp=2,ep=2,tp=2,sp=1,pp=2,microbatches=2",
        "dp=8,ep=8,zero=2,microbatches=2", "dp=8,ep=4,a2a=halo,microbatches=2",
        // MoE parallel folding: ep = 4 > dp = 2; and expert groups of one node, replicas across.
        "dp=2,ep=4,tp=2,sp=1,pp=2,fold=1,zero=1,microbatches=2", "dp=4,ep=4,tp=2,sp=1,fold=1,zero=3,microbatches=2",
        // Expert tensor parallelism: the etp exchanges over each replica's two tensor ranks.
        "dp=2,ep=2,tp=2,sp=1,etp=2,pp=2,zero=1,microbatches=2"}) {
    ClusterSpec c = testing::make_cluster(2, 4, 100e9, 2, 5e9, 2e-6, 5e-6);
    c.device = cluster("dgx-h100", 1).device;
    Strategy s = strategy(text);
    TrainSpec t = train(512);
    SimOptions reduced, full;
    full.full = true;
    auto a = simulate(m, c, t, s, {}, reduced);
    auto b = simulate(m, c, t, s, {}, full);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status().message();
    ASSERT_TRUE(b.ok()) << text << ": " << b.status().message();
    EXPECT_EQ(a->sim.ranks.size(), static_cast<size_t>(s.pp));
    EXPECT_EQ(b->sim.ranks.size(), 8u) << text;
    EXPECT_GT(b->sim.flows, a->sim.flows);
    EXPECT_NEAR(a->step_time_s, b->step_time_s, 1e-6 * b->step_time_s) << text;
    for (const RankStats& k : b->sim.ranks) {
      const RankStats& rep = a->sim.ranks[static_cast<size_t>(k.pp_rank)];
      EXPECT_NEAR(k.exposed_comm_s, rep.exposed_comm_s, 1e-6 * b->step_time_s) << text << " rank " << k.rank;
      EXPECT_EQ(k.peak_bytes, rep.peak_bytes);
    }
  }
}

// Pipeline slices of one node each: every slice's collective templates after the first are translated from it
// (CommTemplates::set_reuse_slices); the simulation must be the same to the bit as with every template built.
TEST(PlanExecTest, SliceTemplateReuseGivesTheSameSimulation) {
  ModelSpec m = model("tiny-moe");
  for (const char* text : {"dp=4,ep=4,pp=2,zero=1,microbatches=4", "dp=4,ep=4,pp=2,a2a=halo,microbatches=4",
                           "dp=2,ep=2,tp=2,sp=1,pp=2,zero=2,microbatches=2"}) {
    ClusterSpec c = testing::make_cluster(2, 4, 100e9, 2, 5e9, 2e-6, 5e-6);
    c.device = cluster("dgx-h100", 1).device;
    Strategy s = strategy(text);
    SimOptions moved, built;
    built.reuse_slice_templates = false;
    auto a = simulate(m, c, train(512), s, {}, moved);
    auto b = simulate(m, c, train(512), s, {}, built);
    ASSERT_TRUE(a.ok()) << text << ": " << a.status().message();
    ASSERT_TRUE(b.ok()) << text << ": " << b.status().message();
    EXPECT_EQ(a->step_time_s, b->step_time_s) << text;
    EXPECT_EQ(a->sim.flows, b->sim.flows) << text;
    EXPECT_EQ(a->sim.rate_updates, b->sim.rate_updates) << text;
    ASSERT_EQ(a->sim.ranks.size(), b->sim.ranks.size());
    for (size_t k = 0; k < a->sim.ranks.size(); ++k) {
      EXPECT_EQ(a->sim.ranks[k].exposed_comm_s, b->sim.ranks[k].exposed_comm_s) << text << " rank " << k;
      EXPECT_EQ(a->sim.ranks[k].busy_s, b->sim.ranks[k].busy_s) << text << " rank " << k;
    }
  }
}

// GPipe keeps every microbatch's activations until its backward: rank 0's peak is its static bytes plus m times
// one microbatch's activation allocations.
// DualPipeV hides the EP all-to-all behind compute where 1F1B exposes it. A DeepSeek-V3-like model: its MoE layer
// (hidden 7,168, 256 experts of 2,048, top-8, one shared expert, MLA attention) eight times, every layer MoE, and a
// 256-token vocabulary so that embedding and head do not unbalance the stages; 32 H800s (4 nodes, 8 x 50 GB/s NICs),
// pp=2, dp=ep=16 (each expert group spans 2 nodes: half of every dispatch and combine crosses the NICs), 16
// microbatches of 4,096 tokens. Each all-to-all moves 4,096 x 8 x 7,168 x 2 B = 470 MB per rank (4.7 ms), about as
// long as the expert compute it feeds. 1F1B runs each microbatch's chunk after its all-to-all, so the compute waits
// for every one of them. DualPipeV pairs the F of one microbatch with the B of another in one slot; with the
// chunks of the pair interleaved (the default, LowerOptions::interleave_overlap, stream_order.cc) one microbatch's
// dispatch or combine runs on the ep stream while the other's chunk computes. Without the interleaving the pair
// runs F then B and hides nothing (the only gain is the smaller bubble). docs/simulator.md has the table.
TEST(PlanExecTest, DualPipeVHidesExpertAllToAllWhere1F1BExposesIt) {
  ModelSpec m = model("deepseek-v3");
  m.num_layers = 8;
  m.moe.first_k_dense_layers = 0;
  m.vocab_size = 256;
  ClusterSpec c = cluster("h800", 4);
  TrainSpec t = train(4096);
  struct Run {
    double step = 0, exposed = 0, bubble = 0, ep_exposed_s = 0, busy_s = 0;
  };
  auto run = [&](const char* schedule, bool interleave) {
    Strategy s = strategy(std::string("dp=16,pp=2,ep=16,zero=1,microbatches=16,schedule=") + schedule);
    SimOptions o;  // interleaved by default
    if (!interleave) o.interleave_overlap = false;
    auto r = simulate(m, c, t, s, {}, o);
    PIPER_CHECK_OK(r.status());
    Run out{r->step_time_s, r->exposed_comm_fraction, r->bubble_fraction, 0, 0};
    for (const RankStats& k : r->sim.ranks) {
      out.busy_s += k.busy_s;
      for (const auto& [group, sec] : k.exposed_by_group_s) out.ep_exposed_s += group == "ep" ? sec : 0;
    }
    // The dispatch carries every token top_k times (compile's split keeps the graph's moe_top_k).
    for (const auto& st : r->compiled.plan.templates[0].streams) {
      for (const auto& in : st.instrs) {
        if (in.op == compile::OpKind::kCollective && in.group == "ep") {
          EXPECT_EQ(in.comm_bytes, int64_t{4096} * 8 * 7168 * 2) << in.label;
        }
      }
    }
    std::printf("%-9s interleave=%d: step %.3f s, exposed comm %.3f, bubble %.3f, ep exposed %.3f s (2 ranks)\n",
                schedule, interleave ? 1 : 0, out.step, out.exposed, out.bubble, out.ep_exposed_s);
    return out;
  };
  const Run one = run("1f1b", false);
  const Run dual = run("dualpipev", true);
  const Run dual_plain = run("dualpipev", false);
  // Same work priced the same way.
  EXPECT_NEAR(dual.busy_s / one.busy_s, 1.0, 1e-9);
  // 1F1B exposes the all-to-alls: more than a third of the step the engines wait for the network.
  EXPECT_GT(one.exposed, 0.3);
  // DualPipeV with the pair interleaved hides more than half of the EP all-to-all time 1F1B exposes...
  EXPECT_LT(dual.ep_exposed_s, 0.6 * one.ep_exposed_s);
  EXPECT_LT(dual.exposed, 0.75 * one.exposed);
  EXPECT_LT(dual.step, 0.85 * one.step);
  // ... while run F-then-B it hides almost nothing.
  EXPECT_GT(dual_plain.ep_exposed_s, 0.85 * one.ep_exposed_s);
  EXPECT_LT(dual.step, 0.9 * dual_plain.step);
}

// A Qwen3-like MoE layer stack (DeepSeek-V3's layer without dense layers or shared expert), 8 layers.
ModelSpec routed_moe_layers() {
  ModelSpec m = model("deepseek-v3");
  m.num_layers = 8;
  m.moe.first_k_dense_layers = 0;
  m.moe.num_shared_experts = 0;
  m.vocab_size = 256;
  return m;
}

// Exposed EP seconds summed over the simulated ranks; neighbours on rank 0's `ep` stream in the same direction
// (F then F, B then B) and alternating (F then B, B then F).
struct EpStream {
  double exposed = 0;
  int same = 0, alt = 0;
};
EpStream ep_stream(const SimReport& r) {
  EpStream o;
  for (const RankStats& k : r.sim.ranks) {
    for (const auto& [group, sec] : k.exposed_by_group_s) o.exposed += group == "ep" ? sec : 0;
  }
  for (const auto& st : r.compiled.plan.templates[0].streams) {
    char last = 0;
    for (const auto& in : st.instrs) {
      if (in.op != compile::OpKind::kCollective || in.group != "ep") continue;
      const char dir = in.label.find(".F.") != std::string::npos ? 'F' : 'B';
      if (last != 0) ++(dir == last ? o.same : o.alt);
      last = dir;
    }
  }
  return o;
}

// Under tensor parallelism with sequence parallelism a tp collective sits between every two chunks of a layer.
// The pair interleave must not count it as an all-to-all to hide, or the `ep` stream runs F dispatch, F combine,
// B combine, B dispatch: each all-to-all then waits for the expert GEMM of its own microbatch instead of running
// behind the other's. Qwen3-like layer (no shared expert), tp=2: in the steady state the `ep` stream alternates F
// and B, and DualPipeV hides most of what 1F1B exposes.
TEST(PlanExecTest, DualPipeVAlternatesForwardAndBackwardAllToAllsUnderTensorParallelism) {
  ModelSpec m = routed_moe_layers();
  ClusterSpec c = cluster("h800", 8);
  TrainSpec t = train(4096);
  auto run = [&](const char* schedule) {
    Strategy s = strategy(std::string("dp=16,tp=2,sp=1,pp=2,ep=16,zero=1,microbatches=16,schedule=") + schedule);
    auto r = simulate(m, c, t, s, {}, SimOptions{});
    PIPER_CHECK_OK(r.status());
    const EpStream o = ep_stream(*r);
    std::printf("%-9s tp=2: step %.3f s, ep exposed %.3f s\n", schedule, r->step_time_s, o.exposed);
    return o;
  };
  const EpStream one = run("1f1b");
  const EpStream dual = run("dualpipev");
  std::printf("dualpipev ep stream: %d alternations, %d same-direction neighbours\n", dual.alt, dual.same);
  // Warm-up and cool-down run one direction only; the overlapped pairs alternate.
  EXPECT_GT(dual.alt, 2 * dual.same);
  EXPECT_LT(dual.exposed, 0.6 * one.exposed);
}

// ep_overlap (Megatron's --overlap-moe-expert-parallel-comm, combined 1F1B): one more warm-up forward, then every
// steady F and BW share a slot whose chunks alternate, so each all-to-all runs behind the other microbatch's
// compute. Same Qwen3-like layer and mesh as above: with the overlap the `ep` stream alternates F and B, the
// exposed EP time falls below 0.6x that of the same schedule without it, and the closed form hides it too.
TEST(PlanExecTest, CombinedOneFOneBHidesAllToAllsBehindThePairedMicrobatch) {
  ModelSpec m = routed_moe_layers();
  ClusterSpec c = cluster("h800", 8);
  TrainSpec t = train(4096);
  auto cm = cost::CostModel::create(m, c, t);
  ASSERT_TRUE(cm.ok()) << cm.status().message();
  struct Out {
    double step = 0, ep = 0, est_step = 0, est_ep = 0;
    int same = 0, alt = 0;
  };
  auto run = [&](const std::string& text) {
    Strategy s = strategy("tp=2,sp=1,ep=16,zero=1,microbatches=16," + text);
    auto r = simulate(m, c, t, s, {}, SimOptions{});
    PIPER_CHECK_OK(r.status());
    auto est = cm->estimate(s);
    PIPER_CHECK_OK(est.status());
    const EpStream e = ep_stream(*r);
    Out o;
    o.step = r->step_time_s;
    o.est_step = est->step_time_s;
    o.est_ep = est->comm.ep_s;
    o.ep = e.exposed;
    o.same = e.same;
    o.alt = e.alt;
    std::printf(
        "%-45s step %.3f s (closed form %.3f), ep exposed %.3f s (closed form %.3f); ep stream: %d "
        "alternations, %d same-direction neighbours\n",
        text.c_str(), o.step, o.est_step, o.ep, o.est_ep, o.alt, o.same);
    return o;
  };
  // Megatron pairs without pipelining (pp = 1) or under interleaving (pp > 1 needs vpp); so does Piper.
  for (const std::string sched : {"dp=32,pp=1,schedule=1f1b", "dp=16,pp=2,vpp=2,schedule=interleaved"}) {
    const Out plain = run(sched);
    const Out overlap = run(sched + ",ep_overlap=1");
    EXPECT_GT(overlap.alt, overlap.same) << sched;
    EXPECT_LT(3 * plain.alt, plain.same) << sched;
    EXPECT_LT(overlap.ep, 0.6 * plain.ep) << sched;
    EXPECT_LT(overlap.step, plain.step) << sched;
    EXPECT_LT(overlap.est_ep, 0.6 * plain.est_ep) << sched;
    EXPECT_LT(overlap.est_step, plain.est_step) << sched;
  }
}

TEST(PlanExecTest, GpipePeakMemoryHoldsEveryMicrobatch) {
  ModelSpec m = model("gpt-1.7b");
  m.num_layers = 4;
  Strategy s = strategy("pp=2,schedule=gpipe,microbatches=4");
  TrainSpec t = train(256);
  t.global_batch = s.global_batch();
  auto compiled = compile::compile_strategy(m, t, s);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  Network net = Network::build(testing::make_cluster(1, 2, 1e11, 1, 1e10)).value();
  auto r = simulate_plan(compiled->plan, net, unit_task_time(Part::kAttention));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const compile::Program& p0 = compiled->plan.templates[0];
  // A microbatch's stash (the allocs before its forward chunks), and the working set of the first backward task
  // (the alloc right before it), which runs while every microbatch's stash is live.
  int64_t per_mb = 0, first_working_set = 0;
  for (const auto& st : p0.streams) {
    for (size_t i = 0; i < st.instrs.size(); ++i) {
      const auto& in = st.instrs[i];
      if (in.op != compile::OpKind::kAlloc) continue;
      const bool before_backward = i + 1 < st.instrs.size() && ir::is_backward(st.instrs[i + 1].pass) &&
                                   st.instrs[i + 1].op == compile::OpKind::kCompute;
      if (before_backward && first_working_set == 0) first_working_set = in.mem_delta;
      if (!before_backward && in.label.find(".mb0") != std::string::npos) per_mb += in.mem_delta;
    }
  }
  ASSERT_GT(per_mb, 0);
  ASSERT_GT(first_working_set, 0);
  EXPECT_EQ(r->ranks[0].peak_bytes, p0.static_bytes + 4 * per_mb + first_working_set);
  EXPECT_GT(p0.static_bytes, 0);
}

TEST(PlanExecTest, ErrorsNameTheProblem) {
  ModelSpec m = model("tiny-moe");
  Strategy s = strategy("dp=2,pp=2,microbatches=2");
  TrainSpec t = train(64);
  t.global_batch = s.global_batch();
  auto compiled = compile::compile_strategy(m, t, s);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  Network small = Network::build(testing::make_cluster(1, 2, 1e11, 1, 1e10)).value();
  auto r = simulate_plan(compiled->plan, small, unit_task_time(Part::kAttention));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("raise --nodes"), std::string::npos) << r.status().message();
  Network net = Network::build(testing::make_cluster(1, 4, 1e11, 1, 1e10)).value();
  TaskTimeFn bad = [](const compile::Program&, const compile::Instruction&) { return std::nan(""); };
  r = simulate_plan(compiled->plan, net, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no time for part"), std::string::npos) << r.status().message();
  // A plan whose receive never gets its send deadlocks, and the error names the blocked stream.
  compile::Plan broken = compiled->plan;
  for (auto& st : broken.templates[1].streams) {
    for (auto& in : st.instrs) {
      if (in.op == compile::OpKind::kRecv) in.tag += 1;
    }
  }
  r = simulate_plan(broken, net, unit_task_time(Part::kAttention));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("deadlocked"), std::string::npos) << r.status().message();
}

// SimOptions::deadline: a simulation whose wall-clock deadline has passed stops in its event loop with
// kDeadlineExceeded ("not simulated: budget"), naming how far it got; a deadline far away changes nothing.
// (plan/rescore.h relies on it to keep `piper plan` within --sim-budget-s.)
TEST(PlanExecTest, DeadlineStopsTheSimulation) {
  ModelSpec m = model("tiny-moe");
  Strategy s = strategy("dp=8,ep=8,zero=3,microbatches=32");
  TrainSpec t = train(512);
  t.global_batch = s.global_batch();
  auto compiled = compile::compile_strategy(m, t, s);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  Network net = Network::build(testing::make_cluster(2, 4, 100e9, 2, 5e9, 2e-6, 5e-6)).value();
  auto free_run = simulate_plan(compiled->plan, net, unit_task_time(Part::kAttention));
  ASSERT_TRUE(free_run.ok()) << free_run.status().message();
  // Enough work for the loop to look at the clock (every 1,024 rounds; each round completes at least one
  // instruction or network event).
  ASSERT_GT(free_run->instructions, 4096);

  SimOptions far;
  far.deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  auto with_far = simulate_plan(compiled->plan, net, unit_task_time(Part::kAttention), far);
  ASSERT_TRUE(with_far.ok()) << with_far.status().message();
  EXPECT_EQ(with_far->step_time_s, free_run->step_time_s);
  EXPECT_EQ(with_far->instructions, free_run->instructions);

  SimOptions passed;
  passed.deadline = std::chrono::steady_clock::now();
  auto stopped = simulate_plan(compiled->plan, net, unit_task_time(Part::kAttention), passed);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), StatusCode::kDeadlineExceeded) << stopped.status().to_string();
  EXPECT_NE(stopped.status().message().find("not simulated: budget"), std::string::npos) << stopped.status().message();
  EXPECT_NE(stopped.status().message().find("simulated t="), std::string::npos) << stopped.status().message();

  // simulate() checks the deadline after compiling too.
  ClusterSpec c = testing::make_cluster(2, 4, 100e9, 2, 5e9, 2e-6, 5e-6);
  c.device = cluster("dgx-h100", 1).device;
  auto whole = simulate(m, c, t, s, {}, passed);
  ASSERT_FALSE(whole.ok());
  EXPECT_EQ(whole.status().code(), StatusCode::kDeadlineExceeded) << whole.status().to_string();
}

// FluidNet's local rate recomputation (the default) against the reference (every flow at each change, as before
// session 14) on compiled MoE plans in the same run: EP all-to-alls (flat and HALO) contending with DP and pipeline
// traffic. docs/simulator.md has the measured differences (0 and 1.5e-11 here; up to 2.5e-5 on a ZeRO-1 DeepSeek-V3
// plan, where a completion lands on the other side of a tie).
TEST(PlanExecTest, LocalRatesGiveTheReferenceStepTime) {
  const ModelSpec m = model("deepseek-v2-lite");
  const ClusterSpec c = cluster("h800", 4);
  for (const char* text : {"dp=8,pp=4,ep=8,schedule=1f1b,microbatches=8",
                           "dp=16,pp=2,ep=16,schedule=dualpipev,microbatches=8,a2a=halo"}) {
    const Strategy s = strategy(text);
    TrainSpec t = train(2048);
    t.micro_batch_size = s.mbs;
    SimOptions reference;
    reference.reference_rates = true;
    auto ref = simulate(m, c, t, s, {}, reference);
    auto local = simulate(m, c, t, s);
    ASSERT_TRUE(ref.ok() && local.ok()) << text;
    EXPECT_NEAR(local->step_time_s, ref->step_time_s, 1e-9 * ref->step_time_s) << text;
    EXPECT_EQ(ref->sim.full_rate_updates, ref->sim.rate_updates) << text;
    EXPECT_LT(local->sim.full_rate_updates, local->sim.rate_updates / 2) << text;  // mostly local
  }
}

}  // namespace
}  // namespace piper::sim
