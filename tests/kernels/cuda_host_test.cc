// The host-side parts of the CUDA backend, on the CPU (runs in every build): grouped-GEMM problem lists
// against the reference grouped GEMMs, the embedding backward plan, bf16 rounding, the launch arithmetic and
// the validity of the GPU tests' tolerance bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "piper/kernels/cpu/moe_reference.h"
#include "piper/kernels/cpu/reference.h"
#include "piper/kernels/cuda/host_plan.h"
#include "piper/tensor/rng.h"

namespace piper::kernels::cuda {
namespace {

using FVec = std::vector<float>;

FVec random_vec(int64_t n, uint64_t seed, float scale = 1.0f) {
  FVec v(static_cast<size_t>(n));
  fill_normal(v.data(), n, Rng(seed), 0, 0.0f, scale);
  return v;
}

// Routing over 5 experts where expert 2 gets no rows and the others uneven counts.
Routing test_routing(int64_t n, int k, int E) {
  const int used[4] = {0, 1, 3, 4};
  std::vector<int32_t> idx(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) idx[t * k + j] = used[(t * 7 + j * 3 + t * t) % 4];
  }
  return build_routing(idx.data(), n, k, E);
}

void expect_near_all(const FVec& got, const FVec& want, float rel, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * (1.0f + std::fabs(want[i]))) << what << "[" << i << "]";
  }
}

TEST(CudaHostPlan, ExpertProblemsMatchTheReferenceGroupedGemms) {
  const int64_t n = 23, in = 12, out = 9;
  const int k = 2, E = 5;
  const Routing r = test_routing(n, k, E);
  ASSERT_EQ(r.count(2), 0) << "the test wants an expert without rows";
  const int64_t rows = n * k;
  const FVec x = round_bf16(random_vec(rows * in, 1)), w = round_bf16(random_vec(E * out * in, 2, 0.5f));
  const FVec dy = round_bf16(random_vec(rows * out, 3));
  const auto xb = to_bf16(x), wb = to_bf16(w), dyb = to_bf16(dy);

  FVec y_ref(static_cast<size_t>(rows * out)), y(y_ref.size(), -7.0f);
  ref::grouped_linear_forward<float>(y_ref.data(), x.data(), w.data(), r, in, out);
  const auto fwd = expert_forward_problems(r.expert_offsets, xb.data(), wb.data(), y.data(), in, out);
  EXPECT_EQ(fwd.size(), 4u);  // expert 2 has no rows: no problem
  run_problems_on_host(fwd);
  expect_near_all(y, y_ref, 1e-6f, "forward");

  FVec dx_ref(static_cast<size_t>(rows * in)), dx(dx_ref.size(), 0.5f);
  ref::grouped_linear_backward_input<float>(dx_ref.data(), dy.data(), w.data(), r, in, out);
  for (float& v : dx_ref) v += 0.5f;  // beta = 1 adds to what was there
  run_problems_on_host(expert_backward_input_problems(r.expert_offsets, dyb.data(), wb.data(), dx.data(), in, out, 1));
  expect_near_all(dx, dx_ref, 1e-6f, "backward input (beta 1)");

  FVec dw_ref(static_cast<size_t>(E * out * in), 0.25f), dw(dw_ref.size(), 0.25f);
  ref::grouped_linear_backward_weight<float>(dw_ref.data(), dy.data(), x.data(), r, in, out);
  run_problems_on_host(expert_backward_weight_problems(r.expert_offsets, dyb.data(), xb.data(), dw.data(), in, out));
  expect_near_all(dw, dw_ref, 1e-6f, "backward weight");
  for (int64_t i = 2 * out * in; i < 3 * out * in; ++i) ASSERT_EQ(dw[i], 0.25f) << "expert 2's gradient changed";
}

TEST(CudaHostPlan, ProblemFieldsDescribeRowMajorSlices) {
  const std::vector<int64_t> offsets = {0, 3, 3, 8};
  const uint16_t* x = reinterpret_cast<const uint16_t*>(0x1000);
  const uint16_t* w = reinterpret_cast<const uint16_t*>(0x100000);
  float* y = reinterpret_cast<float*>(0x200000);
  const auto ps = expert_forward_problems(offsets, x, w, y, 16, 4);
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[1].m, 5);
  EXPECT_EQ(ps[1].a, x + 3 * 16);
  EXPECT_EQ(ps[1].b, w + 2 * 4 * 16);  // expert 2 (expert 1 has no rows)
  EXPECT_EQ(ps[1].c, y + 3 * 4);
  EXPECT_DOUBLE_EQ(ps[1].flops(), 2.0 * 5 * 4 * 16);
}

