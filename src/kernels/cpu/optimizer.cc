#include "piper/kernels/cpu/optimizer.h"

#include <cmath>

#include "piper/base/check.h"

namespace piper::kernels {
namespace {
constexpr int64_t kNormBlock = 4096;
}  // namespace

double grad_global_norm(const std::vector<std::pair<const float*, int64_t>>& grads) {
  double total = 0;
  for (const auto& [g, n] : grads) {
    const int64_t num_blocks = (n + kNormBlock - 1) / kNormBlock;
    std::vector<double> partial(static_cast<size_t>(num_blocks), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < num_blocks; ++b) {
      double s = 0;
      const int64_t end = std::min(n, (b + 1) * kNormBlock);
      for (int64_t i = b * kNormBlock; i < end; ++i) s += static_cast<double>(g[i]) * g[i];
      partial[b] = s;
    }
    for (double s : partial) total += s;
  }
  return std::sqrt(total);
}

double clip_scale(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConfig& cfg, int64_t step,
                double grad_scale, bool apply_decay) {
  PIPER_CHECK(step >= 1, "adamw step counts from 1, got ", step);
  const float b1 = static_cast<float>(cfg.beta1), b2 = static_cast<float>(cfg.beta2);
  const float bc1 = static_cast<float>(1.0 - std::pow(cfg.beta1, static_cast<double>(step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(cfg.beta2, static_cast<double>(step)));
  const float lr = static_cast<float>(cfg.lr), eps = static_cast<float>(cfg.eps);
  const float wd = apply_decay ? static_cast<float>(cfg.weight_decay) : 0.0f;
  const float gs = static_cast<float>(grad_scale);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * gs;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float mhat = m[i] / bc1, vhat = v[i] / bc2;
    p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

}  // namespace piper::kernels
