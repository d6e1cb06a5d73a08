// Activation memory against Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models" (arXiv:2205.05198), Table 2 formulas, per layer, 16-bit activations with 1-byte dropout masks:
//   no parallelism                 sbh (34 + 5as/h)
//   tensor parallel (t)            sbh (10 + 24/t + 5as/(ht))
//   tensor + sequence parallel     sbh/t (34 + 5as/h)
//   tensor + sequence + selective  34 sbh/t
//   full recompute                 2 sbh
// Rows use the paper's model configurations (Table 3: 22B, 175B, 530B, 1T; s = 2048, t = 8).
#include "piper/cost/activations.h"

#include <gtest/gtest.h>

namespace piper::cost {
namespace {

ModelSpec gpt(int64_t h, int heads) {
  ModelSpec m;
  m.name = "gpt";
  m.num_layers = 1;
  m.hidden_size = h;
  m.num_heads = heads;
  m.num_kv_heads = heads;
  m.head_dim = h / heads;
  m.mlp = MlpType::kGelu;
  m.intermediate_size = 4 * h;
  m.norm = NormType::kLayerNorm;
  m.vocab_size = 51200;
  return m;
}

ActivationOptions korthikanti(int64_t s, int t, bool sp, Recompute r) {
  ActivationOptions o;
  o.tp = t;
  o.sp = sp;
  o.recompute = r;
  o.seq_len = s;
  o.act_bytes = 2;
  o.dropout = true;
  o.flash_attention = false;
  o.recompute_per_chunk = false;  // the paper's per-layer full recompute (2sbh)
  return o;
}

TEST(ActivationsTest, KorthikantiTable2) {
  struct Row {
    const char* model;  // Korthikanti et al. Table 3
    int64_t h;
    int a;
  };
  const Row rows[] = {{"22B", 6144, 64}, {"175B", 12288, 96}, {"530B", 20480, 128}, {"1T", 25600, 160}};
  const int64_t s = 2048;
  const int t = 8;
  for (const auto& row : rows) {
    ModelSpec m = gpt(row.h, row.a);
    const double h = row.h, a = row.a;
    // Per token: the table's sbh(...) divided by s*b.
    const double none = h * (34 + 5 * a * s / h);
    const double tp = h * (10 + 24.0 / t + 5 * a * s / (h * t));
    const double tp_sp = h * (34 + 5 * a * s / h) / t;
    const double tp_sp_sel = 34 * h / t;
    const double full = 2 * h;
    auto bytes = [&](int tp_deg, bool sp, Recompute r) {
      return layer_activation_bytes_per_token(m, false, korthikanti(s, tp_deg, sp, r)).total();
    };
    EXPECT_DOUBLE_EQ(bytes(1, false, Recompute::kNone), none) << row.model;
    EXPECT_DOUBLE_EQ(bytes(t, false, Recompute::kNone), tp) << row.model;
    EXPECT_DOUBLE_EQ(bytes(t, true, Recompute::kNone), tp_sp) << row.model;
    EXPECT_DOUBLE_EQ(bytes(t, true, Recompute::kSelective), tp_sp_sel) << row.model;
    EXPECT_DOUBLE_EQ(bytes(1, false, Recompute::kFull), full) << row.model;
    EXPECT_DOUBLE_EQ(bytes(t, true, Recompute::kFull), full / t) << row.model;  // the input is sequence-sharded
  }
}

// The part split of the same paper (§4.1): attention 11sbh + 5as^2b, MLP 19sbh, the two norms 4sbh.
TEST(ActivationsTest, KorthikantiPartSplit) {
  ModelSpec m = gpt(12288, 96);
  const double h = 12288, a = 96, s = 2048;
  LayerActivation act = layer_activation_bytes_per_token(m, false, korthikanti(2048, 1, false, Recompute::kNone));
  EXPECT_DOUBLE_EQ(act.attention, 11 * h + 5 * a * s);
  EXPECT_DOUBLE_EQ(act.mlp, 19 * h);
  EXPECT_DOUBLE_EQ(act.norms, 4 * h);
}

// Modern layers: no dropout and flash attention drop the masks and the s x s tensors; SwiGLU keeps three
// f-wide tensors (2h + 6f for the MLP, reference hardware_and_models.md §4.2 item 4).
TEST(ActivationsTest, SwigluFlashNoDropout) {
  ModelSpec m = gpt(4096, 32);
  m.mlp = MlpType::kSwiGLU;
  m.intermediate_size = 14336;
  m.num_kv_heads = 8;
  ActivationOptions o;
  o.seq_len = 4096;
  LayerActivation act = layer_activation_bytes_per_token(m, false, o);
  EXPECT_DOUBLE_EQ(act.mlp, 2 * 4096 + 6 * 14336.0);
  // QKV input 2h, Q 2h, K and V 2 * 1024 each (8 KV heads of 128), out-projection input 2h, fp32 LSE per head.
  EXPECT_DOUBLE_EQ(act.attention, 2 * 4096 + 2 * 4096 + 2 * 1024 + 2 * 1024 + 2 * 4096 + 4 * 32);
}

// MoE layer: every FFN term is multiplied by k (llm-analysis `analysis.py`; X-MoE activation table). Derived
// per-token form (hardware_and_models.md §4.2 item 4): h(2 + 4k) + 6k f_e + 6 f_s + 4E bytes; we also keep the
// k fp32 routing weights (4k bytes). Every term divides by tp (tokens split); etp multiplies the experts' h-wide
// rows (gathered over the etp ranks) and leaves the intermediates (etp times the rows of 1/etp the width).
TEST(ActivationsTest, MoeTopKDuplication) {
  ModelSpec m = gpt(7168, 128);
  m.mlp = MlpType::kSwiGLU;
  m.moe.num_experts = 256;
  m.moe.top_k = 8;
  m.moe.num_shared_experts = 1;
  m.moe.expert_intermediate_size = 2048;
  m.moe.shared_expert_intermediate_size = 2048;
  ActivationOptions o;
  const double h = 7168, k = 8, fe = 2048, fs = 2048, e = 256;
  const double expected = h * (2 + 4 * k) + 6 * k * fe + 6 * fs + 4 * e + 4 * k;
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, true, o).mlp, expected);
  o.tp = 4;
  o.sp = true;
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, true, o).mlp, expected / 4);
  o.tp = 1;
  o.sp = false;
  o.etp = 2;
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, true, o).mlp, expected + 2 * 2 * k * h);
  o.etp = 1;
  m.moe.top_k = 4;
  const double k4 = h * (2 + 16) + 24 * fe + 6 * fs + 4 * e + 16;
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, true, o).mlp, k4);
}

