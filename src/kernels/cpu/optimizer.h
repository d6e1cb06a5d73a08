// AdamW with decoupled weight decay, and global-norm gradient clipping.
//
// One step over all parameter tensors of a rank:
//   norm  = grad_global_norm(all gradients)            (double, fixed summation order)
//   scale = clip_scale(norm, max_norm)                 (1 when max_norm <= 0 or norm <= max_norm)
//   adamw_step(p, g, m, v, ...) for each tensor        (g is multiplied by scale inside)
// Deterministic: the norm sums fixed-size blocks in index order, whatever the thread count.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace piper::kernels {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// sqrt(sum of g² over all tensors). Each entry is (pointer, element count).
double grad_global_norm(const std::vector<std::pair<const float*, int64_t>>& grads);
double clip_scale(double norm, double max_norm);

// step counts from 1. m, v are the first and second moments (zero before step 1).
// p -= lr · (m̂ / (sqrt(v̂) + eps) + weight_decay · p), with m̂ = m / (1 - β1^step), v̂ = v / (1 - β2^step).
// apply_decay = false for parameters that must not decay (norm weights, biases, by convention).
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConfig& cfg, int64_t step,
                double grad_scale, bool apply_decay);

}  // namespace piper::kernels
