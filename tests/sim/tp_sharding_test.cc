// What a tensor-parallel rank keeps and sends in the compiled plan (ir/passes/shard.cc), checked through the
// simulator: the activations an attention/MLP chunk keeps are split over tp (its replicated input excepted
// without sequence parallelism), and a MoE layer's tokens are split over tp, so each rank dispatches and keeps
// T / tp of them. Before, every tp rank kept and sent a whole microbatch's worth (2-4x the closed form's peak).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "piper/compile/compile.h"
#include "piper/cost/estimate.h"
#include "piper/cost/vocab_parallel.h"
#include "piper/sim/simulate.h"
#include "piper/sim/task_time.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::sim {
namespace {

// Pipeline rank 0's activation peak without the backward's working set (an alloc right before a backward chunk,
// compile/memory_plan.cc), and the largest working set: its allocs and frees replayed in program order. Every alloc
// of the plans replayed is on one stream (`streams_with_allocs`; ZeRO-3's gathers are on another).
struct StashReplay {
  int64_t peak = 0, largest_working_set = 0;
  int streams_with_allocs = 0;
};
StashReplay replay_stash(const compile::Program& p) {
  StashReplay out;
  for (const auto& st : p.streams) {
    const auto& in = st.instrs;
    std::set<int> working;
    int64_t live = 0;
    bool any = false;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].op != compile::OpKind::kAlloc && in[i].op != compile::OpKind::kFree) continue;
      any = true;
      if (in[i].op == compile::OpKind::kAlloc) {
        size_t j = i + 1;
        while (j < in.size() && in[j].op == compile::OpKind::kAlloc) ++j;
        if (j < in.size() && in[j].op == compile::OpKind::kCompute && ir::is_backward(in[j].pass)) {
          working.insert(in[i].buffer);
          out.largest_working_set = std::max(out.largest_working_set, in[i].mem_delta);
          continue;
        }
      }
      if (working.count(in[i].buffer)) continue;
      live += in[i].mem_delta;
      out.peak = std::max(out.peak, live);
    }
    out.streams_with_allocs += any ? 1 : 0;
  }
  return out;
}

struct Measured {
  double sim_activations = 0;       // the activation peak on pipeline rank 0, without the backward's working set
                                    // (with ZeRO-3: the simulated peak minus static memory)
  double sim_peak_over_static = 0;  // the simulated peak minus static memory on pipeline rank 0
  double est_activations = 0;      // the closed form's activations on pipeline rank 0
  double sim_static = 0;           // parameters, gradients and optimizer state on pipeline rank 0
  double sim_ep_exposed = 0;       // rank 0's exposed EP all-to-all time
  double est_ep_exposed = 0;       // the closed form's
  std::vector<int> ep_group;       // rank 0's EP group in the compiled plan
  double est_states = 0;           // the closed form's
  int64_t dispatch_bytes = 0;      // the first EP dispatch instruction's payload
  int64_t head_dp_rs_bytes = -1;   // the head's data-parallel gradient reduce-scatter payload (-1: none)
  std::map<std::string, int> a2a;  // EP all-to-alls on pipeline rank 0 by "part.pass" (dispatch.F, combine.BW, ...)
  std::map<std::string, int> etp;  // etp collectives on pipeline rank 0 by "part.pass" (experts.etp_ag.F, ...)
  std::vector<int> etp_group;      // rank 0's etp and edp groups in the compiled plan
  std::vector<int> edp_group;
  double sim_etp_exposed = 0;  // rank 0's exposed etp time
};

