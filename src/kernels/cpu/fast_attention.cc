// Fast causal attention: per (batch, kv head) group, the score and value products are GEMMs over the strided
// rows of q, k, v (row stride heads × head_dim). Groups run on OpenMP threads when the GEMM library can be called
// from them; dk and dv of a group are accumulated by one thread over its q heads in order (deterministic).
// Causal blocks: the rows of a head go in blocks of kBlock queries, and each block's GEMMs stop at its last key, so
// the masked half of the square is not computed (executed FLOPs (L/kBlock + 1) / (2 L/kBlock) of the square: 75 %
// at L = 128, 50.8 % at L = 4096, against the 50 % that docs/counting.md counts). 64 rows: at tiny-moe's shape
// (L = 128, head_dim 32, one thread) the forward core took 0.471 ms (0.479 with 32 rows, 0.521 with 16, 0.520
// unblocked) and the backward 0.588 ms (0.591, 0.703, 0.704).
#include <algorithm>
#include <cmath>
#include <vector>

#include "piper/kernels/cpu/gemm.h"
#include "piper/kernels/cpu/ops.h"
#include "piper/kernels/cpu/vec_math.h"

namespace piper::kernels {

namespace {

constexpr int64_t kBlock = 64;  // queries per causal block

// Calls body(r0, r1) for the query blocks [r0, r1) of a sequence of L: the keys of a block are [0, r1).
template <typename Body>
void for_each_block(int64_t L, Body body) {
  for (int64_t r0 = 0; r0 < L; r0 += kBlock) body(r0, std::min(L, r0 + kBlock));
}

// Causal softmax probabilities of one head: p [L, L] = softmax(scale · q kᵀ) per row, zero above the diagonal.
void head_probs(float* p, const float* qb, const float* kb, int64_t L, int64_t hd, int64_t ldq, int64_t ldk,
                float scale) {
  for_each_block(L, [&](int64_t r0, int64_t r1) {
    sgemm(false, true, r1 - r0, r1, hd, scale, qb + r0 * ldq, ldq, kb, ldk, 0.0f, p + r0 * L, L);
  });
  for (int64_t i = 0; i < L; ++i) {
    float* pi = p + i * L;
    vec::softmax_inplace(pi, i + 1, /*reciprocal=*/true);
    std::fill(pi + i + 1, pi + L, 0.0f);
  }
}

// out [L, hd] = p [L, L] · v, the zeros above p's diagonal skipped block by block.
void head_values(float* out, const float* p, const float* vb, int64_t L, int64_t hd, int64_t ldo, int64_t ldk) {
  for_each_block(L, [&](int64_t r0, int64_t r1) {
    sgemm(false, false, r1 - r0, hd, r1, 1.0f, p + r0 * L, L, vb, ldk, 0.0f, out + r0 * ldo, ldo);
  });
}

// d [L, hd] (+)= aᵀ · x for a causal a [L, L] (zero above the diagonal): key block [c0, c1) of d sums the rows of
// a from c0 on.
void head_transposed(float* d, const float* a, const float* x, int64_t L, int64_t hd, int64_t ldx, int64_t ldd,
                     float beta) {
  for_each_block(L, [&](int64_t c0, int64_t c1) {
    sgemm(true, false, c1 - c0, hd, L - c0, 1.0f, a + c0 * L + c0, L, x + c0 * ldx, ldx, beta, d + c0 * ldd, ldd);
  });
}

// Runs body(b, kh) for every (batch, kv head) group, on OpenMP threads when the GEMM library nests in them.
template <typename Body>
void for_each_group(const AttentionShape& s, Body body) {
  const int64_t num_groups = s.batch * s.kv_heads;
#pragma omp parallel for schedule(static) if (gemm_nests_in_threads())
  for (int64_t bg = 0; bg < num_groups; ++bg) body(bg / s.kv_heads, bg % s.kv_heads);
}

}  // namespace

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
                       const AttentionShape& s) {
  const int64_t L = s.seq, hd = s.head_dim, group = s.q_heads / s.kv_heads;
  const int64_t ldq = s.q_heads * hd, ldk = s.kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for_each_group(s, [&](int64_t b, int64_t kh) {
    const float* kb = k + b * L * ldk + kh * hd;
    const float* vb = v + b * L * ldk + kh * hd;
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      float* p = probs + (b * s.q_heads + h) * L * L;
      head_probs(p, q + b * L * ldq + h * hd, kb, L, hd, ldq, ldk, scale);
      head_values(out + b * L * ldq + h * hd, p, vb, L, hd, ldq, ldk);
    }
  });
}

void attention_probs(float* probs, const float* q, const float* k, const AttentionShape& s) {
  const int64_t L = s.seq, hd = s.head_dim, group = s.q_heads / s.kv_heads;
  const int64_t ldq = s.q_heads * hd, ldk = s.kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for_each_group(s, [&](int64_t b, int64_t kh) {
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      head_probs(probs + (b * s.q_heads + h) * L * L, q + b * L * ldq + h * hd, k + b * L * ldk + kh * hd, L, hd, ldq,
                 ldk, scale);
    }
  });
}

void attention_backward_input(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                              const float* v, const float* probs, const AttentionShape& s) {
  const int64_t L = s.seq, hd = s.head_dim, group = s.q_heads / s.kv_heads;
  const int64_t ldq = s.q_heads * hd, ldk = s.kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t num_groups = s.batch * s.kv_heads;
#pragma omp parallel if (gemm_nests_in_threads())
  {
    std::vector<float> ds(static_cast<size_t>(L * L));  // per thread, reused across its groups
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < num_groups; ++bg) {
      const int64_t b = bg / s.kv_heads, kh = bg % s.kv_heads;
      const float* kb = k + b * L * ldk + kh * hd;
      const float* vb = v + b * L * ldk + kh * hd;
      float* dkb = dk + b * L * ldk + kh * hd;
      float* dvb = dv + b * L * ldk + kh * hd;
      for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
        const float* qb = q + b * L * ldq + h * hd;
        const float* dob = dout + b * L * ldq + h * hd;
        const float* p = probs + (b * s.q_heads + h) * L * L;
        for_each_block(L, [&](int64_t r0, int64_t r1) {  // dP
          sgemm(false, true, r1 - r0, r1, hd, 1.0f, dob + r0 * ldq, ldq, vb, ldk, 0.0f, ds.data() + r0 * L, L);
        });
        for (int64_t i = 0; i < L; ++i) {
          float* dsi = ds.data() + i * L;
          vec::softmax_backward_inplace(dsi, p + i * L, i + 1, scale);
          std::fill(dsi + i + 1, dsi + L, 0.0f);
        }
        const float beta = h == kh * group ? 0.0f : 1.0f;  // the first head of the group overwrites dk, dv
        head_values(dq + b * L * ldq + h * hd, ds.data(), kb, L, hd, ldq, ldk);
        head_transposed(dkb, ds.data(), qb, L, hd, ldq, ldk, beta);
        head_transposed(dvb, p, dob, L, hd, ldq, ldk, beta);
      }
    }
  }
}

}  // namespace piper::kernels
