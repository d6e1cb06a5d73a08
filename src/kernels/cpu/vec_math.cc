// Each public function works on blocks of 16 floats held in a GCC vector type (F16), which the compiler lowers to
// one AVX-512, two AVX2 or four SSE registers, depending on the clone that runs. The tail block is padded with a
// neutral value, so every element goes through the same code. Built with -ffp-contract=off
// (src/kernels/CMakeLists.txt): the bits must not depend on which clone runs.
#include "piper/kernels/cpu/vec_math.h"

#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PIPER_VEC_DISPATCH __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PIPER_VEC_DISPATCH
#endif
#define PIPER_VEC_INLINE [[gnu::always_inline]] inline
// Lambdas too: a default-target body is not inlined into an AVX clone otherwise (it would run as SSE code).
#define PIPER_VEC_LAMBDA __attribute__((always_inline))

namespace piper::kernels::vec {
namespace {

constexpr int kLanes = 16;
typedef float F16 __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t I16 __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef double D8 __attribute__((vector_size(8 * sizeof(double))));

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kExpHi = 88.72283172607421875f;  // largest float with exp(x) < FLT_MAX
constexpr float kExpLo = -87.33654022216796875f;  // exp(x) >= FLT_MIN (about) from here up
constexpr float kLog2e = 1.44269502162933349609375f;
constexpr float kLn2Hi = 0.693145751953125f;      // 16 significant bits: n · kLn2Hi is exact for |n| <= 256
constexpr float kLn2Lo = 1.428606765330187045e-06f;
constexpr float kRound = 12582912.0f;             // 1.5 · 2^23: (t + kRound) - kRound rounds t to an integer

PIPER_VEC_INLINE F16 splat(float v) { return F16{} + v; }

PIPER_VEC_INLINE F16 load(const float* x) {
  F16 v;
  std::memcpy(&v, x, sizeof v);
  return v;
}

PIPER_VEC_INLINE void store(float* y, F16 v) { std::memcpy(y, &v, sizeof v); }

// Lanes [0, valid) from x, the rest `pad`.
PIPER_VEC_INLINE F16 load_part(const float* x, int valid, float pad) {
  float b[kLanes];
  for (int l = 0; l < kLanes; ++l) b[l] = l < valid ? x[l] : pad;
  return load(b);
}

PIPER_VEC_INLINE void store_part(float* y, F16 v, int valid) {
  float b[kLanes];
  std::memcpy(b, &v, sizeof v);
  for (int l = 0; l < valid; ++l) y[l] = b[l];
}

PIPER_VEC_INLINE F16 pow2i(I16 e) {  // 2^e for e in [-126, 127]
  const I16 bits = (e + 127) << 23;
  F16 f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

PIPER_VEC_INLINE F16 exp_v(F16 x) {
  F16 xc = x > splat(kExpLo) ? x : splat(kExpLo);  // NaN -> kExpLo (fixed below), keeps the exponent in range
  xc = xc < splat(kExpHi) ? xc : splat(kExpHi);
  const F16 n = (xc * kLog2e + kRound) - kRound;
  const F16 r = (xc - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln2 / 2
  // exp(r) = 1 + r + r² (1/2 + r/6 + ... + r^5/5040): Taylor to degree 7, truncation < 1e-8 relative.
  F16 q = splat(1.0f / 5040.0f);
  q = q * r + 1.0f / 720.0f;
  q = q * r + 1.0f / 120.0f;
  q = q * r + 1.0f / 24.0f;
  q = q * r + 1.0f / 6.0f;
  q = q * r + 0.5f;
  const F16 p = 1.0f + (r + r * r * q);
  const I16 ni = __builtin_convertvector(n, I16);  // in [-126, 128]; split so that both factors are normal
  const I16 n1 = ni >> 1;
  F16 y = p * pow2i(n1) * pow2i(ni - n1);
  y = x < splat(kExpLo) ? splat(0.0f) : y;
  y = x > splat(kExpHi) ? splat(kInf) : y;
  return x != x ? x : y;
}

PIPER_VEC_INLINE F16 sigmoid_v(F16 g) { return 1.0f / (1.0f + exp_v(-g)); }

PIPER_VEC_INLINE F16 sqrt_v(F16 x) {
  for (int l = 0; l < kLanes; ++l) x[l] = std::sqrt(x[l]);
  return x;
}

PIPER_VEC_INLINE float reduce_sum(F16 acc) {
  float a[kLanes];
  std::memcpy(a, &acc, sizeof acc);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) a[l] += a[l + w];
  return a[0];
}

// Calls f(offset, valid) for each block of n; valid < kLanes only for the last.
template <typename F>
PIPER_VEC_INLINE void for_blocks(int64_t n, F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) f(i, kLanes);
  if (i < n) f(i, static_cast<int>(n - i));
}

PIPER_VEC_INLINE F16 load_at(const float* x, int64_t i, int valid, float pad) {
  return valid == kLanes ? load(x + i) : load_part(x + i, valid, pad);
}

PIPER_VEC_INLINE void store_at(float* y, int64_t i, int valid, F16 v) {
  if (valid == kLanes) {
    store(y + i, v);
  } else {
    store_part(y + i, v, valid);
  }
}

}  // namespace

float exp_scalar(float x) {
  float b[kLanes] = {x};
  const F16 y = exp_v(load(b));
  return y[0];
}

PIPER_VEC_DISPATCH void exp_array(float* y, const float* x, int64_t n) {
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA { store_at(y, i, valid, exp_v(load_at(x, i, valid, 0.0f))); });
}

