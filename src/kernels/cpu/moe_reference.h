// Reference kernels of the Mixture-of-Experts layer: router, token permutation by expert, grouped expert
// GEMMs (routed experts), and the shared expert. Same conventions as reference.h.
//
// Data flow of one MoE layer (n tokens, k = top_k, E experts, rows = n·k):
//   router_forward(x) -> topk_idx [n, k], topk_w [n, k]      (+ aux loss)
//   build_routing(topk_idx) -> Routing                        (counting sort by expert, stable in token order)
//   permute_forward(x) -> xp [rows, d]                        (rows of expert e are offsets[e]..offsets[e+1])
//   expert_swiglu_forward(xp) -> yp [rows, d]                 (one SwiGLU per expert; experts may get 0 rows)
//   unpermute_forward(yp, topk_w) -> y [n, d]                 (y_t = sum_j topk_w[t,j] · yp[row_of_slot[t,j]])
//   shared expert: swiglu_* on all n tokens, added to y by the caller.
#pragma once

#include <cstdint>
#include <vector>

#include "piper/kernels/cpu/reference.h"

namespace piper::kernels {

// Where each (token, slot) went. Pure function of topk_idx.
struct Routing {
  int num_experts = 0;
  int top_k = 0;
  int64_t num_tokens = 0;
  std::vector<int64_t> expert_offsets;  // [E + 1]; expert e owns rows [offsets[e], offsets[e+1])
  std::vector<int64_t> row_of_slot;     // [n·k]: permuted row of (token t, slot j) at t·k + j
  std::vector<int64_t> token_of_row;    // [n·k]
  int64_t count(int e) const { return expert_offsets[e + 1] - expert_offsets[e]; }
};

// Counting sort of the n·k (token, slot) pairs by expert; within an expert, token order then slot order.
Routing build_routing(const int32_t* topk_idx, int64_t n, int top_k, int num_experts);

// DeepSeek's aux-loss-free balancing, applied outside the gradient after each step: bias[e] += rate ·
// sign(mean_count - count[e]). The bias only changes which experts are selected, never the weights.
void router_update_bias(float* bias, const int64_t* expert_counts, int num_experts, double rate);

namespace ref {

// ---- Router. logits = x·wrᵀ (wr [E, d]); scores = softmax(logits) or sigmoid(logits) [n, E] (saved).
// Selection: the top_k experts by scores + bias (bias may be nullptr), ties broken by the lower expert index.
// topk_w = the selected scores (not biased), divided by their sum when cfg.norm_topk.
// aux_loss = coef · E · sum_e f_e · P_e with f_e = (tokens sent to e) / (n·k) (a constant) and P_e = mean_t
// scores[t, e] (Switch Transformer). B writes dlogits [n, E] (for W) and dx from dtopk_w; the aux loss enters
// with gradient 1 (its weight is coef).
template <typename T>
void router_forward(T* scores, int32_t* topk_idx, T* topk_w, T* aux_loss, const T* x, const T* wr, const float* bias,
                    int64_t n, int64_t d, const RouterConfig& cfg);
template <typename T>
void router_backward_input(T* dx, T* dlogits, const T* dtopk_w, const T* scores, const int32_t* topk_idx,
                           const T* topk_w, const T* wr, int64_t n, int64_t d, const RouterConfig& cfg);
template <typename T>
void router_backward_weight(T* dwr, const T* dlogits, const T* x, int64_t n, int64_t d, const RouterConfig& cfg);
// The parts of the router around its GEMM, shared with the fast path: scores holds the logits on entry.
template <typename T>
void router_select(T* scores, int32_t* topk_idx, T* topk_w, T* aux_loss, const float* bias, int64_t n,
                   const RouterConfig& cfg);
template <typename T>
void router_dlogits(T* dlogits, const T* dtopk_w, const T* scores, const int32_t* topk_idx, const T* topk_w, int64_t n,
                    const RouterConfig& cfg);

// ---- Permute: xp[row] = x[token_of_row[row]]. B: dx[t] = sum over slots j (in order) of dxp[row_of_slot[t, j]].
template <typename T>
void permute_forward(T* xp, const T* x, const Routing& r, int64_t d);
template <typename T>
void permute_backward_input(T* dx, const T* dxp, const Routing& r, int64_t d);

// ---- Unpermute (combine): y[t] = sum_j topk_w[t,j] · yp[row_of_slot[t,j]]. B writes dyp and dtopk_w.
template <typename T>
void unpermute_forward(T* y, const T* yp, const T* topk_w, const Routing& r, int64_t d);
template <typename T>
void unpermute_backward_input(T* dyp, T* dtopk_w, const T* dy, const T* yp, const T* topk_w, const Routing& r,
                              int64_t d);

// ---- Grouped expert GEMM: rows of expert e times w[e]ᵀ, w [E, out, in]. W accumulates into dw[e] only for
// experts that received rows.
template <typename T>
void grouped_linear_forward(T* y, const T* x, const T* w, const Routing& r, int64_t in, int64_t out);
template <typename T>
void grouped_linear_backward_input(T* dx, const T* dy, const T* w, const Routing& r, int64_t in, int64_t out);
template <typename T>
void grouped_linear_backward_weight(T* dw, const T* dy, const T* x, const Routing& r, int64_t in, int64_t out);

// ---- Routed experts as grouped SwiGLU: wg, wu [E, f, d], wd [E, d, f]; g, u, h, dg, du [rows, f].
template <typename T>
void expert_swiglu_forward(T* yp, T* g, T* u, T* h, const T* xp, const T* wg, const T* wu, const T* wd,
                           const Routing& r, int64_t d, int64_t f);
template <typename T>
void expert_swiglu_backward_input(T* dxp, T* dg, T* du, const T* dyp, const T* g, const T* u, const T* wg, const T* wu,
                                  const T* wd, const Routing& r, int64_t d, int64_t f);
template <typename T>
void expert_swiglu_backward_weight(T* dwg, T* dwu, T* dwd, const T* dyp, const T* xp, const T* h, const T* dg,
                                   const T* du, const Routing& r, int64_t d, int64_t f);

}  // namespace ref
}  // namespace piper::kernels
