// Reference CPU kernels: plain loops, templated on the scalar type (float for training, double for the
// finite-difference tests). They are the specification that every faster path is tested against.
//
// Conventions shared by every kernel (see docs/kernels.md):
// - Row-major arrays; n = number of tokens (batch × sequence, flattened), d = hidden size.
//   Weights are stored as [out, in] (y = x · Wᵀ), expert weights as [num_experts, out, in].
// - `<layer>_forward` writes its outputs and the activations it saves for backward.
//   `<layer>_backward_input` (B) writes (overwrites) the gradients of the inputs and any intermediate gradients
//   that W needs. `<layer>_backward_weight` (W) ACCUMULATES (+=) into the weight gradients, so microbatches add.
//   Ops without weights (rotary, attention core, permute) have no _backward_weight; the embedding has no
//   _backward_input (its input is token ids).
// - Token ids, expert indices and shapes are validated at the boundary (data loader, executor); here they are
//   checked with PIPER_DCHECK only.
// - Every reduction runs in a fixed order, so the results are a pure function of the inputs.
#pragma once

#include <cstdint>

namespace piper::kernels {

enum class ScoreFunc { kSoftmax, kSigmoid };

// Router settings (see router_forward).
struct RouterConfig {
  int num_experts = 0;
  int top_k = 0;
  ScoreFunc score = ScoreFunc::kSoftmax;
  bool norm_topk = true;       // divide the selected scores by their sum
  double aux_loss_coef = 0.0;  // weight of the load-balance loss (0 = off)
  // Backward of the load-balance loss when the tokens are split over ranks (sequence parallelism): the expert
  // counts [num_experts] and the token count of the whole microbatch. Null: the call's own tokens.
  const double* aux_counts = nullptr;
  int64_t aux_tokens = 0;
};

// Shape of the causal attention core (see attention_forward).
struct AttentionShape {
  int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
};

namespace ref {

// C[m,n] = alpha · op(A) · op(B) + beta · C, row-major; op(A) is [m,k] (A stored [k,m] when trans_a).
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc);

// ---- embedding: out[i] = table[ids[i]]; table [vocab, d].
template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t n, int64_t vocab, int64_t d);
template <typename T>
void embedding_backward_weight(T* dtable, const T* dout, const int32_t* ids, int64_t n, int64_t vocab, int64_t d);

// ---- RMSNorm: y = x / sqrt(mean(x²) + eps) · w; saves rstd[n] = 1 / sqrt(mean(x²) + eps).
template <typename T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int64_t n, int64_t d, double eps);
template <typename T>
void rmsnorm_backward_input(T* dx, const T* dy, const T* x, const T* w, const T* rstd, int64_t n, int64_t d);
template <typename T>
void rmsnorm_backward_weight(T* dw, const T* dy, const T* x, const T* rstd, int64_t n, int64_t d);

// ---- Rotary position embedding on x [batch, seq, heads, head_dim] (head_dim even), position = index in the
// sequence, half-split pairs (x[i], x[i + head_dim/2]) rotated by pos · theta^(-2i/head_dim). out may alias x.
template <typename T>
void rotary_forward(T* out, const T* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, double theta);
template <typename T>
void rotary_backward_input(T* dx, const T* dout, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                           double theta);

// ---- Causal attention core (MHA, GQA, MQA). q, out [batch, seq, q_heads, hd]; k, v [batch, seq, kv_heads, hd];
// q_heads % kv_heads == 0, q head h reads kv head h / (q_heads / kv_heads). Saves probs [batch, q_heads, seq, seq]
// (zero above the diagonal). Scale 1/sqrt(hd).
template <typename T>
void attention_forward(T* out, T* probs, const T* q, const T* k, const T* v, const AttentionShape& s);
template <typename T>
void attention_backward_input(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* probs,
                              const AttentionShape& s);

// ---- Linear: y[n, out] = x[n, in] · w[out, in]ᵀ.
template <typename T>
void linear_forward(T* y, const T* x, const T* w, int64_t n, int64_t in, int64_t out);
template <typename T>
void linear_backward_input(T* dx, const T* dy, const T* w, int64_t n, int64_t in, int64_t out);
template <typename T>
void linear_backward_weight(T* dw, const T* dy, const T* x, int64_t n, int64_t in, int64_t out);

// ---- SwiGLU MLP: g = x·wgᵀ, u = x·wuᵀ, h = silu(g)·u, y = h·wdᵀ; wg, wu [f, d], wd [d, f]. Saves g, u, h [n, f].
// B writes dx and the intermediate gradients dg, du [n, f] that W consumes.
template <typename T>
void swiglu_forward(T* y, T* g, T* u, T* h, const T* x, const T* wg, const T* wu, const T* wd, int64_t n, int64_t d,
                    int64_t f);
template <typename T>
void swiglu_backward_input(T* dx, T* dg, T* du, const T* dy, const T* g, const T* u, const T* wg, const T* wu,
                           const T* wd, int64_t n, int64_t d, int64_t f);
template <typename T>
void swiglu_backward_weight(T* dwg, T* dwu, T* dwd, const T* dy, const T* x, const T* h, const T* dg, const T* du,
                            int64_t n, int64_t d, int64_t f);

// ---- GELU MLP (tanh approximation): a = x·wuᵀ, h = gelu(a), y = h·wdᵀ; wu [f, d], wd [d, f]. Saves a, h [n, f].
template <typename T>
void gelu_mlp_forward(T* y, T* a, T* h, const T* x, const T* wu, const T* wd, int64_t n, int64_t d, int64_t f);
template <typename T>
void gelu_mlp_backward_input(T* dx, T* da, const T* dy, const T* a, const T* wu, const T* wd, int64_t n, int64_t d,
                             int64_t f);
template <typename T>
void gelu_mlp_backward_weight(T* dwu, T* dwd, const T* dy, const T* x, const T* h, const T* da, int64_t n, int64_t d,
                              int64_t f);

// ---- LM head + cross-entropy: logits = h·wᵀ (w [vocab, d]), loss = mean_i -log softmax(logits_i)[targets_i].
// Forward writes the scalar loss and saves probs [n, vocab]. B writes dh and dlogits [n, vocab] (for W), scaled
// by dloss (the gradient of the final objective with respect to this loss, usually 1).
template <typename T>
void lm_head_loss_forward(T* loss, T* probs, const T* h, const T* w, const int32_t* targets, int64_t n, int64_t d,
                          int64_t vocab);
template <typename T>
void lm_head_loss_backward_input(T* dh, T* dlogits, const T* probs, const int32_t* targets, const T* w, T dloss,
                                 int64_t n, int64_t d, int64_t vocab);
template <typename T>
void lm_head_loss_backward_weight(T* dw, const T* dlogits, const T* h, int64_t n, int64_t d, int64_t vocab);

}  // namespace ref
}  // namespace piper::kernels