// ActivationOptions::expert_load: a rank whose experts receive L x the mean rank's rows holds L x the routed
// experts' bytes per token (dispatched rows 2kh: k h in, k h out, and the SwiGLU intermediates 3k f_e, here 2-byte)
// and L x their B -> W gradients (expert output rows k h, gate/up 2k f_e); the router's and shared experts' do not
// change. A rank with no routed rows keeps only those.
TEST(ActivationsTest, RoutedExpertsScaleWithTheRanksLoad) {
  ModelSpec m = gpt(7168, 128);
  m.mlp = MlpType::kSwiGLU;
  m.moe.num_experts = 256;
  m.moe.top_k = 8;
  m.moe.num_shared_experts = 1;
  m.moe.expert_intermediate_size = 2048;
  m.moe.shared_expert_intermediate_size = 2048;
  const double h = 7168, k = 8, fe = 2048;
  ActivationOptions o;
  const double balanced = layer_activation_bytes_per_token(m, true, o).mlp;
  const double wg_balanced = layer_weight_grad_input_bytes_per_token(m, true, o);
  const double experts = 2 * (2 * k * h + 3 * k * fe), wg_experts = 2 * (k * h + 2 * k * fe);
  o.expert_load = 2.5;
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, true, o).mlp, balanced + 1.5 * experts);
  EXPECT_DOUBLE_EQ(layer_weight_grad_input_bytes_per_token(m, true, o), wg_balanced + 1.5 * wg_experts);
  o.expert_load = 0;
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, true, o).mlp, balanced - experts);
  EXPECT_DOUBLE_EQ(layer_weight_grad_input_bytes_per_token(m, true, o), wg_balanced - wg_experts);
  // Dense layers and the attention of a MoE layer carry no routed rows.
  o.expert_load = 3;
  ActivationOptions flat;
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, false, o).total(),
                   layer_activation_bytes_per_token(m, false, flat).total());
  EXPECT_DOUBLE_EQ(layer_activation_bytes_per_token(m, true, o).attention,
                   layer_activation_bytes_per_token(m, true, flat).attention);
}

