// Fast causal attention: per (batch, kv head) group, the score and value products are GEMMs over the strided
// rows of q, k, v (row stride heads × head_dim). Groups run on OpenMP threads when the GEMM library can be called
// from them; dk and dv of a group are accumulated by one thread over its q heads in order (deterministic).
#include <algorithm>
#include <cmath>
#include <vector>

#include "piper/kernels/cpu/gemm.h"
#include "piper/kernels/cpu/ops.h"
#include "piper/kernels/cpu/vec_math.h"

namespace piper::kernels {

namespace {

// Causal softmax probabilities of one head: p [L, L] = softmax(scale · q kᵀ) per row, zero above the diagonal.
void head_probs(float* p, const float* qb, const float* kb, int64_t L, int64_t hd, int64_t ldq, int64_t ldk,
                float scale) {
  sgemm(false, true, L, L, hd, scale, qb, ldq, kb, ldk, 0.0f, p, L);
  for (int64_t i = 0; i < L; ++i) {
    float* pi = p + i * L;
    vec::softmax_inplace(pi, i + 1, /*reciprocal=*/true);
    std::fill(pi + i + 1, pi + L, 0.0f);
  }
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
      sgemm(false, false, L, hd, L, 1.0f, p, L, vb, ldk, 0.0f, out + b * L * ldq + h * hd, ldq);
    }
  });
}

void attention_probs(float* probs, const float* q, const float* k, const AttentionShape& s) {
  const int64_t L = s.seq, hd = s.head_dim, group = s.q_heads / s.kv_heads;
  const int64_t ldq = s.q_heads * hd, ldk = s.kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for_each_group(s, [&](int64_t b, int64_t kh) {
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      head_probs(probs + (b * s.q_heads + h) * L * L, q + b * L * ldq + h * hd, k + b * L * ldk + kh * hd, L, hd,
                 ldq, ldk, scale);
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
        sgemm(false, true, L, L, hd, 1.0f, dob, ldq, vb, ldk, 0.0f, ds.data(), L);  // dP
        for (int64_t i = 0; i < L; ++i) {
          float* dsi = ds.data() + i * L;
          vec::softmax_backward_inplace(dsi, p + i * L, i + 1, scale);
          std::fill(dsi + i + 1, dsi + L, 0.0f);
        }
        const float beta = h == kh * group ? 0.0f : 1.0f;  // the first head of the group overwrites dk, dv
        sgemm(false, false, L, hd, L, 1.0f, ds.data(), L, kb, ldk, 0.0f, dq + b * L * ldq + h * hd, ldq);
        sgemm(true, false, L, hd, L, 1.0f, ds.data(), L, qb, ldq, beta, dkb, ldk);
        sgemm(true, false, L, hd, L, 1.0f, p, L, dob, ldq, beta, dvb, ldk);
      }
    }
  }
}

}  // namespace piper::kernels