Measured run(const std::string& model, const std::string& strategy) {
  Measured out;
  auto m = load_model(model);
  auto c = load_cluster("dgx-h100", 2);
  auto s = Strategy::parse(strategy);
  EXPECT_TRUE(m.ok() && c.ok() && s.ok());
  TrainSpec t;
  t.seq_len = 4096;
  auto r = simulate(*m, *c, t, *s, cost::Calibration{});
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return out;
  out.sim_peak_over_static = static_cast<double>(r->sim.ranks[0].peak_bytes - r->sim.ranks[0].static_bytes);
  const StashReplay stash = replay_stash(r->compiled.plan.templates[0]);
  out.sim_activations = out.sim_peak_over_static;  // ZeRO-3 gathers on another stream: not replayed
  if (stash.streams_with_allocs == 1) {
    out.sim_activations = static_cast<double>(stash.peak);
    // The simulated peak is the stash's plus the working set of the task running then, at most the largest.
    EXPECT_GE(out.sim_peak_over_static, out.sim_activations) << strategy;
    EXPECT_LE(out.sim_peak_over_static, out.sim_activations + static_cast<double>(stash.largest_working_set))
        << strategy;
    EXPECT_GT(stash.largest_working_set, 0) << strategy;
  }
  out.sim_static = static_cast<double>(r->sim.ranks[0].static_bytes);
  for (const auto& [group, secs] : r->sim.ranks[0].exposed_by_group_s)
    if (group == "ep") out.sim_ep_exposed = secs;
  if (auto g = r->compiled.plan.group_ranks(0, "ep"); g.ok()) out.ep_group = *g;
  if (auto g = r->compiled.plan.group_ranks(0, "etp"); g.ok()) out.etp_group = *g;
  if (auto g = r->compiled.plan.group_ranks(0, "edp"); g.ok()) out.edp_group = *g;
  for (const auto& [group, secs] : r->sim.ranks[0].exposed_by_group_s)
    if (group == "etp") out.sim_etp_exposed = secs;
  for (const auto& st : r->compiled.plan.templates[0].streams)
    for (const auto& in : st.instrs) {
      if (in.op == compile::OpKind::kCollective && in.group == "dp" && in.label.rfind("head.", 0) == 0 &&
          in.comm == ir::NodeKind::kReduceScatter)
        out.head_dp_rs_bytes = in.comm_bytes;
      if (in.op == compile::OpKind::kCollective && in.group == "etp") {
        const std::string rest = in.label.substr(in.label.find('.') + 1);
        ++out.etp[rest.substr(0, rest.rfind(".mb"))];
      }
      if (in.comm == ir::NodeKind::kAllToAll) {
        if (out.dispatch_bytes == 0) out.dispatch_bytes = in.comm_bytes;
        // Names are L<layer>.<part>.<pass>.mb<m>: keep "<part>.<pass>".
        const std::string rest = in.label.substr(in.label.find('.') + 1);
        ++out.a2a[rest.substr(0, rest.rfind(".mb"))];
      }
    }
  t.micro_batch_size = s->mbs;
  auto cm = cost::CostModel::create(*m, *c, t, cost::Calibration{});
  EXPECT_TRUE(cm.ok());
  auto e = cm->estimate(*s);
  EXPECT_TRUE(e.ok());
  if (e.ok()) {
    out.est_activations = e->ranks[0].activations;  // pipeline rank 0, as sim_activations
    out.est_states = e->memory.params + e->memory.grads + e->memory.optimizer;
    out.est_ep_exposed = e->comm.ep_s;
  }
  return out;
}

TEST(TpShardingTest, KeptActivationsScaleWithTpLikeTheClosedForm) {
  const char* rest = ",pp=2,mbs=1,microbatches=8,recompute=none,schedule=1f1b";
  Measured tp1 = run("gpt-7.5b", std::string("dp=8,tp=1") + rest);
  Measured tp2 = run("gpt-7.5b", std::string("dp=4,tp=2,sp=0") + rest);
  Measured tp2sp = run("gpt-7.5b", std::string("dp=4,tp=2,sp=1") + rest);
  Measured tp4sp = run("gpt-7.5b", std::string("dp=2,tp=4,sp=1") + rest);
  // Sequence parallel: exactly 1/tp (up to rounding of each buffer).
  EXPECT_NEAR(tp2sp.sim_activations / tp1.sim_activations, 0.5, 0.01);
  EXPECT_NEAR(tp4sp.sim_activations / tp1.sim_activations, 0.25, 0.01);
  // Without it the chunk inputs stay whole: more than 1/tp, less than all.
  EXPECT_GT(tp2.sim_activations, tp2sp.sim_activations * 1.05);
  EXPECT_LT(tp2.sim_activations, tp1.sim_activations * 0.7);
  // The plan's chunks keep the closed form's own per-token terms (spec/activation_counting.h), the replicated
  // part whole without sequence parallelism: the two agree (the ratio was 1.3 at tp=1 and 5.3 at tp=4 before the
  // tp fix, and 0.65-0.88 while the plan had its own coarser sizes).
  for (const Measured* r : {&tp1, &tp2, &tp2sp, &tp4sp}) {
    EXPECT_NEAR(r->sim_activations / r->est_activations, 1.0, 1e-3);
  }
}

