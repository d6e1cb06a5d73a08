// Helpers for the kernel tests: finite differences for the double-precision gradient tests, random fp32 inputs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "piper/tensor/rng.h"

namespace piper::kernels::testing {

using Vec = std::vector<double>;

// n fp32 normal values of standard deviation `scale`, the first n of stream `seed`.
inline std::vector<float> random_vec(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  fill_normal(v.data(), n, Rng(seed), 0, 0.0f, scale);
  return v;
}

// Normal random vectors from one seeded, counter-based stream.
class RandomSource {
 public:
  explicit RandomSource(uint64_t seed) : rng_(seed) {}
  Vec normal(int64_t n, double scale = 1.0) {
    Vec v(static_cast<size_t>(n));
    fill_normal(v.data(), n, rng_, rng_.reserve(static_cast<uint64_t>(n)), 0.0, scale);
    return v;
  }

 private:
  Rng rng_;
};

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks analytic[i] against the central difference of loss() in x[i] for every element (x restored after).
inline void expect_grad(const std::string& what, Vec* x, const Vec& analytic, const std::function<double()>& loss,
                        double h = 1e-5) {
  ASSERT_EQ(x->size(), analytic.size()) << what;
  for (size_t i = 0; i < x->size(); ++i) {
    const double keep = (*x)[i];
    (*x)[i] = keep + h;
    const double up = loss();
    (*x)[i] = keep - h;
    const double down = loss();
    (*x)[i] = keep;
    const double numeric = (up - down) / (2 * h);
    const double tol = 1e-7 + 1e-5 * std::max(std::abs(numeric), std::abs(analytic[i]));
    EXPECT_NEAR(analytic[i], numeric, tol) << what << "[" << i << "]";
  }
}

}  // namespace piper::kernels::testing