// The backward's working set of each chunk kind, at tiny-moe's shape in fp32 (Piper's CPU runtime), counted from
// the tensors runtime/model/chunks allocates and holds at once during B: attention dout h + d_o 128 + dq dk dv 256
// + the recomputed probabilities 4 heads x 128 keys; dense SwiGLU MLP dout, dxn, dx 3h + dg du 2 x 512; routed
// experts without ep dout h + dhn h + dtopk_w k + per routed row dyp, dxp 2h + dg du 2 x 256; with ep the
// residual's gradient h + per row dyp, dxp, the returned row 3h + dg du; head dxn, dx 2h + fp32 dlogits V.
TEST(ActivationsTest, BackwardWorkingSetCountsTheRuntimesGradientTensors) {
  ModelSpec m = gpt(128, 4);
  m.num_kv_heads = 2;
  m.head_dim = 32;
  m.mlp = MlpType::kSwiGLU;
  m.intermediate_size = 512;
  m.vocab_size = 256;
  m.moe.num_experts = 8;
  m.moe.top_k = 2;
  m.moe.expert_intermediate_size = 256;
  ActivationOptions o;
  o.act_bytes = 4;
  o.seq_len = 128;
  o.materialised_scores = true;
  const double h = 128, k = 2, fe = 256;
  LayerWorkingSet ws = backward_working_set_bytes_per_token(m, o);
  EXPECT_DOUBLE_EQ(ws.attention, 4 * (h + 128 + 256 + 4 * 128));
  EXPECT_DOUBLE_EQ(ws.dense_mlp, 4 * (3 * h + 2 * 512));
  EXPECT_DOUBLE_EQ(ws.moe, 4 * (2 * h + k * (2 * h + 2 * fe)) + 4 * k);
  EXPECT_DOUBLE_EQ(ws.head, 4 * (2 * h + 256));
  // Fused attention keeps no probabilities: dq dk dv, dqkv and dxn are then the largest set.
  o.materialised_scores = false;
  EXPECT_DOUBLE_EQ(backward_working_set_bytes_per_token(m, o).attention, 4 * (h + 2 * 256 + h));
  // Expert parallelism, the busiest rank at 2.5 x the mean rows; tp = 2 halves every MoE term.
  o.expert_parallel = true;
  o.expert_load = 2.5;
  EXPECT_DOUBLE_EQ(backward_working_set_bytes_per_token(m, o).moe, 4 * (h + 2.5 * k * (3 * h + 2 * fe)));
  o.tp = 2;
  EXPECT_DOUBLE_EQ(backward_working_set_bytes_per_token(m, o).moe, 4 * (h + 2.5 * k * (3 * h + 2 * fe)) / 2);
}

// Megatron's output layer + cross entropy: 4sbh(1 + V/h)/tp (theoretical_memory_usage.py).
TEST(ActivationsTest, HeadMegatron) {
  ModelSpec m = gpt(4096, 32);
  ActivationOptions o;
  o.tp = 2;
  EXPECT_DOUBLE_EQ(head_activation_bytes_per_token(m, o), 4.0 * 4096 * (1 + 51200.0 / 4096) / 2);
}

}  // namespace
}  // namespace piper::cost