// The simulator's memory comes from the plan's alloc/free; the closed form counts in-flight microbatches times
// per-token terms. Both use one formula and one layer partition, so pipeline rank 0's activations agree for
// dense and MoE layers, with and without tp, under 1f1b and interleaving, for no, selective (the attention chunk
// re-run from its input) and full recomputation (every chunk's input kept; the one chunk re-materialised at a
// time is among the plan's activations and among the closed form's buffers, hence the wider tolerance).
// Before, the plan had its own coarser sizes: Qwen3-235B TP2 PP8 EP32 (row F of moe_fidelity_test) kept 38 GB
// simulated against 62 GB in closed form.
TEST(TpShardingTest, SimulatedActivationsEqualTheClosedForm) {
  struct Case {
    const char* model;
    const char* strategy;
    double tolerance;
  };
  const Case cases[] = {
      {"gpt-7.5b", "dp=8,tp=1,pp=2,mbs=1,microbatches=8,recompute=none,schedule=1f1b", 1e-3},
      {"gpt-7.5b", "dp=8,tp=1,pp=2,mbs=1,microbatches=8,recompute=selective,schedule=1f1b", 1e-3},
      {"gpt-7.5b", "dp=4,tp=2,sp=1,pp=2,mbs=1,microbatches=8,recompute=full,schedule=1f1b", 0.2},
      {"gpt-7.5b", "dp=4,tp=2,sp=1,pp=2,vpp=2,mbs=1,microbatches=8,recompute=none,schedule=interleaved", 1e-3},
      {"qwen3-30b-a3b", "dp=4,tp=2,sp=1,pp=2,ep=4,mbs=1,microbatches=8,recompute=none,schedule=1f1b", 1e-3},
      {"qwen3-30b-a3b", "dp=4,tp=2,sp=1,pp=2,ep=4,mbs=1,microbatches=8,recompute=selective,schedule=1f1b", 1e-3},
      // Expert tensor parallelism: the experts keep the rows their etp group gathered.
      {"qwen3-30b-a3b", "dp=4,tp=2,sp=1,pp=2,ep=4,etp=2,mbs=1,microbatches=8,recompute=none,schedule=1f1b", 1e-3},
      {"qwen3-30b-a3b", "dp=8,tp=1,pp=2,ep=8,mbs=1,microbatches=8,recompute=full,schedule=1f1b", 0.2},
      {"qwen3-30b-a3b",
       "dp=4,tp=2,sp=1,pp=2,ep=4,mbs=1,microbatches=8,recompute=none,recompute_modules=layernorm+moe_act,"
       "schedule=1f1b",
       1e-3},
      {"qwen3-30b-a3b",
       "dp=8,tp=1,pp=2,ep=8,mbs=1,microbatches=8,recompute=selective,recompute_modules=moe_act,schedule=1f1b", 1e-3},
  };
  for (const Case& c : cases) {
    Measured r = run(c.model, c.strategy);
    ASSERT_GT(r.est_activations, 0) << c.strategy;
    std::printf("%-14s %-90s simulated %.3f GB, closed form %.3f GB\n", c.model, c.strategy, r.sim_activations / 1e9,
                r.est_activations / 1e9);
    EXPECT_NEAR(r.sim_activations / r.est_activations, 1.0, c.tolerance) << c.model << " " << c.strategy;
  }
}

// Megatron's module recomputation drops, per token of a MoE layer on a tp rank, the pre-MLP norm output (h) and
// the routed experts' activation output (k times the expert width): both models shrink by exactly that, times
// the microbatches in flight on pipeline rank 0 and its layers.
TEST(TpShardingTest, RecomputeModulesDropTheNormAndActivationOutputs) {
  auto m = load_model("qwen3-30b-a3b");
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::string rest = ",pp=2,ep=4,mbs=1,microbatches=8,schedule=1f1b,recompute=none";
  const std::string par = "dp=4,tp=2,sp=1";
  Measured base = run("qwen3-30b-a3b", par + rest);
  Measured norm = run("qwen3-30b-a3b", par + rest + ",recompute_modules=layernorm");
  Measured both = run("qwen3-30b-a3b", par + rest + ",recompute_modules=layernorm+moe_act");
  // Pipeline rank 0 of 1f1b holds pp = 2 microbatches of its 24 layers (48 on 2 stages), seq 4096, bf16.
  const double tokens = 2.0 * 24 * 4096 / 2;  // per tp rank (sequence parallel)
  const double h = static_cast<double>(m->hidden_size);
  const double act = static_cast<double>(m->moe.top_k) * static_cast<double>(m->moe.expert_intermediate_size);
  EXPECT_NEAR(base.est_activations - norm.est_activations, tokens * 2 * h, 1e-6 * base.est_activations);
  EXPECT_NEAR(norm.est_activations - both.est_activations, tokens * 2 * act, 1e-6 * base.est_activations);
  EXPECT_NEAR(base.sim_activations - norm.sim_activations, tokens * 2 * h, 1e-3 * base.sim_activations);
  EXPECT_NEAR(norm.sim_activations - both.sim_activations, tokens * 2 * act, 1e-3 * base.sim_activations);
}

