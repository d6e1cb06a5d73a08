// Reference LM head + cross-entropy.
#include <cmath>

#include "piper/base/check.h"
#include "piper/kernels/cpu/reference.h"

namespace piper::kernels::ref {

template <typename T>
void lm_head_loss_forward(T* loss, T* probs, const T* h, const T* w, const int32_t* targets, int64_t n, int64_t d,
                          int64_t vocab) {
  linear_forward(probs, h, w, n, d, vocab);
  double total = 0;  // the mean over tokens is accumulated in double for every T
  for (int64_t i = 0; i < n; ++i) {
    T* p = probs + i * vocab;
    T mx = p[0];
    for (int64_t c = 1; c < vocab; ++c) mx = std::max(mx, p[c]);
    PIPER_DCHECK(targets[i] >= 0 && targets[i] < vocab);
    const T logit_t = p[targets[i]];
    T sum = 0;
    for (int64_t c = 0; c < vocab; ++c) sum += (p[c] = std::exp(p[c] - mx));
    for (int64_t c = 0; c < vocab; ++c) p[c] /= sum;
    // -log p[target] = log(sum) - (logit - max), exact even when p[target] underflows.
    total += static_cast<double>(std::log(sum)) - static_cast<double>(logit_t - mx);
  }
  *loss = static_cast<T>(n > 0 ? total / static_cast<double>(n) : 0.0);
}

template <typename T>
void lm_head_loss_backward_input(T* dh, T* dlogits, const T* probs, const int32_t* targets, const T* w, T dloss,
                                 int64_t n, int64_t d, int64_t vocab) {
  const T scale = n > 0 ? dloss / static_cast<T>(n) : T(0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < vocab; ++c) dlogits[i * vocab + c] = probs[i * vocab + c] * scale;
    dlogits[i * vocab + targets[i]] -= scale;
  }
  linear_backward_input(dh, dlogits, w, n, d, vocab);
}

template <typename T>
void lm_head_loss_backward_weight(T* dw, const T* dlogits, const T* h, int64_t n, int64_t d, int64_t vocab) {
  linear_backward_weight(dw, dlogits, h, n, d, vocab);
}

template void lm_head_loss_forward<float>(float*, float*, const float*, const float*, const int32_t*, int64_t, int64_t,
                                          int64_t);
template void lm_head_loss_forward<double>(double*, double*, const double*, const double*, const int32_t*, int64_t,
                                           int64_t, int64_t);
template void lm_head_loss_backward_input<float>(float*, float*, const float*, const int32_t*, const float*, float,
                                                 int64_t, int64_t, int64_t);
template void lm_head_loss_backward_input<double>(double*, double*, const double*, const int32_t*, const double*,
                                                  double, int64_t, int64_t, int64_t);
template void lm_head_loss_backward_weight<float>(float*, const float*, const float*, int64_t, int64_t, int64_t);
template void lm_head_loss_backward_weight<double>(double*, const double*, const double*, int64_t, int64_t, int64_t);

}  // namespace piper::kernels::ref