PIPER_VEC_DISPATCH float sum_array(const float* x, int64_t n) {
  F16 acc = splat(0.0f);
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA { acc += load_at(x, i, valid, 0.0f); });
  return reduce_sum(acc);
}

PIPER_VEC_DISPATCH float max_array(const float* x, int64_t n) {
  F16 acc = splat(x[0]);
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    const F16 b = load_at(x, i, valid, x[0]);
    acc = b > acc ? b : acc;
  });
  float a[kLanes];
  std::memcpy(a, &acc, sizeof acc);
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) a[l] = a[l + w] > a[l] ? a[l + w] : a[l];
  return a[0];
}

PIPER_VEC_DISPATCH float dot_array(const float* x, const float* y, int64_t n) {
  F16 acc = splat(0.0f);
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA { acc += load_at(x, i, valid, 0.0f) * load_at(y, i, valid, 0.0f); });
  return reduce_sum(acc);
}

PIPER_VEC_DISPATCH double sum_squares_f64(const float* x, int64_t n) {
  D8 lo = D8{}, hi = D8{};  // lanes 0-7 and 8-15
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    const F16 b = load_at(x, i, valid, 0.0f);
    D8 bl, bh;
    for (int l = 0; l < 8; ++l) {
      bl[l] = static_cast<double>(b[l]);
      bh[l] = static_cast<double>(b[l + 8]);
    }
    lo += bl * bl;
    hi += bh * bh;
  });
  double a[kLanes];
  for (int l = 0; l < 8; ++l) {
    a[l] = lo[l];
    a[l + 8] = hi[l];
  }
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) a[l] += a[l + w];
  return a[0];
}

PIPER_VEC_DISPATCH SoftmaxStats softmax_inplace(float* x, int64_t n, bool reciprocal) {
  const float mx = max_array(x, n);
  F16 acc = splat(0.0f);
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    const F16 e = exp_v(load_at(x, i, valid, -kInf) - mx);  // padding: exp(-inf) = 0 adds nothing
    acc += e;
    store_at(x, i, valid, e);
  });
  const float sum = reduce_sum(acc);
  if (reciprocal) {
    const float inv = 1.0f / sum;
    for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA { store_at(x, i, valid, load_at(x, i, valid, 0.0f) * inv); });
  } else {
    for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA { store_at(x, i, valid, load_at(x, i, valid, 0.0f) / sum); });
  }
  return {mx, sum};
}