TEST(TpShardingTest, MoeTokensAreSplitOverTp) {
  const char* rest = ",pp=1,ep=4,mbs=1,microbatches=2,recompute=none,schedule=1f1b,a2a=flat";
  Measured tp1 = run("qwen3-30b-a3b", std::string("dp=16,tp=1") + rest);
  Measured tp2 = run("qwen3-30b-a3b", std::string("dp=8,tp=2,sp=1") + rest);
  ASSERT_GT(tp1.dispatch_bytes, 0);
  EXPECT_NEAR(static_cast<double>(tp2.dispatch_bytes) / static_cast<double>(tp1.dispatch_bytes), 0.5, 1e-6);
}

// Every MoE layer and microbatch exchanges twice per pass: dispatch + combine forward, their gradients backward.
// Under tp the neighbouring attention chunks are tensor parallel, so the experts' outputs reach the next layer
// through a tp collective; the ep shard pass used to see only chunk-to-chunk edges and dropped the combine
// (forward) and its gradient (backward): the plan carried half the closed form's EP traffic (Qwen3-235B, tp=4,
// pp=8: 6.2 s of exposed EP time simulated against 12.8 s in the closed form; 12.7 s now).
TEST(TpShardingTest, EveryMoeLayerDispatchesAndCombinesUnderTp) {
  const char* rest = ",pp=1,ep=4,mbs=1,microbatches=2,recompute=none,schedule=1f1b,a2a=flat";
  auto m = load_model("qwen3-30b-a3b");
  ASSERT_TRUE(m.ok());
  const int per_pass = m->num_layers * 2;  // layers x microbatches on the one pipeline rank
  for (const char* par : {"dp=16,tp=1", "dp=8,tp=2,sp=1", "dp=4,tp=4,sp=1"}) {
    Measured r = run("qwen3-30b-a3b", std::string(par) + rest);
    EXPECT_EQ(r.a2a["dispatch.F"], per_pass) << par;
    EXPECT_EQ(r.a2a["combine.F"], per_pass) << par;
    EXPECT_EQ(r.a2a["dispatch.BW"], per_pass) << par;
    EXPECT_EQ(r.a2a["combine.BW"], per_pass) << par;
    EXPECT_EQ(r.a2a.size(), 4u) << par;
  }
}

// Under tp every tensor rank keeps whole experts (etp = 1) and routes its own T / tp tokens, so the experts are
// replicated over dp / ep x tp ranks: their gradients are reduced, and ZeRO shards their state, over all of them
// (MeshInfo::expert_replicas, the closed form's expert shard). The plan used only the dp / ep ranks of one tp
// coordinate: with ep == dp the experts were not sharded at all (Qwen3-235B tp=4 pp=8 ep=8: 101 GB simulated
// peak against the closed form's 67; Megatron ran it on 80 GB GPUs).
TEST(TpShardingTest, ExpertStateIsShardedOverTpTimesExpertDataParallel) {
  const char* rest = ",pp=1,mbs=1,microbatches=2,recompute=full,schedule=1f1b";
  for (const char* par : {"dp=16,tp=1,ep=8,zero=1", "dp=8,tp=2,sp=1,ep=8,zero=1", "dp=8,tp=2,sp=1,ep=4,zero=1",
                          "dp=8,tp=2,sp=1,ep=4,zero=3"}) {
    Measured r = run("qwen3-30b-a3b", std::string(par) + rest);
    ASSERT_GT(r.est_states, 0) << par;
    EXPECT_NEAR(r.sim_static / r.est_states, 1.0, 0.05) << par;
  }
}

