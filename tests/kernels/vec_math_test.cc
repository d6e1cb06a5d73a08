// vec_math against std:: in double: the exp's ulp bound over the whole normal range, its special values, and the
// row operations (softmax, SwiGLU gate, RMSNorm rows, AdamW) against plain loops.
#include "piper/kernels/cpu/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "fd_util.h"
#include "piper/tensor/rng.h"

namespace piper::kernels::vec {
namespace {

using FVec = std::vector<float>;

using testing::random_vec;

int32_t ordered_bits(float f) {  // monotone in f, so differences count ulps (also across 0)
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i < 0 ? std::numeric_limits<int32_t>::min() - i : i;
}

int64_t ulp_distance(float a, float b) {
  return std::abs(static_cast<int64_t>(ordered_bits(a)) - static_cast<int64_t>(ordered_bits(b)));
}

float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Every 1021st float bit pattern of [-87.33, 88.72] (2.2 million values, both signs, all exponents) plus every
// float of 2^15 consecutive patterns around 0.5, 1, 2, 64 and the cut-offs, in arrays of odd length so the padded
// tail block is exercised too. (Every 7th pattern, 320 million values, measured at most 1 ulp; too slow for CI.)
TEST(VecMathTest, ExpWithinTwoUlpOverTheNormalRange) {
  constexpr float kLo = -87.33654f, kHi = 88.7228317f;
  FVec xs;
  auto add = [&](uint32_t u) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float x = float_from_bits(u | sign);
      if (x >= kLo && x <= kHi) xs.push_back(x);
    }
  };
  for (uint32_t u = 0; u < 0x7f800000u; u += 1021) add(u);
  for (float centre : {0.5f, 1.0f, 2.0f, 64.0f, 87.33f, 88.72f}) {
    uint32_t c;
    std::memcpy(&c, &centre, sizeof c);
    for (uint32_t u = c - (1u << 14); u < c + (1u << 14); ++u) add(u);
  }
  xs.push_back(kLo);
  xs.push_back(kHi);
  xs.push_back(0.0f);
  FVec ys(xs.size());
  const int64_t n = static_cast<int64_t>(xs.size());
  const int64_t chunk = 100003;  // odd: every call has a tail
  for (int64_t i = 0; i < n; i += chunk) exp_array(ys.data() + i, xs.data() + i, std::min(chunk, n - i));
  int64_t max_ulp = 0;
  float worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const float ref = static_cast<float>(std::exp(static_cast<double>(xs[i])));
    const int64_t d = ulp_distance(ys[i], ref);
    if (d > max_ulp) max_ulp = d, worst = xs[i];
  }
  std::printf("exp: %zu values, max error %lld ulp (at x = %.9g)\n", xs.size(), static_cast<long long>(max_ulp), worst);
  EXPECT_LE(max_ulp, 2) << "at x = " << worst;
  EXPECT_EQ(exp_scalar(0.0f), 1.0f);
}

TEST(VecMathTest, ExpSpecialValuesAndTails) {
  const float inf = std::numeric_limits<float>::infinity();
  const FVec xs = {-inf, -1000.0f, -87.5f, -87.3366f, 88.73f, 1000.0f, inf, std::nanf(""), -0.0f, 1.0f};
  FVec ys(xs.size());
  exp_array(ys.data(), xs.data(), static_cast<int64_t>(xs.size()));
  EXPECT_EQ(ys[0], 0.0f);
  EXPECT_EQ(ys[1], 0.0f);
  // Below the normal range the result flushes to 0: absolute error under FLT_MIN.
  EXPECT_LT(std::abs(ys[2] - static_cast<float>(std::exp(-87.5))), std::numeric_limits<float>::min());
  EXPECT_LT(std::abs(ys[3] - static_cast<float>(std::exp(-87.3366))), std::numeric_limits<float>::min());
  EXPECT_EQ(ys[4], inf);
  EXPECT_EQ(ys[5], inf);
  EXPECT_EQ(ys[6], inf);
  EXPECT_TRUE(std::isnan(ys[7]));
  EXPECT_EQ(ys[8], 1.0f);
  EXPECT_LE(ulp_distance(ys[9], static_cast<float>(std::exp(1.0))), 1);
  // Every length (full blocks, tails, both) gives the scalar function's bits, in place too.
  for (int64_t n = 1; n <= 40; ++n) {
    FVec x = random_vec(n, static_cast<uint64_t>(n), 10.0f), y(static_cast<size_t>(n));
    exp_array(y.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], exp_scalar(x[i])) << "n=" << n << " i=" << i;
    exp_array(x.data(), x.data(), n);
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), sizeof(float) * n));
  }
}

