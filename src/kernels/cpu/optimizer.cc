#include "piper/kernels/cpu/optimizer.h"

#include <algorithm>
#include <cmath>

#include "piper/base/check.h"
#include "piper/kernels/cpu/vec_math.h"

namespace piper::kernels {
namespace {
constexpr int64_t kNormBlock = 4096;
constexpr int64_t kUpdateBlock = 16384;
}  // namespace

double grad_global_norm(const std::vector<std::pair<const float*, int64_t>>& grads) {
  double total = 0;
  for (const auto& [g, n] : grads) {
    const int64_t num_blocks = (n + kNormBlock - 1) / kNormBlock;
    std::vector<double> partial(static_cast<size_t>(num_blocks), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < num_blocks; ++b) {
      partial[b] = vec::sum_squares_f64(g + b * kNormBlock, std::min(n, (b + 1) * kNormBlock) - b * kNormBlock);
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
  vec::AdamWConstants c;
  c.b1 = static_cast<float>(cfg.beta1);
  c.b2 = static_cast<float>(cfg.beta2);
  c.bc1 = static_cast<float>(1.0 - std::pow(cfg.beta1, static_cast<double>(step)));
  c.bc2 = static_cast<float>(1.0 - std::pow(cfg.beta2, static_cast<double>(step)));
  c.lr = static_cast<float>(cfg.lr);
  c.eps = static_cast<float>(cfg.eps);
  c.wd = apply_decay ? static_cast<float>(cfg.weight_decay) : 0.0f;
  c.grad_scale = static_cast<float>(grad_scale);
  // Element-wise, so blocks on threads give the same bits as one pass.
  const int64_t num_blocks = (n + kUpdateBlock - 1) / kUpdateBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t i = b * kUpdateBlock;
    vec::adamw_update(p + i, g + i, m + i, v + i, std::min(kUpdateBlock, n - i), c);
  }
}

}  // namespace piper::kernels