// MoE parallel folding (fold=1, Megatron's expert mesh): the expert groups are ep consecutive ranks of the stage's
// tp*dp, so with tp = 2 an EP group of 8 is one NVLink node instead of 8 dp ranks at stride 2 over two nodes; the
// simulator and the closed form both price the all-to-all accordingly, and folding lets ep exceed dp with the
// experts' state sharded as the closed form shards it.
TEST(TpShardingTest, FoldedExpertGroupsStayInsideANode) {
  const char* rest = ",pp=1,mbs=1,microbatches=2,recompute=full,schedule=1f1b,zero=1";
  Measured strided = run("qwen3-30b-a3b", std::string("dp=8,tp=2,sp=1,ep=8") + rest);
  Measured folded = run("qwen3-30b-a3b", std::string("dp=8,tp=2,sp=1,ep=8,fold=1") + rest);
  EXPECT_EQ(strided.ep_group, (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  std::vector<int> node0(8);
  std::iota(node0.begin(), node0.end(), 0);
  EXPECT_EQ(folded.ep_group, node0);
  // In one node the all-to-all runs on NVLink (370 GB/s) instead of half over 50 GB/s NICs.
  ASSERT_GT(strided.sim_ep_exposed, 0);
  ASSERT_GT(strided.est_ep_exposed, 0);
  EXPECT_LT(folded.sim_ep_exposed, 0.5 * strided.sim_ep_exposed);
  EXPECT_LT(folded.est_ep_exposed, 0.5 * strided.est_ep_exposed);
  // ep = 16 > dp = 8: each rank holds 8 of the 128 experts instead of 16, one EP group over both nodes. The state
  // this saves is the closed form's to 1 %, and so are the totals.
  Measured wide = run("qwen3-30b-a3b", std::string("dp=8,tp=2,sp=1,ep=16,fold=1") + rest);
  EXPECT_EQ(wide.ep_group.size(), 16u);
  ASSERT_GT(folded.est_states - wide.est_states, 0);
  EXPECT_NEAR((folded.sim_static - wide.sim_static) / (folded.est_states - wide.est_states), 1.0, 0.01);
  EXPECT_NEAR(wide.sim_static / wide.est_states, 1.0, 0.01);
}

// Expert tensor parallelism (etp = 2, Megatron's --expert-tensor-parallel-size): the plan slices every expert over
// the two tensor ranks of a replica (its etp group), all-gathers the rows their dispatches received before the
// experts and reduce-scatters the partial outputs after, forward and backward, as real collectives the simulator
// prices; the experts' state is 1/etp per rank and reduced over dp*tp/(ep*etp) ranks, as the closed form counts.
TEST(TpShardingTest, ExpertTensorParallelismSlicesExpertsInThePlan) {
  const char* rest = ",pp=1,mbs=1,microbatches=2,recompute=full,schedule=1f1b,zero=1";
  auto m = load_model("qwen3-30b-a3b");
  ASSERT_TRUE(m.ok());
  const int per_pass = m->num_layers * 2;  // layers x microbatches on the one pipeline rank
  Measured whole = run("qwen3-30b-a3b", std::string("dp=8,tp=2,sp=1,ep=4") + rest);
  Measured sliced = run("qwen3-30b-a3b", std::string("dp=8,tp=2,sp=1,ep=4,etp=2") + rest);
  EXPECT_TRUE(whole.etp.empty());
  EXPECT_EQ(sliced.etp["experts.etp_ag.F"], per_pass);
  EXPECT_EQ(sliced.etp["experts.etp_rs.F"], per_pass);
  EXPECT_EQ(sliced.etp["experts.etp_ag.BW"], per_pass);
  EXPECT_EQ(sliced.etp["experts.etp_rs.BW"], per_pass);
  EXPECT_EQ(sliced.etp.size(), 4u);
  EXPECT_EQ(sliced.a2a, whole.a2a);  // the same all-to-alls, outside the etp exchanges
  EXPECT_EQ(sliced.etp_group, (std::vector<int>{0, 1}));
  EXPECT_EQ(whole.edp_group.size(), 4u);                  // dp*tp/ep
  EXPECT_EQ(sliced.edp_group, (std::vector<int>{0, 8}));  // dp*tp/(ep*etp): same expert shard and slice
  EXPECT_GT(sliced.sim_etp_exposed, 0);
  EXPECT_LT(sliced.sim_static, 0.75 * whole.sim_static);  // the experts are most of the state
  EXPECT_NEAR(sliced.sim_static / sliced.est_states, 1.0, 0.05);
}

// Vocabulary parallelism (strategy_directives): the embedding and the head are split over tp, as Megatron's
// VocabParallelEmbedding and column-parallel output layer are and as the closed form counts them. Before, every
// tp rank kept the whole embedding and head with their gradients and optimizer state: Qwen3-30B-A3B's plan state
// was 2.3 GB (tp = 2) and 4.2 GB (tp = 4) above the closed form's, and the data-parallel reduce-scatter of those
// gradients carried tp times the bytes. Each rank's data-parallel traffic for the head is now its 1/tp share.
TEST(TpShardingTest, EmbeddingAndHeadAreSplitOverTpLikeTheClosedForm) {
  const char* rest = ",pp=1,mbs=1,microbatches=2,recompute=full,schedule=1f1b";
  const std::pair<const char*, const char*> cases[] = {{"qwen3-30b-a3b", "dp=8,tp=2,sp=1,ep=8,zero=1"},
                                                       {"qwen3-30b-a3b", "dp=4,tp=4,sp=1,ep=4,zero=1"},
                                                       {"gpt-7.5b", "dp=4,tp=4,zero=0"}};
  for (const auto& [model, par] : cases) {
    Measured r = run(model, std::string(par) + rest);
    ASSERT_GT(r.est_states, 0) << model << " " << par;
    EXPECT_NEAR(r.sim_static / r.est_states, 1.0, 0.01) << model << " " << par;
  }
  auto m = load_model("qwen3-30b-a3b");
  ASSERT_TRUE(m.ok());
  for (int tp : {1, 2, 4}) {
    Measured r = run("qwen3-30b-a3b", "dp=" + std::to_string(16 / tp) + ",tp=" + std::to_string(tp) +
                                          (tp > 1 ? ",sp=1" : "") + ",ep=4,zero=1" + rest);
    // The head chunk: vocab x hidden weights and the final norm's hidden weights, fp32 gradients. The chunk's
    // parameters are divided over tp as a whole, so the norm (replicated in Megatron) is too: h (1 - 1/tp) too
    // few, 0.001 % of the head.
    const int64_t head = (m->vocab_size * m->hidden_size + m->hidden_size) / tp;
    EXPECT_EQ(r.head_dp_rs_bytes, head * 4) << "tp=" << tp;
  }
}

}  // namespace
}  // namespace piper::sim

