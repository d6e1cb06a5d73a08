// Vectorised element-wise math for the fast fp32 kernels: an exp of our own (Cody-Waite range reduction and a
// degree-7 polynomial) and the row operations built on it (softmax, SiLU-gated products), plus the reductions and
// row loops of RMSNorm and AdamW.
//
// Speed: each function is compiled for AVX-512, AVX2 and baseline x86-64 and picked once at load time by the CPU's
// features (GCC target_clones); the loops work on blocks of 16 floats that the compiler maps to vector registers.
//
// Bits: every function gives the same bits on every ISA it dispatches to and for any thread count. The code uses
// only IEEE add, mul, div, sqrt and selects (vec_math.cc is built with -ffp-contract=off, so no fused
// multiply-add), and every reduction keeps 16 partial sums: lane l sums elements l, l+16, l+32, ... in index
// order, then lanes are added in a fixed tree (l + 8, l + 4, l + 2, l + 1). Results therefore differ from a
// left-to-right loop in the last bits, but never between runs.
//
// Accuracy of exp (tests/kernels/vec_math_test.cc checks it against std::exp in double): at most 2 ulp where the
// result is a normal float (x in [-87.33, 88.72]); 0 for x < -87.3365 (true result below FLT_MIN: absolute error
// under FLT_MIN), +inf for x > 88.7228, NaN for NaN. Thread-safety: all functions are pure (no shared state).
#pragma once

#include <cstdint>

namespace piper::kernels::vec {

// y[i] = exp(x[i]) for i < n. y may equal x.
void exp_array(float* y, const float* x, int64_t n);
// The same function for one value (same bits as exp_array).
float exp_scalar(float x);

// Reductions over x[0, n) with 16 partial sums (see above). max_array needs n >= 1 and ignores NaN ordering.
float sum_array(const float* x, int64_t n);
float max_array(const float* x, int64_t n);
float dot_array(const float* x, const float* y, int64_t n);
// Sum of squares in double (16 partial double sums), for gradient norms.
double sum_squares_f64(const float* x, int64_t n);

struct SoftmaxStats {
  float max = 0;  // max of the inputs
  float sum = 0;  // sum of exp(x - max)
};
// In place over x[0, n), n >= 1: x = exp(x - max) / sum (multiplied by 1 / sum when `reciprocal`, else divided).
// Returns max and sum (for log-sum-exp).
SoftmaxStats softmax_inplace(float* x, int64_t n, bool reciprocal);
// Softmax backward of one row in place: ds[j] = p[j] · (ds[j] - Σ_k p[k] ds[k]) · scale, for j < n.
void softmax_backward_inplace(float* ds, const float* p, int64_t n, float scale);

// SwiGLU gate: h = silu(g) · u = g · sigmoid(g) · u, sigmoid(g) = 1 / (1 + exp(-g)).
void swiglu_gate_forward(float* h, const float* g, const float* u, int64_t n);
// dh holds dL/dh on entry; out: du = dh · g · σ, dg = dh · u · σ · (1 + g (1 - σ)). dg may equal dh.
void swiglu_gate_backward(float* dg, float* du, const float* dh, const float* g, const float* u, int64_t n);

// One RMSNorm row: y = x · r · w with r = 1 / sqrt(Σx²/d + eps); returns r.
float rmsnorm_row_forward(float* y, const float* x, const float* w, int64_t d, float eps);
// dx = r · (w·dy - x · r² · Σ_j (w_j dy_j x_j) / d).
void rmsnorm_row_backward_input(float* dx, const float* dy, const float* x, const float* w, float r, int64_t d);
// dw[j] += dy[j] · x[j] · r (one row of the weight gradient; rows are added in the caller's order).
void rmsnorm_row_backward_weight(float* dw, const float* dy, const float* x, float r, int64_t d);

// dst[i] = a[i] + b[i]. dst may equal a or b.
void add_arrays(float* dst, const float* a, const float* b, int64_t n);

// AdamW on n elements (constants precomputed by the caller, see optimizer.h):
//   g' = g · grad_scale; m = b1 m + (1 - b1) g'; v = b2 v + (1 - b2) g'²;
//   p -= lr · ((m / bc1) / (sqrt(v / bc2) + eps) + wd · p)
struct AdamWConstants {
  float b1, b2, bc1, bc2, lr, eps, wd, grad_scale;
};
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWConstants& c);

}  // namespace piper::kernels::vec