TEST(VecMathTest, ReductionsUseSixteenLanesInAFixedOrder) {
  for (int64_t n : {1, 5, 16, 17, 100, 1000}) {
    const FVec x = random_vec(n, 7, 3.0f), y = random_vec(n, 8);
    double sum = 0, dot = 0, ss = 0;
    float mx = x[0];
    for (int64_t i = 0; i < n; ++i) {
      sum += x[i];
      dot += static_cast<double>(x[i]) * y[i];
      ss += static_cast<double>(x[i]) * x[i];
      mx = std::max(mx, x[i]);
    }
    EXPECT_NEAR(sum_array(x.data(), n), sum, 1e-5 * n) << n;
    EXPECT_NEAR(dot_array(x.data(), y.data(), n), dot, 1e-5 * n) << n;
    EXPECT_NEAR(sum_squares_f64(x.data(), n), ss, 1e-12 * ss) << n;
    EXPECT_EQ(max_array(x.data(), n), mx) << n;
  }
  // The summation order is part of the contract. 1 followed by 16 values of 2^-24: a left-to-right float sum
  // rounds every addition back to 1. With 16 lanes, lane 0 holds 1 + 2^-24 (rounds to 1, ties to even) and lanes
  // 1..15 hold 2^-24 each; the tree (l + 8, + 4, + 2, + 1) gives 1 + 2^-23 + 2^-22 + 2^-21 = 1 + 7·2^-23 exactly.
  FVec x(17, std::ldexp(1.0f, -24));
  x[0] = 1.0f;
  EXPECT_EQ(sum_array(x.data(), 17), 1.0f + 7.0f * std::ldexp(1.0f, -23));
}

TEST(VecMathTest, SoftmaxAndItsBackward) {
  for (int64_t n : {1, 3, 16, 33, 256}) {
    FVec x = random_vec(n, 11, 4.0f);
    const FVec x0 = x;
    const SoftmaxStats st = softmax_inplace(x.data(), n, n % 2 == 0);
    double mx = x0[0], sum = 0;
    for (float v : x0) mx = std::max<double>(mx, v);
    for (float v : x0) sum += std::exp(v - mx);
    EXPECT_EQ(st.max, static_cast<float>(mx));
    EXPECT_NEAR(st.sum, sum, 1e-6 * sum);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(x[i], std::exp(x0[i] - mx) / sum, 1e-6) << n << " " << i;
    FVec ds = random_vec(n, 12);
    const FVec ds0 = ds;
    softmax_backward_inplace(ds.data(), x.data(), n, 0.5f);
    double pdp = 0;
    for (int64_t i = 0; i < n; ++i) pdp += static_cast<double>(x[i]) * ds0[i];
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(ds[i], x[i] * (ds0[i] - pdp) * 0.5, 1e-6) << n << " " << i;
  }
}

