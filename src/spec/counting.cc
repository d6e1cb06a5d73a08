#include "piper/spec/counting.h"

#include <algorithm>

#include "piper/base/checked_math.h"

namespace piper {
namespace {

// Products and sums of user-given sizes saturate at INT64_MAX (checked_math.h) instead of wrapping to a
// negative count; ModelSpec::validate() refuses a model whose total reaches kMaxParams, so for a valid model
// every count below is exact.
int64_t mul(int64_t a, int64_t b) { return sat_mul(a, b); }
template <class... Ts>
int64_t mul(int64_t a, int64_t b, Ts... rest) {
  return mul(sat_mul(a, b), rest...);
}
template <class... Ts>
int64_t add(int64_t a, Ts... rest) {
  int64_t r = a;
  ((r = sat_add(r, rest)), ...);
  return r;
}

int64_t mla_params(const ModelSpec& m) {
  const MlaSpec& a = m.mla;
  const int64_t h = m.hidden_size, n = m.num_heads;
  const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
  // Q: down-projection + its RMSNorm + up-projection, or one projection without q_lora.
  int64_t q = a.q_lora_rank > 0 ? add(mul(h, a.q_lora_rank), a.q_lora_rank, mul(a.q_lora_rank, n, qk)) : mul(h, n, qk);
  // KV: joint down-projection (plus the shared RoPE key), its RMSNorm, up-projection to per-head K_nope and V.
  int64_t kv = add(mul(h, a.kv_lora_rank + a.qk_rope_head_dim), a.kv_lora_rank,
                   mul(a.kv_lora_rank, n, a.qk_nope_head_dim + a.v_head_dim));
  int64_t o = mul(n, a.v_head_dim, h);
  return add(q, kv, o);
}

}  // namespace

// Matmul weights only (no biases, norms or sinks): what a token multiplies with in the attention projections.
int64_t attention_matmul_params(const ModelSpec& m) {
  if (m.attention == AttentionType::kMLA) {
    const MlaSpec& a = m.mla;
    const int64_t h = m.hidden_size, n = m.num_heads;
    const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
    int64_t q = a.q_lora_rank > 0 ? add(mul(h, a.q_lora_rank), mul(a.q_lora_rank, n, qk)) : mul(h, n, qk);
    return add(q, mul(h, a.kv_lora_rank + a.qk_rope_head_dim),
               mul(a.kv_lora_rank, n, a.qk_nope_head_dim + a.v_head_dim), mul(n, a.v_head_dim, h));
  }
  const int64_t h = m.hidden_size, d = m.head_dim;
  return add(mul(2, h, m.num_heads, d), mul(2, h, m.num_kv_heads, d));
}

namespace {

int64_t mlp_matmul_params(const ModelSpec& m, int64_t f) {
  return mul(m.mlp == MlpType::kSwiGLU ? 3 : 2, m.hidden_size, f);
}

// Average keys one query attends to at sequence length s: s/2 causal, w - w^2/(2s) under a window w < s.
double mean_context(const ModelSpec& m, int layer, int64_t s) {
  double sd = static_cast<double>(s);
  if (!m.uses_sliding_window(layer) || m.sliding_window >= s) return sd / 2;
  double w = static_cast<double>(m.sliding_window);
  return w - w * w / (2 * sd);
}

}  // namespace

int64_t ParamCounts::total() const {
  int64_t t = 0;
  for (const auto& [name, c] : parts()) t = add(t, c.total);
  return t;
}

int64_t ParamCounts::active() const {
  int64_t t = 0;
  for (const auto& [name, c] : parts()) t = add(t, c.active);
  return t;
}

std::vector<std::pair<std::string, PartCounts>> ParamCounts::parts() const {
  return {{"embedding", embedding},
          {"attention", attention},
          {"dense_mlp", dense_mlp},
          {"routed_experts", routed_experts},
          {"shared_experts", shared_experts},
          {"router", router},
          {"norms", norms},
          {"head", head}};
}

int64_t norm_params(const ModelSpec& m) { return m.norm_bias ? mul(2, m.hidden_size) : m.hidden_size; }

int64_t attention_params(const ModelSpec& m) {
  if (m.attention == AttentionType::kMLA) return mla_params(m);
  const int64_t h = m.hidden_size, d = m.head_dim, nq = m.num_heads, nkv = m.num_kv_heads;
  int64_t p = attention_matmul_params(m);
  if (m.attention_bias) p = add(p, mul(nq, d), mul(2, nkv, d), h);
  if (m.attention_sinks) p = add(p, nq);
  if (m.qk_norm) p = add(p, m.qk_norm_full ? add(mul(nq, d), mul(nkv, d)) : mul(2, d));
  return p;
}

int64_t mlp_params(const ModelSpec& m, int64_t f, bool bias) {
  int64_t p = mlp_matmul_params(m, f);
  if (bias) p = add(p, m.mlp == MlpType::kSwiGLU ? mul(2, f) : f, m.hidden_size);
  return p;
}

int64_t dense_mlp_params(const ModelSpec& m) { return mlp_params(m, m.intermediate_size, m.mlp_bias); }

int64_t expert_params(const ModelSpec& m) { return mlp_params(m, m.moe.expert_intermediate_size, m.moe.expert_bias); }

int64_t shared_experts_params(const ModelSpec& m) {
  return mul(m.moe.num_shared_experts, mlp_params(m, m.moe.shared_expert_intermediate_size, m.mlp_bias));
}

int64_t router_params(const ModelSpec& m) {
  return add(mul(m.hidden_size, m.moe.num_experts), m.moe.router_bias ? m.moe.num_experts : 0);
}

ParamCounts count_params(const ModelSpec& m) {
  ParamCounts c;
  int64_t emb = add(mul(m.vocab_size, m.hidden_size), m.learned_positions ? mul(m.max_seq_len, m.hidden_size) : 0);
  c.embedding = {emb, emb};
  int64_t head = m.tie_embeddings ? 0 : mul(m.vocab_size, m.hidden_size);
  c.head = {head, head};
  int64_t norms = mul(add(mul(2, m.num_layers), 1), norm_params(m));
  c.norms = {norms, norms};
  int64_t attn = mul(m.num_layers, attention_params(m));
  c.attention = {attn, attn};
  int64_t dense = mul(m.num_dense_layers(), dense_mlp_params(m));
  c.dense_mlp = {dense, dense};
  const int64_t moe_layers = m.num_moe_layers();
  c.routed_experts = {mul(moe_layers, m.moe.num_experts, expert_params(m)),
                      mul(moe_layers, m.moe.top_k, expert_params(m))};
  int64_t shared = mul(moe_layers, shared_experts_params(m));
  c.shared_experts = {shared, shared};
  int64_t router = mul(moe_layers, router_params(m));
  c.router = {router, router};
  return c;
}

double attention_core_forward_flops_per_token(const ModelSpec& m, int layer, int64_t seq_len) {
  return 2.0 * m.num_heads * static_cast<double>(m.qk_head_dim() + m.v_head_dim()) * mean_context(m, layer, seq_len);
}

double layer_forward_flops_per_token(const ModelSpec& m, int layer, int64_t seq_len) {
  double weights = static_cast<double>(attention_matmul_params(m));
  if (m.is_moe_layer(layer)) {
    weights += static_cast<double>(m.moe.top_k) * mlp_matmul_params(m, m.moe.expert_intermediate_size);
    weights +=
        static_cast<double>(m.moe.num_shared_experts) * mlp_matmul_params(m, m.moe.shared_expert_intermediate_size);
    weights += static_cast<double>(m.hidden_size) * m.moe.num_experts;
  } else {
    weights += static_cast<double>(mlp_matmul_params(m, m.intermediate_size));
  }
  return 2.0 * weights + attention_core_forward_flops_per_token(m, layer, seq_len);
}

double forward_flops_per_token(const ModelSpec& m, int64_t seq_len) {
  double f = 2.0 * static_cast<double>(m.vocab_size) * m.hidden_size;  // LM head (tied or not, it is a matmul)
  for (int l = 0; l < m.num_layers; ++l) f += layer_forward_flops_per_token(m, l, seq_len);
  return f;
}

double training_flops_per_token(const ModelSpec& m, int64_t seq_len) {
  return 3.0 * forward_flops_per_token(m, seq_len);
}

}  // namespace piper
