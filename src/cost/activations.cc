#include "piper/cost/activations.h"

namespace piper::cost {
namespace {

// Bytes per token of the attention block, split into the part every TP rank keeps (`rep`: projection inputs
// and dropout mask, divided by t only under sequence parallelism) and the part TP splits (`shard`).
struct Split {
  double rep = 0;
  double shard = 0;
};

Split attention_split(const ModelSpec& m, const ActivationOptions& o, bool keep_core) {
  const double b = o.act_bytes;
  const double h = static_cast<double>(m.hidden_size);
  Split s;
  double heads = m.num_heads;
  double q_width = 0, k_width = 0, v_width = 0;
  if (m.attention == AttentionType::kMLA) {
    const auto& a = m.mla;
    const double qk = static_cast<double>(a.qk_nope_head_dim + a.qk_rope_head_dim);
    q_width = heads * qk;
    k_width = heads * qk;
    v_width = heads * static_cast<double>(a.v_head_dim);
    // Down-projection input (shared by Q and KV), the latent vectors (norm input and up-projection input)
    // and the decoupled RoPE key: replicated across TP ranks like Megatron's MLA down projections.
    s.rep += b * h;
    if (a.q_lora_rank > 0) s.rep += 2 * b * static_cast<double>(a.q_lora_rank);
    s.rep += b * (2 * static_cast<double>(a.kv_lora_rank) + static_cast<double>(a.qk_rope_head_dim));
  } else {
    q_width = heads * static_cast<double>(m.head_dim);
    k_width = m.num_kv_heads * static_cast<double>(m.head_dim);
    v_width = k_width;
    s.rep += b * h;  // QKV input
  }
  s.shard += b * (q_width + k_width);  // Q and K for QK^T
  s.shard += b * v_width;              // V for attention over values
  s.shard += b * heads * (m.attention == AttentionType::kMLA ? static_cast<double>(m.mla.v_head_dim)
                                                               : static_cast<double>(m.head_dim));  // out-proj input
  if (o.dropout) s.rep += h;  // dropout mask after the output projection (1 byte)
  if (keep_core) {
    const double per_token_core = heads * static_cast<double>(o.seq_len);  // a*s entries per token
    if (o.flash_attention) {
      s.shard += 4 * heads;  // fp32 log-sum-exp per head
    } else {
      s.shard += per_token_core * (b + (o.dropout ? 1 + b : 0));  // softmax out (+ mask + dropout out)
    }
  }
  return s;
}

Split dense_mlp_split(const ModelSpec& m, const ActivationOptions& o) {
  const double b = o.act_bytes;
  const double f = static_cast<double>(m.intermediate_size);
  Split s;
  s.rep += b * static_cast<double>(m.hidden_size);  // fc1 input
  if (o.dropout) s.rep += static_cast<double>(m.hidden_size);
  // GELU: activation input and fc2 input (2 tensors of f); SwiGLU: gate and up outputs and fc2 input (3).
  s.shard += (m.mlp == MlpType::kSwiGLU ? 3 : 2) * b * f;
  return s;
}

// MoE FFN block per token, already divided by tp (tokens are split over TP ranks before dispatch).
double moe_bytes(const ModelSpec& m, const ActivationOptions& o) {
  const double b = o.act_bytes;
  const double h = static_cast<double>(m.hidden_size);
  const double k = m.moe.top_k;
  const double e = m.moe.num_experts;
  const double tensors = m.mlp == MlpType::kSwiGLU ? 3 : 2;
  double bytes = b * h;                         // router / expert / shared-expert input (the norm output)
  bytes += 4 * e;                               // fp32 router probabilities
  bytes += 4 * k;                               // fp32 routing weights of the chosen experts
  bytes += b * h * k;                           // dispatched tokens (expert GEMM input)
  bytes += tensors * b * static_cast<double>(m.moe.expert_intermediate_size) * k / o.etp;  // expert intermediates
  bytes += b * h * k;                           // expert outputs before the weighted combine
  bytes += tensors * b * static_cast<double>(m.moe.shared_expert_intermediate_size) * m.moe.num_shared_experts;
  if (o.dropout) bytes += h;
  return bytes / o.tp;
}

}  // namespace

LayerActivation layer_activation_peak_bytes_per_token(const ModelSpec& m, bool moe_layer, const ActivationOptions& o) {
  ActivationOptions none = o;
  none.recompute = Recompute::kNone;
  return layer_activation_bytes_per_token(m, moe_layer, none);
}

LayerActivation layer_activation_bytes_per_token(const ModelSpec& m, bool moe_layer, const ActivationOptions& o) {
  const double t = o.tp;
  const double rep_div = o.sp ? t : 1.0;
  LayerActivation out;
  if (o.recompute == Recompute::kFull) {
    const double h = static_cast<double>(m.hidden_size);
    out.norms = o.act_bytes * h / rep_div;  // the layer input
    if (!o.recompute_per_chunk) return out;
    out.attention = o.act_bytes * h / rep_div;  // the attention output: input of router/experts/shared/mlp
    if (moe_layer) {
      const double k = m.moe.top_k;
      double bytes = o.act_bytes * h + 8 * k;  // router's normed output (experts' input) and routing
      if (m.moe.num_shared_experts > 0) bytes += o.act_bytes * h;  // shared output, summed by the next layer
      out.mlp = bytes / t;
    }
    return out;
  }
  Split attn = attention_split(m, o, o.recompute == Recompute::kNone);
  out.attention = attn.rep / rep_div + attn.shard / t;
  if (moe_layer) {
    out.mlp = moe_bytes(m, o);
  } else {
    Split mlp = dense_mlp_split(m, o);
    out.mlp = mlp.rep / rep_div + mlp.shard / t;
  }
  out.norms = 2 * o.act_bytes * static_cast<double>(m.hidden_size) / rep_div;
  return out;
}

double layer_weight_grad_input_bytes_per_token(const ModelSpec& m, bool moe_layer, const ActivationOptions& o) {
  const double b = o.act_bytes;
  const double t = o.tp;
  const double rep_div = o.sp ? t : 1.0;
  const double h = static_cast<double>(m.hidden_size);
  const double gated = m.mlp == MlpType::kSwiGLU ? 2 : 1;  // gate/up outputs feeding the activation function
  double heads = m.num_heads, qkv = 0, latents = 0;
  if (m.attention == AttentionType::kMLA) {
    const auto& a = m.mla;
    qkv = heads * static_cast<double>(2 * (a.qk_nope_head_dim + a.qk_rope_head_dim) + a.v_head_dim);
    latents = static_cast<double>(a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim);
  } else {
    qkv = (heads + 2.0 * m.num_kv_heads) * static_cast<double>(m.head_dim);
  }
  double bytes = b * (2 * h + latents) / rep_div + b * qkv / t;  // attention
  if (moe_layer) {
    const double k = m.moe.top_k;
    double moe = b * h + 4.0 * m.moe.num_experts + b * k * h +
                 gated * b * k * static_cast<double>(m.moe.expert_intermediate_size) / o.etp;
    if (m.moe.num_shared_experts > 0) {
      moe += b * (2 * h + gated * static_cast<double>(m.moe.shared_expert_intermediate_size) *
                              m.moe.num_shared_experts);
    }
    bytes += moe / t;
  } else {
    bytes += b * 2 * h / rep_div + gated * b * static_cast<double>(m.intermediate_size) / t;
  }
  return bytes;
}

double head_weight_grad_input_bytes_per_token(const ModelSpec& m, const ActivationOptions& o) {
  return 4.0 * static_cast<double>(m.vocab_size) / o.tp +
         o.act_bytes * static_cast<double>(m.hidden_size) / (o.sp ? o.tp : 1);
}

double embedding_weight_grad_input_bytes_per_token(const ModelSpec& m, const ActivationOptions& o) {
  return o.act_bytes * static_cast<double>(m.hidden_size) / (o.sp ? o.tp : 1);
}

double head_activation_bytes_per_token(const ModelSpec& m, const ActivationOptions& o) {
  return 4.0 * (static_cast<double>(m.hidden_size) + static_cast<double>(m.vocab_size)) / o.tp;
}

double embedding_activation_bytes_per_token(const ModelSpec& m, const ActivationOptions& o) {
  return 8.0 + (o.dropout ? static_cast<double>(m.hidden_size) / (o.sp ? o.tp : 1) : 0.0);
}

}  // namespace piper::cost