namespace piper::sim {
namespace {

// A head split over tp exchanges its cross-entropy statistics (3 floats per token, all-gathered over tp) in its F:
// the simulator adds that exchange to the head F's task time (cost/vocab_parallel.h), once per F and not in B.
TEST(TpShardingTest, SplitHeadForwardPaysTheCrossEntropyExchange) {
  auto m = load_model("gpt-7.5b");
  auto c = load_cluster("dgx-h100", 2);
  auto s = Strategy::parse("dp=4,tp=4,sp=1,pp=1,mbs=1,microbatches=2");
  ASSERT_TRUE(m.ok() && c.ok() && s.ok());
  TrainSpec t;
  t.seq_len = 4096;
  t.micro_batch_size = 1;
  t.global_batch = s->global_batch();
  auto cm = cost::CostModel::create(*m, *c, t, cost::Calibration{});
  ASSERT_TRUE(cm.ok()) << cm.status().message();
  auto task = cost_task_time(*cm, *s);
  auto compiled = compile::compile_strategy(*m, t, *s);
  ASSERT_TRUE(task.ok() && compiled.ok());
  const double exchange_s = cost::vocab_stats_exchange_s(*cm, *s, 4096);
  EXPECT_GT(exchange_s, 0.0);
  const compile::Program& program = compiled->plan.templates[0];
  int heads = 0;
  for (const compile::Stream& st : program.streams) {
    for (const compile::Instruction& in : st.instrs) {
      if (in.op != compile::OpKind::kCompute || in.part != Part::kHead) continue;
      ASSERT_EQ(in.shard_axis, "tp") << in.label;
      compile::Instruction whole = in;
      whole.shard_axis.clear();
      const double split_s = (*task)(program, in), whole_s = (*task)(program, whole);
      const double want = in.pass == ir::Pass::kF ? exchange_s : 0.0;
      EXPECT_NEAR(split_s - whole_s, want, 1e-9 * whole_s) << in.label;
      if (in.pass == ir::Pass::kF) {
        ++heads;
        // Small next to the head's own GEMM (vocabulary 51,200 over tp=4, hidden 4096, 4096 tokens).
        EXPECT_LT(exchange_s, 0.05 * whole_s) << in.label;
        std::printf("%s: head F %.1f us, statistics exchange %.1f us\n", in.label.c_str(), whole_s * 1e6,
                    exchange_s * 1e6);
      }
    }
  }
  EXPECT_EQ(heads, 2);  // one per microbatch
}

}  // namespace
}  // namespace piper::sim
