// The host-side parts of the CUDA backend, on the CPU (runs in every build): grouped-GEMM problem lists
// against the reference grouped GEMMs, the embedding backward plan, bf16 rounding, the launch arithmetic and
// the validity of the GPU tests' tolerance bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "fd_util.h"
#include "piper/kernels/cpu/moe_reference.h"
#include "piper/kernels/cpu/reference.h"
#include "piper/kernels/cuda/attn_tiling.h"
#include "piper/kernels/cuda/host_plan.h"
#include "piper/tensor/rng.h"

namespace piper::kernels::cuda {
namespace {

using FVec = std::vector<float>;

using testing::random_vec;

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
  EXPECT_EQ(tiling::key_tiles(0, 5), 1);                    // a short sequence: one partial tile
  EXPECT_EQ(tiling::key_tiles(16, 100), 2);                 // queries 16..31 see keys 0..31
  EXPECT_EQ(tiling::key_tiles(96, 100), 7);                 // queries 96..99 see keys 0..99
  EXPECT_EQ(tiling::causal_keys(5, 0), 6);
  EXPECT_EQ(tiling::causal_keys(5, 16), 0);
  EXPECT_EQ(tiling::causal_keys(40, 16), 16);
  EXPECT_EQ(tiling::causal_queries_begin(20, 16), 4);
  EXPECT_EQ(tiling::causal_queries_end(96, 100), 4);
}

// The three attention kernels' loops (attention.cu) run serially on the CPU with the same tiling helpers and
// online softmax: blocks of kQTile rows, key/query tiles of kKTile rows, causal bounds, GQA head mapping. The
// warp reductions become plain sums. Checks the index math against the reference attention.
struct EmulatedAttention {
  AttentionShape s;
  FVec out, lse, dq, dk, dv;
};

EmulatedAttention emulate_attention(const AttentionShape& s, const FVec& q, const FVec& k, const FVec& v,
                                    const FVec& dout) {
  using namespace tiling;
  EmulatedAttention r;
  r.s = s;
  const int64_t hd = s.head_dim, group = s.q_heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  r.out.assign(q.size(), NAN), r.dq.assign(q.size(), NAN), r.dk.assign(k.size(), NAN), r.dv.assign(v.size(), NAN);
  r.lse.assign(static_cast<size_t>(s.batch * s.q_heads * s.seq), NAN);
  FVec dsum(r.lse.size(), NAN);
  auto dot = [&](const float* a, const float* b) {
    float t = 0;
    for (int64_t c = 0; c < hd; ++c) t += a[c] * b[c];
    return t;
  };
  const int64_t blocks = (s.seq + kQTile - 1) / kQTile;
  // forward and dq: grid (blocks, batch * q_heads)
  for (int64_t bh = 0; bh < s.batch * s.q_heads; ++bh) {
    const int64_t b = bh / s.q_heads, h = bh % s.q_heads, hk = h / group;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t q0 = blk * kQTile;
      for (int64_t row = 0; row < kQTile; ++row) {
        const int64_t i = q0 + row;
        if (i >= s.seq) continue;
        const float* qi = q.data() + qkv_offset(b, i, s.q_heads, h, s.seq, hd);
        OnlineSoftmax sm;
        FVec acc(static_cast<size_t>(hd), 0.0f);
        for (int64_t tile = 0; tile < key_tiles(q0, s.seq); ++tile) {
          const int64_t k0 = tile * kKTile;
          for (int64_t jr = 0; jr < causal_keys(i, k0); ++jr) {
            const int64_t j = k0 + jr;
            float corr;
            const float p = sm.update(dot(qi, k.data() + qkv_offset(b, j, s.kv_heads, hk, s.seq, hd)) * scale, &corr);
            const float* vj = v.data() + qkv_offset(b, j, s.kv_heads, hk, s.seq, hd);
            for (int64_t c = 0; c < hd; ++c) acc[c] = acc[c] * corr + p * vj[c];
          }
        }
        for (int64_t c = 0; c < hd; ++c) r.out[qkv_offset(b, i, s.q_heads, h, s.seq, hd) + c] = acc[c] / sm.l;
        r.lse[bh * s.seq + i] = sm.lse();
      }
    }
  }
  for (int64_t bh = 0; bh < s.batch * s.q_heads; ++bh) {
    const int64_t b = bh / s.q_heads, h = bh % s.q_heads, hk = h / group;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t q0 = blk * kQTile;
      for (int64_t row = 0; row < kQTile; ++row) {
        const int64_t i = q0 + row;
        if (i >= s.seq) continue;
        const int64_t base = qkv_offset(b, i, s.q_heads, h, s.seq, hd);
        const float D = dot(dout.data() + base, r.out.data() + base), L = r.lse[bh * s.seq + i];
        dsum[bh * s.seq + i] = D;
        FVec acc(static_cast<size_t>(hd), 0.0f);
        for (int64_t tile = 0; tile < key_tiles(q0, s.seq); ++tile) {
          const int64_t k0 = tile * kKTile;
          for (int64_t jr = 0; jr < causal_keys(i, k0); ++jr) {
            const float* kj = k.data() + qkv_offset(b, k0 + jr, s.kv_heads, hk, s.seq, hd);
            const float* vj = v.data() + qkv_offset(b, k0 + jr, s.kv_heads, hk, s.seq, hd);
            const float p = std::exp(dot(q.data() + base, kj) * scale - L);
            const float ds = p * (dot(dout.data() + base, vj) - D);
            for (int64_t c = 0; c < hd; ++c) acc[c] += ds * kj[c];
          }
        }
        for (int64_t c = 0; c < hd; ++c) r.dq[base + c] = acc[c] * scale;
      }
    }
  }
  // dk, dv: grid (blocks, batch * kv_heads); a block owns kQTile key rows.
  for (int64_t bk = 0; bk < s.batch * s.kv_heads; ++bk) {
    const int64_t b = bk / s.kv_heads, hk = bk % s.kv_heads;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t j0 = blk * kQTile;
      for (int64_t row = 0; row < kQTile; ++row) {
        const int64_t j = j0 + row;
        if (j >= s.seq) continue;
        const int64_t kb = qkv_offset(b, j, s.kv_heads, hk, s.seq, hd);
        FVec dka(static_cast<size_t>(hd), 0.0f), dva(static_cast<size_t>(hd), 0.0f);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = hk * group + g, bh = b * s.q_heads + h;
          for (int64_t tile = first_query_tile(j0); tile < query_tiles(s.seq); ++tile) {
            const int64_t i0 = tile * kKTile;
            for (int64_t ir = causal_queries_begin(j, i0); ir < causal_queries_end(i0, s.seq); ++ir) {
              const int64_t i = i0 + ir, qb = qkv_offset(b, i, s.q_heads, h, s.seq, hd);
              const float p = std::exp(dot(q.data() + qb, k.data() + kb) * scale - r.lse[bh * s.seq + i]);
              const float ds = p * (dot(dout.data() + qb, v.data() + kb) - dsum[bh * s.seq + i]);
              for (int64_t c = 0; c < hd; ++c) dva[c] += p * dout[qb + c], dka[c] += ds * q[qb + c];
            }
          }
        }
        for (int64_t c = 0; c < hd; ++c) r.dk[kb + c] = dka[c] * scale, r.dv[kb + c] = dva[c];
      }
    }
  }
  return r;
}

