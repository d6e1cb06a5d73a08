// Fast fp32 MoE kernels. Experts run on OpenMP threads when the GEMM library can be called from them (each
// expert's rows and weight gradients belong to one thread); permutation loops run over tokens or rows.
#include <vector>

#include "piper/kernels/cpu/gemm.h"
#include "piper/kernels/cpu/ops.h"

namespace piper::kernels {

void router_forward(float* scores, int32_t* topk_idx, float* topk_w, float* aux_loss, const float* x, const float* wr,
                    const float* bias, int64_t n, int64_t d, const RouterConfig& cfg) {
  linear_forward(scores, x, wr, n, d, cfg.num_experts);
  ref::router_select<float>(scores, topk_idx, topk_w, aux_loss, bias, n, cfg);
}

void router_backward_input(float* dx, float* dlogits, const float* dtopk_w, const float* scores,
                           const int32_t* topk_idx, const float* topk_w, const float* wr, int64_t n, int64_t d,
                           const RouterConfig& cfg) {
  ref::router_dlogits<float>(dlogits, dtopk_w, scores, topk_idx, topk_w, n, cfg);
  linear_backward_input(dx, dlogits, wr, n, d, cfg.num_experts);
}

void router_backward_weight(float* dwr, const float* dlogits, const float* x, int64_t n, int64_t d,
                            const RouterConfig& cfg) {
  linear_backward_weight(dwr, dlogits, x, n, d, cfg.num_experts);
}

void permute_forward(float* xp, const float* x, const Routing& r, int64_t d) {
  const int64_t rows = r.num_tokens * r.top_k;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const float* src = x + r.token_of_row[row] * d;
    for (int64_t c = 0; c < d; ++c) xp[row * d + c] = src[c];
  }
}

void permute_backward_input(float* dx, const float* dxp, const Routing& r, int64_t d) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < r.num_tokens; ++t) {
    float* dst = dx + t * d;
    for (int64_t c = 0; c < d; ++c) dst[c] = 0.0f;
    for (int j = 0; j < r.top_k; ++j) {
      const float* src = dxp + r.row_of_slot[t * r.top_k + j] * d;
      for (int64_t c = 0; c < d; ++c) dst[c] += src[c];
    }
  }
}

void unpermute_forward(float* y, const float* yp, const float* topk_w, const Routing& r, int64_t d) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < r.num_tokens; ++t) {
    float* dst = y + t * d;
    for (int64_t c = 0; c < d; ++c) dst[c] = 0.0f;
    for (int j = 0; j < r.top_k; ++j) {
      const float w = topk_w[t * r.top_k + j];
      const float* src = yp + r.row_of_slot[t * r.top_k + j] * d;
      for (int64_t c = 0; c < d; ++c) dst[c] += w * src[c];
    }
  }
}

void unpermute_backward_input(float* dyp, float* dtopk_w, const float* dy, const float* yp, const float* topk_w,
                              const Routing& r, int64_t d) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < r.num_tokens; ++t) {
    for (int j = 0; j < r.top_k; ++j) {
      const int64_t row = r.row_of_slot[t * r.top_k + j];
      const float w = topk_w[t * r.top_k + j];
      float dot = 0;
      for (int64_t c = 0; c < d; ++c) {
        dyp[row * d + c] = w * dy[t * d + c];
        dot += dy[t * d + c] * yp[row * d + c];
      }
      dtopk_w[t * r.top_k + j] = dot;
    }
  }
}

void grouped_linear_forward(float* y, const float* x, const float* w, const Routing& r, int64_t in, int64_t out) {
#pragma omp parallel for schedule(static) if (gemm_nests_in_threads())
  for (int e = 0; e < r.num_experts; ++e) {
    const int64_t off = r.expert_offsets[e];
    linear_forward(y + off * out, x + off * in, w + e * out * in, r.count(e), in, out);
  }
}

void grouped_linear_backward_input(float* dx, const float* dy, const float* w, const Routing& r, int64_t in,
                                   int64_t out) {
#pragma omp parallel for schedule(static) if (gemm_nests_in_threads())
  for (int e = 0; e < r.num_experts; ++e) {
    const int64_t off = r.expert_offsets[e];
    linear_backward_input(dx + off * in, dy + off * out, w + e * out * in, r.count(e), in, out);
  }
}

void grouped_linear_backward_weight(float* dw, const float* dy, const float* x, const Routing& r, int64_t in,
                                    int64_t out) {
#pragma omp parallel for schedule(static) if (gemm_nests_in_threads())
  for (int e = 0; e < r.num_experts; ++e) {
    if (r.count(e) == 0) continue;
    const int64_t off = r.expert_offsets[e];
    linear_backward_weight(dw + e * out * in, dy + off * out, x + off * in, r.count(e), in, out);
  }
}

void expert_swiglu_forward(float* yp, float* g, float* u, float* h, const float* xp, const float* wg, const float* wu,
                           const float* wd, const Routing& r, int64_t d, int64_t f) {
#pragma omp parallel for schedule(static) if (gemm_nests_in_threads())
  for (int e = 0; e < r.num_experts; ++e) {
    const int64_t off = r.expert_offsets[e];
    swiglu_forward(yp + off * d, g + off * f, u + off * f, h + off * f, xp + off * d, wg + e * f * d, wu + e * f * d,
                   wd + e * d * f, r.count(e), d, f);
  }
}

void expert_swiglu_backward_input(float* dxp, float* dg, float* du, const float* dyp, const float* g, const float* u,
                                  const float* wg, const float* wu, const float* wd, const Routing& r, int64_t d,
                                  int64_t f) {
#pragma omp parallel for schedule(static) if (gemm_nests_in_threads())
  for (int e = 0; e < r.num_experts; ++e) {
    const int64_t off = r.expert_offsets[e];
    swiglu_backward_input(dxp + off * d, dg + off * f, du + off * f, dyp + off * d, g + off * f, u + off * f,
                          wg + e * f * d, wu + e * f * d, wd + e * d * f, r.count(e), d, f);
  }
}

void expert_swiglu_backward_weight(float* dwg, float* dwu, float* dwd, const float* dyp, const float* xp,
                                   const float* h, const float* dg, const float* du, const Routing& r, int64_t d,
                                   int64_t f) {
#pragma omp parallel for schedule(static) if (gemm_nests_in_threads())
  for (int e = 0; e < r.num_experts; ++e) {
    if (r.count(e) == 0) continue;
    const int64_t off = r.expert_offsets[e];
    swiglu_backward_weight(dwg + e * f * d, dwu + e * f * d, dwd + e * d * f, dyp + off * d, xp + off * d, h + off * f,
                           dg + off * f, du + off * f, r.count(e), d, f);
  }
}

}  // namespace piper::kernels
