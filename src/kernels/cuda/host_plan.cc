#include "piper/kernels/cuda/host_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "piper/base/check.h"
#include "piper/kernels/cpu/reference.h"

namespace piper::kernels::cuda {

std::vector<GemmProblem> expert_forward_problems(const std::vector<int64_t>& offsets, const uint16_t* x,
                                                 const uint16_t* w, float* y, int64_t in, int64_t out) {
  std::vector<GemmProblem> ps;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    GemmProblem p;
    p.trans_a = false, p.trans_b = true;
    p.m = rows, p.n = out, p.k = in;
    p.a = x + offsets[e] * in, p.lda = in;
    p.b = w + static_cast<int64_t>(e) * out * in, p.ldb = in;
    p.c = y + offsets[e] * out, p.ldc = out;
    ps.push_back(p);
  }
  return ps;
}

std::vector<GemmProblem> expert_backward_input_problems(const std::vector<int64_t>& offsets, const uint16_t* dy,
                                                        const uint16_t* w, float* dx, int64_t in, int64_t out,
                                                        float beta) {
  std::vector<GemmProblem> ps;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    GemmProblem p;
    p.trans_a = false, p.trans_b = false;
    p.m = rows, p.n = in, p.k = out;
    p.a = dy + offsets[e] * out, p.lda = out;
    p.b = w + static_cast<int64_t>(e) * out * in, p.ldb = in;
    p.beta = beta;
    p.c = dx + offsets[e] * in, p.ldc = in;
    ps.push_back(p);
  }
  return ps;
}

std::vector<GemmProblem> expert_backward_weight_problems(const std::vector<int64_t>& offsets, const uint16_t* dy,
                                                         const uint16_t* x, float* dw, int64_t in, int64_t out) {
  std::vector<GemmProblem> ps;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (rows <= 0) continue;
    GemmProblem p;
    p.trans_a = true, p.trans_b = false;
    p.m = out, p.n = in, p.k = rows;
    p.a = dy + offsets[e] * out, p.lda = out;
    p.b = x + offsets[e] * in, p.ldb = in;
    p.beta = 1;
    p.c = dw + static_cast<int64_t>(e) * out * in, p.ldc = in;
    ps.push_back(p);
  }
  return ps;
}

namespace {
// The elements of a stored operand: op(X) is [rows, cols]; stored [cols, rows] when transposed.
std::vector<float> widen(const uint16_t* x, bool trans, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t stored_rows = trans ? cols : rows;
  std::vector<float> out(static_cast<size_t>(stored_rows * ld));
  for (int64_t i = 0; i < stored_rows; ++i) {
    for (int64_t j = 0; j < ld; ++j) out[i * ld + j] = from_bf16(x[i * ld + j]);
  }
  return out;
}
}  // namespace

void run_problems_on_host(const std::vector<GemmProblem>& problems) {
  for (const GemmProblem& p : problems) {
    const std::vector<float> a = widen(p.a, p.trans_a, p.m, p.k, p.lda);
    const std::vector<float> b = widen(p.b, p.trans_b, p.k, p.n, p.ldb);
    ref::gemm<float>(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a.data(), p.lda, b.data(), p.ldb, p.beta, p.c,
                     p.ldc);
  }
}

EmbeddingPlan build_embedding_plan(const int32_t* ids, int64_t n, int64_t vocab) {
  EmbeddingPlan plan;
  plan.offsets.assign(static_cast<size_t>(vocab + 1), 0);
  for (int64_t i = 0; i < n; ++i) {
    PIPER_CHECK(ids[i] >= 0 && ids[i] < vocab, "token id ", ids[i], " at position ", i, " outside [0, ", vocab, ")");
    ++plan.offsets[ids[i] + 1];
  }
  for (int64_t v = 0; v < vocab; ++v) plan.offsets[v + 1] += plan.offsets[v];
  std::vector<int64_t> next(plan.offsets.begin(), plan.offsets.end() - 1);
  plan.tokens.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) plan.tokens[next[ids[i]]++] = i;
  return plan;
}

uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = to_bf16(x[i]);
  return out;
}

std::vector<float> round_bf16(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = from_bf16(to_bf16(x[i]));
  return out;
}

int64_t grid_size(int64_t n, int threads, int64_t max_blocks) {
  if (n <= 0) return 1;
  return std::min((n + threads - 1) / threads, max_blocks);
}

double bf16_gemm_tolerance(double sum_abs, int64_t k) {
  const double product = 2 * kBf16Unit + kBf16Unit * kBf16Unit;
  return (product + 2.02 * static_cast<double>(k) * kFp32Unit) * sum_abs + 1e-30;
}

double fp32_tolerance(double sum_abs, int64_t len, double ref, double ulps) {
  return 2.02 * static_cast<double>(len) * kFp32Unit * sum_abs + ulps * kFp32Unit * std::fabs(ref) + 1e-30;
}

}  // namespace piper::kernels::cuda
