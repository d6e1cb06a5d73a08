// Host-side parts of the CUDA backend, compiled in every build (no CUDA needed) and unit-tested on the CPU:
// the problem lists of the grouped expert GEMMs, the embedding's backward plan, bf16 rounding as the GPU does
// it, the launch arithmetic of the kernels, and the tolerances the GPU tests compare with.
#pragma once

#include <cstdint>
#include <vector>

#include "piper/kernels/cpu/moe_reference.h"

namespace piper::kernels::cuda {

// One GEMM, row-major like ref::gemm: C[m,n] = alpha · op(A)[m,k] · op(B)[k,n] + beta · C. A and B are bf16
// (bit patterns), C fp32.
struct GemmProblem {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const uint16_t* a = nullptr;
  int64_t lda = 0;
  const uint16_t* b = nullptr;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// Expert GEMMs over rows grouped by expert (offsets [E + 1], e.g. Routing::expert_offsets); w [E, out, in].
// Experts without rows get no problem (their outputs have no rows; W leaves their gradients unchanged).
//   forward:  y_e[rows_e, out]  = x_e · w_eᵀ
//   backward input:  dx_e[rows_e, in] = dy_e · w_e + beta · dx_e       (beta = 1 adds a second path's gradient)
//   backward weight: dw_e[out, in]   += dy_eᵀ · x_e
std::vector<GemmProblem> expert_forward_problems(const std::vector<int64_t>& offsets, const uint16_t* x,
                                                 const uint16_t* w, float* y, int64_t in, int64_t out);
std::vector<GemmProblem> expert_backward_input_problems(const std::vector<int64_t>& offsets, const uint16_t* dy,
                                                        const uint16_t* w, float* dx, int64_t in, int64_t out,
                                                        float beta);
std::vector<GemmProblem> expert_backward_weight_problems(const std::vector<int64_t>& offsets, const uint16_t* dy,
                                                         const uint16_t* x, float* dw, int64_t in, int64_t out);
// Runs the problems with ref::gemm on host arrays (bf16 operands widened exactly to fp32): the CPU emulation of
// grouped_gemm_bf16, used to test the problem lists.
void run_problems_on_host(const std::vector<GemmProblem>& problems);

// Embedding backward without atomics: the tokens of each id in token order (counting sort).
struct EmbeddingPlan {
  std::vector<int64_t> offsets;  // [vocab + 1]: tokens of id v are tokens[offsets[v] .. offsets[v+1])
  std::vector<int64_t> tokens;   // [n]
};
EmbeddingPlan build_embedding_plan(const int32_t* ids, int64_t n, int64_t vocab);

// bf16 round-to-nearest-even of an fp32 value (NaN stays NaN), as __float2bfloat16_rn does; and back.
uint16_t to_bf16(float x);
float from_bf16(uint16_t b);
std::vector<uint16_t> to_bf16(const std::vector<float>& x);
// x rounded to bf16 and back.
std::vector<float> round_bf16(const std::vector<float>& x);

// Launch arithmetic shared with the kernels: blocks of `threads` covering n elements, capped at max_blocks
// (grid-stride loops cover the rest).
int64_t grid_size(int64_t n, int threads, int64_t max_blocks = 65535LL * 32);
// (The attention kernels' tiling is in attn_tiling.h, shared with the CPU emulation test.)

// ---- tolerances of the GPU tests (docs/gpu.md)
// Unit roundoffs: bf16 keeps 8 significant bits (u = 2^-8), fp32 24 (u = 2^-24).
constexpr double kBf16Unit = 1.0 / 256.0;
constexpr double kFp32Unit = 1.0 / 16777216.0;
// |GPU - CPU| bound of one GEMM output: both operands rounded to bf16 (each product off by <= (2u + u²)|a||b|),
// then a length-k fp32 sum on the GPU and on the CPU (each <= k·u32·Σ|a||b|). sum_abs = Σ_p |a_p||b_p|.
double bf16_gemm_tolerance(double sum_abs, int64_t k);
// |GPU - CPU| bound of an fp32 result reduced over `len` terms on both sides (different orders), sum_abs = Σ|terms|,
// plus `ulps` units of |ref| for the transcendental functions (expf, logf, sqrtf) on the way.
double fp32_tolerance(double sum_abs, int64_t len, double ref, double ulps = 8);

}  // namespace piper::kernels::cuda
