// The closed-form estimate on presets: placement of layers and parameters on pipeline ranks, ZeRO groups,
// schedule and recompute effects, FLOP consistency with docs/counting.md, and errors instead of numbers.
#include "piper/cost/estimate.h"

#include <gtest/gtest.h>

#include "piper/spec/cluster_loader.h"
#include "piper/spec/counting.h"
#include "piper/spec/model_loader.h"

namespace piper::cost {
namespace {

CostModel make(const char* model, const char* cluster, int nodes, int64_t seq = 4096, int64_t global_batch = 0) {
  auto m = load_model(model);
  auto c = load_cluster(cluster, nodes);
  EXPECT_TRUE(m.ok() && c.ok());
  TrainSpec t;
  t.seq_len = seq;
  t.global_batch = global_batch;
  auto cm = CostModel::create(*m, *c, t);
  EXPECT_TRUE(cm.ok()) << cm.status().to_string();
  return *cm;
}

Estimate run(const CostModel& cm, const std::string& strategy) {
  auto s = Strategy::parse(strategy);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  auto e = cm.estimate(*s);
  EXPECT_TRUE(e.ok()) << strategy << ": " << e.status().to_string();
  return e.ok() ? *e : Estimate{};
}

constexpr const char* kDeepSeek = "dp=128,pp=16,ep=64,zero=1,schedule=dualpipev,microbatches=120,recompute=full";

// DeepSeek-V3 on 2048 H800s (DeepSeek-V3 technical report: 16-way PP, 64-way EP over 8 nodes, ZeRO-1 DP,
// DualPipe). Pipeline rank 1 holds stages 1 and 30 of 32; 61 layers cut as the compiler cuts them (the first 29
// stages take 2 layers, stage_layers()): layers 2 (dense) and 3 (MoE), and 59 (MoE).
TEST(EstimateTest, DeepSeekV3RankPlacement) {
  CostModel cm = make("deepseek-v3", "h800", 256);
  Estimate e = run(cm, kDeepSeek);
  ASSERT_EQ(e.ranks.size(), 16u);
  const ModelSpec& m = cm.model();
  const double layer = attention_params(m) + 2.0 * norm_params(m);
  const double dense = 3 * layer + 1.0 * dense_mlp_params(m) + 2.0 * (router_params(m) + shared_experts_params(m));
  const double experts = 2.0 * (256 / 64) * expert_params(m);
  // bf16 parameters and fp32 gradients are whole; master + Adam (12 B) shard over dp = 128 for the dense part
  // and over edp = dp/ep = 2 for the experts (the only ranks that hold the same experts).
  EXPECT_DOUBLE_EQ(e.ranks[1].params, 2 * (dense + experts));
  EXPECT_DOUBLE_EQ(e.ranks[1].grads, 4 * (dense + experts));
  EXPECT_NEAR(e.ranks[1].optimizer, 12 * dense / 128 + 12 * experts / 2, 1);
  // Rank 0 holds the embedding (stage 0) and the head (stage 31) on the V: the most parameters.
  EXPECT_GT(e.ranks[0].params, e.ranks[1].params);
  EXPECT_TRUE(e.fits) << e.memory.total() / 1e9 << " GB";
  EXPECT_LT(e.memory.total(), 80e9);
  EXPECT_GT(e.memory.total(), 20e9);
  // DualPipeV keeps the same 2p+1 half-stage units on every rank.
  EXPECT_GT(e.ranks[0].activations, 0);
  EXPECT_GT(e.mfu, 0.1);
  EXPECT_LT(e.mfu, 0.7);
}

// Calibration::expert_load_imbalance prices the busiest ep rank's memory as its time: tiny-moe on dgx-h100 (bf16
// activations), dp=8,ep=4, one microbatch of 2 x 128 tokens, 3 MoE layers. At load L the
// routed experts' stash (2kh + 3k f_e per token, k = 2, h = 128, f_e = 256, 2-byte) and the all-to-all staging of
// the dispatched rows (k h dispatch bytes per token) grow by (L - 1) x; nothing else changes.
TEST(EstimateTest, BusiestExpertRankHoldsItsLoadOfRoutedRows) {
  auto m = load_model("tiny-moe");
  auto c = load_cluster("dgx-h100", 1);
  ASSERT_TRUE(m.ok() && c.ok());
  TrainSpec t;
  t.seq_len = 128;
  t.micro_batch_size = 2;
  Calibration busiest;
  busiest.expert_load_imbalance = 3;
  const CostModel flat = CostModel::create(*m, *c, t).value();
  const CostModel loaded = CostModel::create(*m, *c, t, busiest).value();
  const std::string s = "dp=8,ep=4,microbatches=1,mbs=2";
  const Estimate a = run(flat, s), b = run(loaded, s);
  const double tokens = 2 * 128, k = 2, h = 128, fe = 256, moe_layers = 3;
  const double stash = 2 * (2 * k * h + 3 * k * fe);
  EXPECT_NEAR(b.memory.activations - a.memory.activations, 2 * tokens * moe_layers * stash, 1e-6);
  // The all-to-all staging of the dispatched rows and the experts' backward working set (under ep: dyp, dxp,
  // the returned rows and the gate/up gradients of each routed row, 2-byte activations) grow with the load.
  const double working_set_row = 2 * (3 * h + 2 * fe);
  EXPECT_NEAR(b.memory.buffers - a.memory.buffers,
              2 * tokens * k * flat.dispatch_bytes_per_token() + 2 * tokens * k * working_set_row, 1e-6);
  EXPECT_DOUBLE_EQ(b.memory.params + b.memory.grads + b.memory.optimizer,
                   a.memory.params + a.memory.grads + a.memory.optimizer);
}

// Expert parameters replicate over edp = dp/ep, not dp: with ep = dp the experts' optimizer state is not
// sharded at all, and raising ep shrinks the expert share of each rank.
TEST(EstimateTest, ExpertsShardOverExpertDataParallel) {
  CostModel cm = make("mixtral-8x7b", "dgx-h100", 8);
  Estimate ep1 = run(cm, "dp=16,pp=4,zero=1,microbatches=16");
  Estimate ep8 = run(cm, "dp=16,pp=4,ep=8,zero=1,microbatches=16");
  EXPECT_NEAR(ep1.ranks[1].params / ep8.ranks[1].params, 1.0 + 0.0, 8.0);  // sanity: same order
  EXPECT_GT(ep1.ranks[1].params, 4 * ep8.ranks[1].params);
  // Mixtral's experts are ~96 % of its parameters: params shrink ~8x minus the attention part.
  const ModelSpec& m = cm.model();
  const double layer_dense = attention_params(m) + 2.0 * norm_params(m) + router_params(m);
  const double per_layer_experts = 8.0 * expert_params(m);
  const int layers = 8;  // 32 layers over pp = 4
  EXPECT_DOUBLE_EQ(ep8.ranks[1].params, 2 * layers * (layer_dense + per_layer_experts / 8));
  EXPECT_NEAR(ep8.ranks[1].optimizer, 12 * layers * (layer_dense / 16 + per_layer_experts / 8 / 2), 1);
}

TEST(EstimateTest, ScheduleAndRecomputeEffects) {
  CostModel cm = make("mixtral-8x7b", "dgx-h100", 8);
  Estimate f1b = run(cm, "dp=16,pp=4,ep=8,zero=1,microbatches=16");
  Estimate gpipe = run(cm, "dp=16,pp=4,ep=8,zero=1,microbatches=16,schedule=gpipe");
  Estimate zb = run(cm, "dp=16,pp=4,ep=8,zero=1,microbatches=16,schedule=zb-h1");
  Estimate inter = run(cm, "dp=16,pp=4,vpp=2,ep=8,zero=1,microbatches=16,schedule=interleaved");
  // GPipe keeps all 16 microbatches, 1F1B rank 0 keeps 4 (Narayanan et al.).
  EXPECT_NEAR(gpipe.ranks[1].activations / f1b.ranks[1].activations, 16.0 / 3, 1e-9);
  EXPECT_GT(f1b.ranks[0].activations, f1b.ranks[3].activations);
  EXPECT_LT(zb.time.bubble_s, f1b.time.bubble_s);
  EXPECT_LT(inter.time.bubble_s, f1b.time.bubble_s);
  EXPECT_GT(inter.ranks[0].activations, f1b.ranks[0].activations);  // (1 + (p-1)/(p v)) more
  Estimate full = run(cm, "dp=16,pp=4,ep=8,zero=1,microbatches=16,recompute=full");
  Estimate sel = run(cm, "dp=16,pp=4,ep=8,zero=1,microbatches=16,recompute=selective");
  EXPECT_LT(full.memory.activations, sel.memory.activations);
  EXPECT_LE(sel.memory.activations, f1b.memory.activations);
  EXPECT_GT(full.time.compute_s, f1b.time.compute_s);  // the forward runs twice
  // ZeRO-3 shards parameters too.
  Estimate z3 = run(cm, "dp=16,pp=4,ep=8,zero=3,microbatches=16");
  EXPECT_LT(z3.memory.params, f1b.memory.params);
  // HALO moves fewer bytes than flat across nodes.
  CostModel qwen = make("qwen3-30b-a3b", "dgx-h100", 8);
  Estimate flat = run(qwen, "dp=64,ep=32,zero=1,microbatches=2");
  Estimate halo = run(qwen, "dp=64,ep=32,zero=1,microbatches=2,a2a=halo");
  EXPECT_GT(flat.comm.ep_s, 0);
  EXPECT_LT(halo.comm.ep_s, flat.comm.ep_s);
}

// ZeRO-3 gathers each parameter chunk before its F and again before its B and reduce-scatters it after its W,
// one ring per chunk and microbatch, each paying (n-1) alpha (docs/resource_model.md "ZeRO-3"). With a 1 s NIC
// latency the rings dwarf compute and bandwidth, so the exposed DP time counts the collectives: GPT-1.7B on one
// pipeline rank has the embedding (tied with the head: the head chunk has no parameters of its own) and 24 x
// (attention, MLP) chunks = 49, so 3 x 49 = 147 rings of 31 hops per microbatch over dp = 32 on 4 nodes.
TEST(EstimateTest, ZeRO2And3PayTheRingLatencyPerChunkAndMicrobatch) {
  auto m = load_model("gpt-1.7b");
  auto c = load_cluster("dgx-h100", 4);
  ASSERT_TRUE(m.ok() && c.ok());
  ASSERT_TRUE(m->tie_embeddings);
  c->node.nic_latency_s = 1.0;
  TrainSpec t;
  t.seq_len = 4096;
  auto cm = CostModel::create(*m, *c, t);
  ASSERT_TRUE(cm.ok()) << cm.status().to_string();
  Estimate z3 = run(*cm, "dp=32,zero=3,microbatches=2");
  EXPECT_NEAR(z3.comm.dp_s / (2 * 31 * 1.0), 147, 0.5);
  // ZeRO-2: a reduce-scatter per chunk and microbatch (49 rings), one all-gather of the updated shard per step.
  Estimate z2 = run(*cm, "dp=32,zero=2,microbatches=2");
  EXPECT_NEAR((z2.comm.dp_s - 31) / (2 * 31 * 1.0), 49, 0.5);
  // ZeRO-1: one reduce-scatter and one all-gather of all the rank's parameters per step.
  Estimate z1 = run(*cm, "dp=32,zero=1,microbatches=2");
  EXPECT_NEAR(z1.comm.dp_s / 31, 2, 0.01);
}

// Module recomputation re-runs pointwise kernels before the backward: the router part's B reads and writes the
// pre-MLP norm once more (2h per token on its T / tp tokens), the experts part's B the activation function (read
// 2f, write f per routed pair); nothing else moves, and no FLOPs are added.
TEST(EstimateTest, RecomputeModulesAddTheirForwardPointwiseToTheBackward) {
  auto m = load_model("qwen3-30b-a3b");
  ASSERT_TRUE(m.ok());
  PartTable t = make_part_table(*m, 4096);
  PartShape base;
  base.tokens = 4096;
  base.tp = 2;
  base.ep = 4;
  base.sp = true;
  PartShape mod = base;
  mod.recompute_moe_norm = true;
  mod.recompute_moe_act = true;
  const double h = static_cast<double>(m->hidden_size);
  const double pairs = 4096.0 / 2 * m->moe.top_k;
  const double f = static_cast<double>(m->moe.expert_intermediate_size);
  const PartCost r0 = part_cost(t, Part::kRouter, base), r1 = part_cost(t, Part::kRouter, mod);
  const PartCost e0 = part_cost(t, Part::kExperts, base), e1 = part_cost(t, Part::kExperts, mod);
  EXPECT_DOUBLE_EQ(r1.b.pointwise_bytes - r0.b.pointwise_bytes, 4096.0 / 2 * 2 * h * 2);
  EXPECT_DOUBLE_EQ(e1.b.pointwise_bytes - e0.b.pointwise_bytes, pairs * 3 * f * 2);
  for (const auto& [a, b] : {std::pair{r0, r1}, std::pair{e0, e1}}) {
    EXPECT_EQ(a.f.pointwise_bytes, b.f.pointwise_bytes);
    EXPECT_EQ(a.b.flops, b.b.flops);
    EXPECT_EQ(a.w.pointwise_bytes, b.w.pointwise_bytes);
  }
  const PartCost a0 = part_cost(t, Part::kAttention, base), a1 = part_cost(t, Part::kAttention, mod);
  EXPECT_EQ(a0.b.pointwise_bytes, a1.b.pointwise_bytes);
}

// F + B + W of every part, summed over the layers, is 3x the forward FLOPs docs/counting.md defines.
TEST(EstimateTest, FlopsMatchCounting) {
  for (const char* name : {"deepseek-v3", "mixtral-8x7b", "gpt-oss-120b", "qwen3-30b-a3b"}) {
    auto m = load_model(name);
    ASSERT_TRUE(m.ok());
    const int64_t seq = 4096;
    PartTable t = make_part_table(*m, seq);
    PartShape s;
    s.tokens = 1;
    double sum = 0;
    auto add = [&](Part p, double count) {
      PartCost c = part_cost(t, p, s);
      sum += count * (c.f.flops + c.b.flops + c.w.flops);
    };
    add(Part::kAttention, m->num_layers);
    add(Part::kAttentionCore, m->num_layers);
    add(Part::kRouter, m->num_moe_layers());
    add(Part::kExperts, m->num_moe_layers());
    add(Part::kSharedExperts, m->num_moe_layers());
    add(Part::kDenseMlp, m->num_dense_layers());
    add(Part::kHead, 1);
    // Model FLOPs (3x forward) plus what fused attention executes beyond them: its backward recomputes Q K^T,
    // half a forward of the attention core per layer.
    const double recomputed_scores = 0.5 * t.attention_core_flops * m->num_layers;
    EXPECT_NEAR(sum / (training_flops_per_token(*m, seq) + recomputed_scores), 1.0, 2e-3) << name;
    EXPECT_GT(sum / training_flops_per_token(*m, seq), 1.0 + 1e-3) << name;
  }
}

// Bad strategies give the rule and a fix, never a number.
TEST(EstimateTest, BadStrategiesAreErrors) {
  CostModel cm = make("deepseek-v3", "h800", 256, 4096, 15360);
  struct Row {
    const char* strategy;
    const char* needle;
  };
  const Row rows[] = {
      {"dp=64,pp=16,ep=64,schedule=dualpipev,microbatches=120", "world 2048 != dp*tp*pp = 1024; set dp=128"},
      {"dp=128,pp=16,ep=48,schedule=dualpipev,microbatches=120", "ep=48 does not divide dp=128"},
      {"dp=128,pp=16,ep=64,schedule=dualpipev,microbatches=100", "set microbatches=120"},
      {"dp=128,pp=16,ep=64,schedule=dualpipev,microbatches=16", "dualpipev needs microbatches >= 2*pp = 32"},
      {"dp=64,pp=32,ep=64,schedule=dualpipev,microbatches=240", "pp*2 (dualpipev)=64 > num_layers=61"},
      // The compiler's af-pipe rules (every FFN pipeline rank on dp*tp ranks), not a division by zero.
      {"dp=6,pp=2,tp=2,ep=2,sp=1,schedule=af-pipe,disagg=1,attn_ranks=24,ffn_ranks=2024,microbatches=2560",
       "every FFN pipeline rank runs on dp*tp = 12 ranks, so ffn_ranks=2024 must be a multiple of it"},
      {"dp=20,ep=4,schedule=af-pipe,disagg=1,attn_ranks=20,ffn_ranks=2028,microbatches=768",
       "ffn_ranks=2028 must be a multiple of it"},
      {"dp=4,pp=4,tp=2,ep=4,sp=1,schedule=af-pipe,disagg=1,attn_ranks=32,ffn_ranks=2010,microbatches=3840",
       "ffn_ranks=2010 is not a multiple of ep = 4"},
  };
  for (const auto& row : rows) {
    auto s = Strategy::parse(row.strategy);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    auto e = cm.estimate(*s);
    ASSERT_FALSE(e.ok()) << row.strategy;
    EXPECT_NE(e.status().message().find(row.needle), std::string::npos) << e.status().message();
  }
}

TEST(EstimateTest, JsonHasTheDocumentedFields) {
  CostModel cm = make("tiny-moe", "local-cpu", 1);
  auto s = Strategy::parse("dp=2,ep=2,microbatches=2");
  ASSERT_TRUE(s.ok());
  auto e = cm.estimate(*s);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Json j = e->to_json();
  for (const char* key : {"fits", "step_time_s", "mfu", "tokens_per_s", "memory", "ranks", "time"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* key : {"params", "grads", "optimizer", "activations", "buffers", "total"}) {
    EXPECT_TRUE(j["memory"].contains(key)) << key;
  }
  for (const char* key : {"compute", "exposed_comm", "bubble", "optimizer"}) EXPECT_TRUE(j["time"].contains(key));
  EXPECT_GT(j["step_time_s"].get<double>(), 0);
}

}  // namespace
}  // namespace piper::cost