TEST(VecMathTest, SwigluGateMatchesTheFormula) {
  const int64_t n = 77;
  const FVec g = random_vec(n, 21, 4.0f), u = random_vec(n, 22), dh = random_vec(n, 23);
  FVec h(n), dg(n), du(n);
  swiglu_gate_forward(h.data(), g.data(), u.data(), n);
  swiglu_gate_backward(dg.data(), du.data(), dh.data(), g.data(), u.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(g[i])));
    EXPECT_NEAR(h[i], g[i] * s * u[i], 1e-5 * (1 + std::abs(g[i] * u[i])));
    EXPECT_NEAR(du[i], dh[i] * g[i] * s, 1e-5 * (1 + std::abs(g[i])));
    EXPECT_NEAR(dg[i], dh[i] * u[i] * s * (1 + g[i] * (1 - s)), 1e-5 * (1 + std::abs(g[i])));
  }
  // dg may be dh (the kernels reuse the buffer).
  FVec inplace = dh, du2(n);
  swiglu_gate_backward(inplace.data(), du2.data(), inplace.data(), g.data(), u.data(), n);
  EXPECT_EQ(0, std::memcmp(inplace.data(), dg.data(), sizeof(float) * n));
  EXPECT_EQ(0, std::memcmp(du2.data(), du.data(), sizeof(float) * n));
}

// Element-wise updates: the same operations in the same order as a plain loop, hence the same bits.
TEST(VecMathTest, AdamWAndRmsNormWeightGiveThePlainLoopsBits) {
  const int64_t n = 1001;
  FVec p = random_vec(n, 31), m = random_vec(n, 32, 0.1f), v = random_vec(n, 33, 0.1f);
  for (float& x : v) x = std::abs(x);
  const FVec g = random_vec(n, 34);
  FVec p2 = p, m2 = m, v2 = v;
  const AdamWConstants c{0.9f, 0.95f, 0.1f, 0.05f, 1e-3f, 1e-8f, 0.1f, 0.5f};
  adamw_update(p.data(), g.data(), m.data(), v.data(), n, c);
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * c.grad_scale;
    m2[i] = c.b1 * m2[i] + (1.0f - c.b1) * gi;
    v2[i] = c.b2 * v2[i] + (1.0f - c.b2) * gi * gi;
    const float mhat = m2[i] / c.bc1, vhat = v2[i] / c.bc2;
    p2[i] -= c.lr * (mhat / (std::sqrt(vhat) + c.eps) + c.wd * p2[i]);
  }
  EXPECT_EQ(0, std::memcmp(p.data(), p2.data(), sizeof(float) * n));
  EXPECT_EQ(0, std::memcmp(m.data(), m2.data(), sizeof(float) * n));
  EXPECT_EQ(0, std::memcmp(v.data(), v2.data(), sizeof(float) * n));

  const FVec dy = random_vec(n, 35), x = random_vec(n, 36);
  FVec dw = random_vec(n, 37), dw2 = dw;
  rmsnorm_row_backward_weight(dw.data(), dy.data(), x.data(), 0.7f, n);
  for (int64_t i = 0; i < n; ++i) dw2[i] += dy[i] * x[i] * 0.7f;
  EXPECT_EQ(0, std::memcmp(dw.data(), dw2.data(), sizeof(float) * n));
}

TEST(VecMathTest, RmsNormRows) {
  const int64_t d = 37;
  const FVec x = random_vec(d, 41, 2.0f), w = random_vec(d, 42), dy = random_vec(d, 43);
  FVec y(d), dx(d);
  const float r = rmsnorm_row_forward(y.data(), x.data(), w.data(), d, 1e-5f);
  double ss = 0, dot = 0;
  for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[j]) * x[j];
  const double rr = 1.0 / std::sqrt(ss / d + 1e-5);
  EXPECT_NEAR(r, rr, 1e-6 * rr);
  for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(y[j], x[j] * rr * w[j], 1e-5);
  rmsnorm_row_backward_input(dx.data(), dy.data(), x.data(), w.data(), r, d);
  for (int64_t j = 0; j < d; ++j) dot += static_cast<double>(w[j]) * dy[j] * x[j];
  for (int64_t j = 0; j < d; ++j) EXPECT_NEAR(dx[j], rr * w[j] * dy[j] - rr * rr * rr * dot / d * x[j], 1e-5);
}

}  // namespace
}  // namespace piper::kernels::vec
