// Fast fp32 CPU kernels: the same contracts as the reference kernels (reference.h, moe_reference.h) with the
// GEMMs on the GEMM library (gemm.h) and OpenMP threads over rows, heads or experts.
//
// Every function here is tested against its reference (tests/kernels/fast_test.cc) and gives the same bits for
// any kernel_threads(): each output element is computed by one thread in a fixed order.
// Ops that are cheap or inherently serial have no fast version; call the reference (ref::<op><float>):
// embedding_backward_weight, router_update_bias, build_routing.
#pragma once

#include <cstdint>

#include "piper/kernels/cpu/moe_reference.h"
#include "piper/kernels/cpu/reference.h"

namespace piper::kernels {

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t n, int64_t vocab, int64_t d);

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t n, int64_t d, double eps);
void rmsnorm_backward_input(float* dx, const float* dy, const float* x, const float* w, const float* rstd, int64_t n,
                            int64_t d);
void rmsnorm_backward_weight(float* dw, const float* dy, const float* x, const float* rstd, int64_t n, int64_t d);

// Rotary with a cos/sin table computed once per call (the reference recomputes the angles per element).
void rotary_forward(float* out, const float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                    double theta);
void rotary_backward_input(float* dx, const float* dout, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                           double theta);

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
                       const AttentionShape& s);
// The probabilities of attention_forward alone (same bits), without the output: what a backward that did not
// stash them recomputes.
void attention_probs(float* probs, const float* q, const float* k, const AttentionShape& s);
void attention_backward_input(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                              const float* v, const float* probs, const AttentionShape& s);

void linear_forward(float* y, const float* x, const float* w, int64_t n, int64_t in, int64_t out);
void linear_backward_input(float* dx, const float* dy, const float* w, int64_t n, int64_t in, int64_t out);
void linear_backward_weight(float* dw, const float* dy, const float* x, int64_t n, int64_t in, int64_t out);

void swiglu_forward(float* y, float* g, float* u, float* h, const float* x, const float* wg, const float* wu,
                    const float* wd, int64_t n, int64_t d, int64_t f);
void swiglu_backward_input(float* dx, float* dg, float* du, const float* dy, const float* g, const float* u,
                           const float* wg, const float* wu, const float* wd, int64_t n, int64_t d, int64_t f);
void swiglu_backward_weight(float* dwg, float* dwu, float* dwd, const float* dy, const float* x, const float* h,
                            const float* dg, const float* du, int64_t n, int64_t d, int64_t f);

void gelu_mlp_forward(float* y, float* a, float* h, const float* x, const float* wu, const float* wd, int64_t n,
                      int64_t d, int64_t f);
void gelu_mlp_backward_input(float* dx, float* da, const float* dy, const float* a, const float* wu, const float* wd,
                             int64_t n, int64_t d, int64_t f);
void gelu_mlp_backward_weight(float* dwu, float* dwd, const float* dy, const float* x, const float* h, const float* da,
                              int64_t n, int64_t d, int64_t f);

void router_forward(float* scores, int32_t* topk_idx, float* topk_w, float* aux_loss, const float* x, const float* wr,
                    const float* bias, int64_t n, int64_t d, const RouterConfig& cfg);
void router_backward_input(float* dx, float* dlogits, const float* dtopk_w, const float* scores,
                           const int32_t* topk_idx, const float* topk_w, const float* wr, int64_t n, int64_t d,
                           const RouterConfig& cfg);
void router_backward_weight(float* dwr, const float* dlogits, const float* x, int64_t n, int64_t d,
                            const RouterConfig& cfg);

void permute_forward(float* xp, const float* x, const Routing& r, int64_t d);
void permute_backward_input(float* dx, const float* dxp, const Routing& r, int64_t d);
void unpermute_forward(float* y, const float* yp, const float* topk_w, const Routing& r, int64_t d);
void unpermute_backward_input(float* dyp, float* dtopk_w, const float* dy, const float* yp, const float* topk_w,
                              const Routing& r, int64_t d);