PIPER_VEC_DISPATCH void softmax_backward_inplace(float* ds, const float* p, int64_t n, float scale) {
  const float pdp = dot_array(p, ds, n);
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    store_at(ds, i, valid, load_at(p, i, valid, 0.0f) * (load_at(ds, i, valid, 0.0f) - pdp) * scale);
  });
}

PIPER_VEC_DISPATCH void swiglu_gate_forward(float* h, const float* g, const float* u, int64_t n) {
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    const F16 a = load_at(g, i, valid, 0.0f);
    store_at(h, i, valid, a * sigmoid_v(a) * load_at(u, i, valid, 0.0f));
  });
}

PIPER_VEC_DISPATCH void swiglu_gate_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                                             int64_t n) {
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    const F16 a = load_at(g, i, valid, 0.0f), b = load_at(u, i, valid, 0.0f), d = load_at(dh, i, valid, 0.0f);
    const F16 sig = sigmoid_v(a);
    store_at(du, i, valid, d * a * sig);
    store_at(dg, i, valid, d * b * sig * (1.0f + a * (1.0f - sig)));
  });
}

PIPER_VEC_DISPATCH float rmsnorm_row_forward(float* y, const float* x, const float* w, int64_t d, float eps) {
  const float ss = dot_array(x, x, d);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  for_blocks(d, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    store_at(y, i, valid, load_at(x, i, valid, 0.0f) * r * load_at(w, i, valid, 0.0f));
  });
  return r;
}

PIPER_VEC_DISPATCH void rmsnorm_row_backward_input(float* dx, const float* dy, const float* x, const float* w, float r,
                                                   int64_t d) {
  F16 acc = splat(0.0f);
  for_blocks(d, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    acc += load_at(w, i, valid, 0.0f) * load_at(dy, i, valid, 0.0f) * load_at(x, i, valid, 0.0f);
  });
  const float c = r * r * r * reduce_sum(acc) / static_cast<float>(d);
  for_blocks(d, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    store_at(dx, i, valid,
             r * load_at(w, i, valid, 0.0f) * load_at(dy, i, valid, 0.0f) - c * load_at(x, i, valid, 0.0f));
  });
}

PIPER_VEC_DISPATCH void rmsnorm_row_backward_weight(float* dw, const float* dy, const float* x, float r, int64_t d) {
  for_blocks(d, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    store_at(dw, i, valid,
             load_at(dw, i, valid, 0.0f) + load_at(dy, i, valid, 0.0f) * load_at(x, i, valid, 0.0f) * r);
  });
}

PIPER_VEC_DISPATCH void add_arrays(float* dst, const float* a, const float* b, int64_t n) {
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    store_at(dst, i, valid, load_at(a, i, valid, 0.0f) + load_at(b, i, valid, 0.0f));
  });
}

PIPER_VEC_DISPATCH void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConstants& c) {
  const float b1 = c.b1, b2 = c.b2, bc1 = c.bc1, bc2 = c.bc2, lr = c.lr, eps = c.eps, wd = c.wd, gs = c.grad_scale;
  for_blocks(n, [&](int64_t i, int valid) PIPER_VEC_LAMBDA {
    const F16 gi = load_at(g, i, valid, 0.0f) * gs;
    const F16 mi = b1 * load_at(m, i, valid, 0.0f) + (1.0f - b1) * gi;
    const F16 vi = b2 * load_at(v, i, valid, 0.0f) + (1.0f - b2) * gi * gi;
    const F16 pi = load_at(p, i, valid, 0.0f);
    const F16 mhat = mi / bc1, vhat = vi / bc2;
    store_at(p, i, valid, pi - lr * (mhat / (sqrt_v(vhat) + eps) + wd * pi));
    store_at(m, i, valid, mi);
    store_at(v, i, valid, vi);
  });
}

}  // namespace piper::kernels::vec