TEST(CudaHostPlan, EmbeddingPlanGivesTheReferenceBackward) {
  const int64_t n = 41, vocab = 13, d = 6;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * i + 3) % 11);  // ids 11, 12 unused
  const EmbeddingPlan plan = build_embedding_plan(ids.data(), n, vocab);
  ASSERT_EQ(plan.offsets.size(), static_cast<size_t>(vocab + 1));
  EXPECT_EQ(plan.offsets[vocab], n);
  EXPECT_EQ(plan.offsets[12], plan.offsets[13]);
  const FVec dout = random_vec(n * d, 5);
  FVec want(static_cast<size_t>(vocab * d), 1.0f), got(want.size(), 1.0f);
  ref::embedding_backward_weight<float>(want.data(), dout.data(), ids.data(), n, vocab, d);
  // The GPU kernel's loop, on the host: for each id, its tokens in order.
  for (int64_t v = 0; v < vocab; ++v) {
    for (int64_t p = plan.offsets[v]; p < plan.offsets[v + 1]; ++p) {
      if (p > plan.offsets[v]) {
        ASSERT_LT(plan.tokens[p - 1], plan.tokens[p]) << "tokens of an id must be in token order";
      }
      ASSERT_EQ(ids[plan.tokens[p]], v);
      for (int64_t j = 0; j < d; ++j) got[v * d + j] += dout[plan.tokens[p] * d + j];
    }
  }
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
}

TEST(CudaHostPlan, Bf16RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);                          // halfway: to the even 1.0
  EXPECT_EQ(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);                      // halfway: to the even 1 + 2^-6
  EXPECT_EQ(to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);  // above halfway: up
  EXPECT_EQ(to_bf16(INFINITY), 0x7f80);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(NAN))));
  EXPECT_EQ(from_bf16(0x3fc0), 1.5f);
  const FVec v = random_vec(10000, 9, 100.0f);
  const FVec r = round_bf16(v);
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_LE(std::fabs(r[i] - v[i]), kBf16Unit * std::fabs(v[i])) << v[i];
  }
}

// The tolerance the GPU GEMM tests use must bound the real error of bf16 operands + fp32 accumulation against
// the CPU's fp32 GEMM of the unrounded operands, and be tight enough to catch a wrong element (O(1) errors).
TEST(CudaHostPlan, Bf16GemmToleranceBoundsTheError) {
  for (int64_t k : {1, 7, 64, 1000, 4096}) {
    const FVec a = random_vec(k, 100 + k), b = random_vec(k, 200 + k);
    const FVec ar = round_bf16(a), br = round_bf16(b);
    float gpu_like = 0, cpu = 0;
    double sum_abs = 0;
    for (int64_t p = 0; p < k; ++p) {
      gpu_like += ar[p] * br[p];
      cpu += a[p] * b[p];
      sum_abs += std::fabs(static_cast<double>(a[p]) * b[p]);
    }
    const double tol = bf16_gemm_tolerance(sum_abs, k);
    EXPECT_LE(std::fabs(static_cast<double>(gpu_like) - cpu), tol) << "k=" << k;
    EXPECT_LT(tol, 0.02 * sum_abs) << "k=" << k << ": the bound is too loose to catch anything";
  }
  EXPECT_GT(fp32_tolerance(10.0, 100, 1.0), 0.0);
  EXPECT_LT(fp32_tolerance(10.0, 100, 1.0), 1e-3);
}

TEST(CudaHostPlan, LaunchArithmetic) {
  EXPECT_EQ(grid_size(0, 256), 1);
  EXPECT_EQ(grid_size(1, 256), 1);
  EXPECT_EQ(grid_size(256, 256), 1);
  EXPECT_EQ(grid_size(257, 256), 2);
  EXPECT_EQ(grid_size(int64_t{1} << 40, 256, 1000), 1000);  // grid-stride loops cover the rest
  EXPECT_EQ(attn_key_tiles(16, 16), 1);
  EXPECT_EQ(attn_key_tiles(17, 16), 2);
  EXPECT_EQ(attn_key_tiles(128, 16), 8);
}

}  // namespace
}  // namespace piper::kernels::cuda
