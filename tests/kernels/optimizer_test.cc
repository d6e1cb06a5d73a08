#include "piper/kernels/cpu/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "piper/kernels/cpu/gemm.h"

namespace piper::kernels {
namespace {

TEST(OptimizerTest, AdamWFirstStepByHand) {
  AdamWConfig cfg{0.1, 0.9, 0.99, 1e-8, 0.5};
  std::vector<float> p = {1.0f, -2.0f}, g = {0.5f, -0.25f}, m = {0, 0}, v = {0, 0};
  adamw_step(p.data(), g.data(), m.data(), v.data(), 2, cfg, 1, 1.0, true);
  // Step 1: m̂ = g, v̂ = g², so the update is lr · (sign(g) + wd · p).
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.5 * 1.0), 1e-6);
  EXPECT_NEAR(p[1], -2.0 - 0.1 * (-1.0 + 0.5 * -2.0), 1e-6);
  EXPECT_NEAR(m[0], 0.05, 1e-7);
  EXPECT_NEAR(v[1], 0.01 * 0.0625, 1e-9);
  // No decay, gradient scaled by 0: only m, v decay and p moves by m̂ / sqrt(v̂) of step 2.
  std::vector<float> q = {3.0f};
  std::vector<float> gq = {1.0f}, mq = {0}, vq = {0};
  adamw_step(q.data(), gq.data(), mq.data(), vq.data(), 1, cfg, 1, 1.0, false);
  EXPECT_NEAR(q[0], 3.0 - 0.1, 1e-6);
}

TEST(OptimizerTest, GlobalNormAndClipping) {
  std::vector<float> a(10000, 0.01f), b = {3.0f, 4.0f};
  const double norm = grad_global_norm({{a.data(), 10000}, {b.data(), 2}});
  EXPECT_NEAR(norm, std::sqrt(10000 * 1e-4 + 25.0), 1e-5);
  EXPECT_DOUBLE_EQ(clip_scale(norm, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_scale(norm, 100.0), 1.0);
  EXPECT_NEAR(clip_scale(norm, 1.0) * norm, 1.0, 1e-6);
  set_kernel_threads(1);
  const double one = grad_global_norm({{a.data(), 10000}, {b.data(), 2}});
  set_kernel_threads(2);
  EXPECT_EQ(one, grad_global_norm({{a.data(), 10000}, {b.data(), 2}}));
}

}  // namespace
}  // namespace piper::kernels
