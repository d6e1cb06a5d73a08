// Reference causal attention (MHA/GQA/MQA), forward and input gradients.
#include <cmath>
#include <vector>

#include "piper/base/check.h"
#include "piper/kernels/cpu/reference.h"

namespace piper::kernels::ref {

template <typename T>
void attention_forward(T* out, T* probs, const T* q, const T* k, const T* v, const AttentionShape& s) {
  PIPER_CHECK(s.kv_heads > 0 && s.q_heads % s.kv_heads == 0, "q_heads ", s.q_heads, " kv_heads ", s.kv_heads);
  const int64_t group = s.q_heads / s.kv_heads, hd = s.head_dim, L = s.seq;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = 0; i < L; ++i) {
        const T* qi = q + ((b * L + i) * s.q_heads + h) * hd;
        T* p = probs + ((b * s.q_heads + h) * L + i) * L;
        T mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const T* kj = k + ((b * L + j) * s.kv_heads + kh) * hd;
          T dot = 0;
          for (int64_t c = 0; c < hd; ++c) dot += qi[c] * kj[c];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        T sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
        for (int64_t j = i + 1; j < L; ++j) p[j] = 0;
        T* oi = out + ((b * L + i) * s.q_heads + h) * hd;
        for (int64_t c = 0; c < hd; ++c) oi[c] = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const T* vj = v + ((b * L + j) * s.kv_heads + kh) * hd;
          for (int64_t c = 0; c < hd; ++c) oi[c] += p[j] * vj[c];
        }
      }
    }
  }
}

template <typename T>
void attention_backward_input(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* probs,
                              const AttentionShape& s) {
  const int64_t group = s.q_heads / s.kv_heads, hd = s.head_dim, L = s.seq;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  const int64_t kv_numel = s.batch * L * s.kv_heads * hd;
  for (int64_t i = 0; i < kv_numel; ++i) dk[i] = dv[i] = 0;
  std::vector<T> ds(static_cast<size_t>(L));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t kh = h / group;
      for (int64_t i = 0; i < L; ++i) {
        const T* p = probs + ((b * s.q_heads + h) * L + i) * L;
        const T* doi = dout + ((b * L + i) * s.q_heads + h) * hd;
        const T* qi = q + ((b * L + i) * s.q_heads + h) * hd;
        // dP_ij = do_i · v_j; dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij).
        T pdp = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const T* vj = v + ((b * L + j) * s.kv_heads + kh) * hd;
          T dot = 0;
          for (int64_t c = 0; c < hd; ++c) dot += doi[c] * vj[c];
          ds[j] = dot;
          pdp += p[j] * dot;
        }
        T* dqi = dq + ((b * L + i) * s.q_heads + h) * hd;
        for (int64_t c = 0; c < hd; ++c) dqi[c] = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const T dsj = p[j] * (ds[j] - pdp) * scale;
          const int64_t kv_off = ((b * L + j) * s.kv_heads + kh) * hd;
          for (int64_t c = 0; c < hd; ++c) {
            dqi[c] += dsj * k[kv_off + c];
            dk[kv_off + c] += dsj * qi[c];
            dv[kv_off + c] += p[j] * doi[c];
          }
        }
      }
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*, const AttentionShape&);
template void attention_forward<double>(double*, double*, const double*, const double*, const double*,
                                        const AttentionShape&);
template void attention_backward_input<float>(float*, float*, float*, const float*, const float*, const float*,
                                              const float*, const float*, const AttentionShape&);
template void attention_backward_input<double>(double*, double*, double*, const double*, const double*, const double*,
                                               const double*, const double*, const AttentionShape&);

}  // namespace piper::kernels::ref
