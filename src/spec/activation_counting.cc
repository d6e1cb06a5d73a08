#include "piper/spec/activation_counting.h"

#include <algorithm>

namespace piper {

bool is_recompute_module(const std::string& name) {
  for (const char* m : kRecomputeModules) {
    if (name == m) return true;
  }
  return false;
}

BlockActivation attention_activation_per_token(const ModelSpec& m, const ActivationShape& a, bool keep_core) {
  const double b = a.act_bytes;
  const double h = static_cast<double>(m.hidden_size);
  BlockActivation s;
  const double heads = m.num_heads;
  double q_width = 0, k_width = 0, v_width = 0;
  if (m.attention == AttentionType::kMLA) {
    const auto& l = m.mla;
    const double qk = static_cast<double>(l.qk_nope_head_dim + l.qk_rope_head_dim);
    q_width = heads * qk;
    k_width = heads * qk;
    v_width = heads * static_cast<double>(l.v_head_dim);
    // Down-projection input (shared by Q and KV), the latent vectors (norm input and up-projection input)
    // and the decoupled RoPE key: replicated across TP ranks like Megatron's MLA down projections.
    s.whole += b * h;
    if (l.q_lora_rank > 0) s.whole += 2 * b * static_cast<double>(l.q_lora_rank);
    s.whole += b * (2 * static_cast<double>(l.kv_lora_rank) + static_cast<double>(l.qk_rope_head_dim));
  } else {
    q_width = heads * static_cast<double>(m.head_dim);
    k_width = m.num_kv_heads * static_cast<double>(m.head_dim);
    v_width = k_width;
    s.whole += b * h;  // QKV input
  }
  s.split += b * (q_width + k_width);  // Q and K for QK^T
  s.split += b * v_width;              // V for attention over values
  s.split += b * heads *
             (m.attention == AttentionType::kMLA ? static_cast<double>(m.mla.v_head_dim)
                                                 : static_cast<double>(m.head_dim));  // out-proj input
  if (a.dropout) s.whole += h;  // dropout mask after the output projection (1 byte)
  if (keep_core) {
    const double per_token_core = heads * static_cast<double>(a.seq_len);  // a*s entries per token
    if (a.flash_attention) {
      s.split += 4 * heads;  // fp32 log-sum-exp per head
    } else {
      s.split += per_token_core * (b + (a.dropout ? 1 + b : 0));  // softmax out (+ mask + dropout out)
    }
  }
  return s;
}

BlockActivation dense_mlp_activation_per_token(const ModelSpec& m, const ActivationShape& a) {
  const double b = a.act_bytes;
  BlockActivation s;
  s.whole += b * static_cast<double>(m.hidden_size);  // fc1 input
  if (a.dropout) s.whole += static_cast<double>(m.hidden_size);
  // GELU: activation input and fc2 input (2 tensors of f); SwiGLU: gate and up outputs and fc2 input (3).
  s.split += (m.mlp == MlpType::kSwiGLU ? 3 : 2) * b * static_cast<double>(m.intermediate_size);
  return s;
}

double moe_router_activation_per_token(const ModelSpec& m, const ActivationShape& a) {
  const double normed = a.recompute_moe_norm ? 0.0 : a.act_bytes * static_cast<double>(m.hidden_size);
  return normed + 4.0 * m.moe.num_experts + 4.0 * m.moe.top_k;
}

double moe_experts_activation_per_token(const ModelSpec& m, const ActivationShape& a) {
  const double b = a.act_bytes;
  const double h = static_cast<double>(m.hidden_size);
  const double k = m.moe.top_k;
  const double tensors = (m.mlp == MlpType::kSwiGLU ? 3 : 2) - (a.recompute_moe_act ? 1 : 0);
  // Expert tensor parallelism: the rank runs its 1/etp slice of the experts on the rows of all etp ranks (gathered):
  // etp times the rows of width h, the same intermediate bytes (etp times the rows of 1/etp the width).
  const double etp = std::max(1, a.etp);
  double bytes = b * h * k * etp;                                                  // dispatched (gathered) tokens
  bytes += tensors * b * static_cast<double>(m.moe.expert_intermediate_size) * k;  // intermediates
  bytes += b * h * k * etp;  // expert outputs (partial under etp) before the reduce-scatter / weighted combine
  if (a.dropout) bytes += h;
  return bytes;
}

double moe_shared_activation_per_token(const ModelSpec& m, const ActivationShape& a) {
  const double tensors = m.mlp == MlpType::kSwiGLU ? 3 : 2;
  return tensors * a.act_bytes * static_cast<double>(m.moe.shared_expert_intermediate_size) * m.moe.num_shared_experts;
}

double norm_input_bytes_per_token(const ModelSpec& m, const ActivationShape& a) {
  return a.act_bytes * static_cast<double>(m.hidden_size);
}

double head_activation_per_token(const ModelSpec& m) {
  return 4.0 * (static_cast<double>(m.hidden_size) + static_cast<double>(m.vocab_size));
}

BlockActivation embedding_activation_per_token(const ModelSpec& m, const ActivationShape& a) {
  BlockActivation s;
  s.whole = a.dropout ? static_cast<double>(m.hidden_size) : 0.0;
  return s;
}

namespace {

// Q, K and V output widths of one token (MLA: the up-projected per-head widths), as the B -> W gradients count them.
double qkv_width(const ModelSpec& m) {
  const double heads = m.num_heads;
  if (m.attention != AttentionType::kMLA) return (heads + 2.0 * m.num_kv_heads) * static_cast<double>(m.head_dim);
  const MlaSpec& a = m.mla;
  return heads * static_cast<double>(2 * (a.qk_nope_head_dim + a.qk_rope_head_dim) + a.v_head_dim);
}

}  // namespace

BackwardWorkingSet backward_working_set_per_token(const ModelSpec& m, const ActivationShape& a, int tp, bool sp,
                                                  bool expert_parallel, bool materialised_scores) {
  const double b = a.act_bytes, t = std::max(1, tp), gated = m.mlp == MlpType::kSwiGLU ? 2 : 1;
  const double hidden = static_cast<double>(m.hidden_size), h = hidden / (sp ? t : 1.0);
  const double qkv = qkv_width(m) / t;
  const double d_o = static_cast<double>(m.num_heads) * static_cast<double>(m.v_head_dim()) / t;
  const double probs =
      materialised_scores ? static_cast<double>(m.num_heads) * static_cast<double>(a.seq_len) / t : 0.0;
  BackwardWorkingSet ws;
  ws.attention = b * (h + std::max({d_o + qkv + probs, 2 * qkv + h, qkv + 2 * h}));
  ws.dense_mlp = b * (3 * h + gated * static_cast<double>(m.intermediate_size) / t);
  ws.head = b * 2 * h + 4.0 * static_cast<double>(m.vocab_size) / t;
  if (!m.is_moe()) return ws;
  const MoeSpec& e = m.moe;
  const double k = e.top_k, etp = std::max(1, a.etp);
  const double row = gated * static_cast<double>(e.expert_intermediate_size) / etp;  // gate/up gradient widths
  ws.router = (b * (4 * hidden + e.num_experts) + 4 * k) / t;
  ws.experts_token = (expert_parallel ? b * hidden : b * 2 * hidden + 4 * k) / t;
  ws.experts_rows = b * k * etp * ((expert_parallel ? 3 : 2) * hidden + row) / t;
  if (e.num_shared_experts > 0) {
    ws.shared =
        b * (3 * hidden + gated * static_cast<double>(e.shared_expert_intermediate_size) * e.num_shared_experts) / t;
  }
  return ws;
}

WeightGradInputs weight_grad_inputs_per_token(const ModelSpec& m, const ActivationShape& a, int tp, bool sp) {
  const double b = a.act_bytes, t = std::max(1, tp), rep_div = sp ? t : 1.0;
  const double h = static_cast<double>(m.hidden_size), gated = m.mlp == MlpType::kSwiGLU ? 2 : 1;
  const double latents = m.attention == AttentionType::kMLA
                             ? static_cast<double>(m.mla.q_lora_rank + m.mla.kv_lora_rank + m.mla.qk_rope_head_dim)
                             : 0.0;
  WeightGradInputs w;
  w.attention = b * (2 * h + latents) / rep_div + b * qkv_width(m) / t;
  w.dense_mlp = b * 2 * h / rep_div + gated * b * static_cast<double>(m.intermediate_size) / t;
  w.head = 4.0 * static_cast<double>(m.vocab_size) / t + b * h / rep_div;
  w.embedding = b * h / rep_div;
  if (!m.is_moe()) return w;
  const MoeSpec& e = m.moe;
  const double k = e.top_k, etp = std::max(1, a.etp);
  w.router = (b * h + 4.0 * e.num_experts) / t;
  w.experts_rows = (b * k * h * etp + gated * b * k * static_cast<double>(e.expert_intermediate_size)) / t;
  if (e.num_shared_experts > 0) {
    w.shared = b * (2 * h + gated * static_cast<double>(e.shared_expert_intermediate_size) * e.num_shared_experts) / t;
  }
  return w;
}

}  // namespace piper