TEST(CudaAttentionTiling, EmulatedKernelsMatchTheReference) {
  for (const AttentionShape s : {AttentionShape{2, 37, 4, 2, 8}, AttentionShape{1, 16, 3, 1, 6},
                                 AttentionShape{1, 50, 2, 2, 4}, AttentionShape{1, 1, 2, 1, 4}}) {
    const int64_t qn = s.batch * s.seq * s.q_heads * s.head_dim, kn = s.batch * s.seq * s.kv_heads * s.head_dim;
    const FVec q = random_vec(qn, 1), k = random_vec(kn, 2), v = random_vec(kn, 3), dout = random_vec(qn, 4);
    FVec out(static_cast<size_t>(qn)), probs(static_cast<size_t>(s.batch * s.q_heads * s.seq * s.seq));
    FVec dq(out.size()), dk(static_cast<size_t>(kn)), dv(dk.size());
    ref::attention_forward<float>(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
    ref::attention_backward_input<float>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                         probs.data(), s);
    const EmulatedAttention e = emulate_attention(s, q, k, v, dout);
    const std::string shape =
        "seq " + std::to_string(s.seq) + " heads " + std::to_string(s.q_heads) + "/" + std::to_string(s.kv_heads);
    expect_near_all(e.out, out, 2e-5f, ("out " + shape).c_str());
    expect_near_all(e.dq, dq, 2e-5f, ("dq " + shape).c_str());
    expect_near_all(e.dk, dk, 2e-5f, ("dk " + shape).c_str());
    expect_near_all(e.dv, dv, 2e-5f, ("dv " + shape).c_str());
  }
}

}  // namespace
}  // namespace piper::kernels::cuda