void grouped_linear_forward(float* y, const float* x, const float* w, const Routing& r, int64_t in, int64_t out);
void grouped_linear_backward_input(float* dx, const float* dy, const float* w, const Routing& r, int64_t in,
                                   int64_t out);
void grouped_linear_backward_weight(float* dw, const float* dy, const float* x, const Routing& r, int64_t in,
                                    int64_t out);

void expert_swiglu_forward(float* yp, float* g, float* u, float* h, const float* xp, const float* wg, const float* wu,
                           const float* wd, const Routing& r, int64_t d, int64_t f);
void expert_swiglu_backward_input(float* dxp, float* dg, float* du, const float* dyp, const float* g, const float* u,
                                  const float* wg, const float* wu, const float* wd, const Routing& r, int64_t d,
                                  int64_t f);
void expert_swiglu_backward_weight(float* dwg, float* dwu, float* dwd, const float* dyp, const float* xp,
                                   const float* h, const float* dg, const float* du, const Routing& r, int64_t d,
                                   int64_t f);

void lm_head_loss_forward(float* loss, float* probs, const float* h, const float* w, const int32_t* targets, int64_t n,
                          int64_t d, int64_t vocab);
void lm_head_loss_backward_input(float* dh, float* dlogits, const float* probs, const int32_t* targets, const float* w,
                                 float dloss, int64_t n, int64_t d, int64_t vocab);
void lm_head_loss_backward_weight(float* dw, const float* dlogits, const float* h, int64_t n, int64_t d, int64_t vocab);

// ---- Vocabulary parallelism (Megatron's VocabParallelEmbedding and vocab_parallel_cross_entropy): a table or an
// LM head holding rows [begin, begin + rows) of the vocabulary (table / w: [rows, d]). With begin = 0 and
// rows = vocab every function gives the whole-vocabulary kernel's bits.
//
// Embedding: out row i = table[ids[i] - begin] for the ids this shard holds, zeros for the others (the shards'
// outputs sum to the whole lookup). The weight gradient accumulates the rows this shard holds, in token order.
void embedding_shard_forward(float* out, const int32_t* ids, const float* table, int64_t n, int64_t begin, int64_t rows,
                             int64_t d);
void embedding_shard_backward_weight(float* dtable, const float* dout, const int32_t* ids, int64_t n, int64_t begin,
                                     int64_t rows, int64_t d);
// LM head + cross-entropy in three steps, the middle one the caller's:
//   1. lm_head_shard_forward: probs [n, rows] = the softmax of this shard's logits h·wᵀ; stats [n, kVocabStats] =
//      per token this shard's max logit, its sum of exp(logit - max) and the target's logit (0 when another shard
//      holds the target).
//   2. the caller gathers every shard's stats in shard order: all_stats [shards, n, kVocabStats].
//   3. lm_head_shard_loss: rescales probs to the softmax over the whole vocabulary and writes the mean token loss
//      (the same on every shard).
// B: dlogits = (probs - onehot(target, when this shard holds it)) · dloss / n and dh = dlogits·w, this shard's part
// of the input gradient (the shards' parts sum to the whole head's). W: lm_head_loss_backward_weight with rows.
constexpr int64_t kVocabStats = 3;
void lm_head_shard_forward(float* probs, float* stats, const float* h, const float* w, const int32_t* targets,
                           int64_t n, int64_t d, int64_t begin, int64_t rows);
void lm_head_shard_loss(float* loss, float* probs, const float* all_stats, int shards, int shard, int64_t n,
                        int64_t rows);
void lm_head_shard_backward_input(float* dh, float* dlogits, const float* probs, const int32_t* targets, const float* w,
                                  float dloss, int64_t n, int64_t d, int64_t begin, int64_t rows);

}  // namespace piper::kernels
