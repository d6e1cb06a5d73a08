// Fast fp32 dense kernels: GEMMs on the library, element-wise loops over OpenMP threads (static schedule: each
// element is computed by one thread, so the bits do not depend on the thread count).
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "piper/base/check.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/kernels/cpu/ops.h"
#include "piper/kernels/cpu/vec_math.h"

namespace piper::kernels {
namespace {

inline float gelu(float a) {
  const float c = 0.7978845608028654f;
  return 0.5f * a * (1.0f + std::tanh(c * (a + 0.044715f * a * a * a)));
}

inline float gelu_grad(float a) {
  const float c = 0.7978845608028654f;
  const float th = std::tanh(c * (a + 0.044715f * a * a * a));
  return 0.5f * (1.0f + th) + 0.5f * a * (1.0f - th * th) * c * (1.0f + 3.0f * 0.044715f * a * a);
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t n, int64_t vocab, int64_t d) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) out[i * d + j] = table[ids[i] * d + j];
  }
}

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t n, int64_t d, double eps) {
  const float eps_f = static_cast<float>(eps);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) rstd[i] = vec::rmsnorm_row_forward(y + i * d, x + i * d, w, d, eps_f);
}

void rmsnorm_backward_input(float* dx, const float* dy, const float* x, const float* w, const float* rstd, int64_t n,
                            int64_t d) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) vec::rmsnorm_row_backward_input(dx + i * d, dy + i * d, x + i * d, w, rstd[i], d);
}

void rmsnorm_backward_weight(float* dw, const float* dy, const float* x, const float* rstd, int64_t n, int64_t d) {
  // Column blocks split across threads; each column adds its rows in index order, as the reference does.
  constexpr int64_t kCols = 64;
  const int64_t num_blocks = (d + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t j0 = b * kCols, width = std::min(kCols, d - j0);
    for (int64_t i = 0; i < n; ++i)
      vec::rmsnorm_row_backward_weight(dw + j0, dy + i * d + j0, x + i * d + j0, rstd[i], width);
  }
}

namespace {

struct RotaryTable {
  std::vector<float> cos, sin;  // [seq, head_dim / 2]
};

// Same angles as the reference: sign · pos · theta^(-2i/head_dim), computed in double and rounded to float. The
// tables depend only on their key, so they are built once per process and shared (read-only) by every call.
std::shared_ptr<const RotaryTable> rotary_table(int64_t seq, int64_t head_dim, double theta, double sign) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, double, double>, std::shared_ptr<const RotaryTable>> cache;
  const auto key = std::make_tuple(seq, head_dim, theta, sign);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const int64_t half = head_dim / 2;
  auto table = std::make_shared<RotaryTable>();
  table->cos.resize(static_cast<size_t>(seq * half));
  table->sin.resize(static_cast<size_t>(seq * half));
  for (int64_t t = 0; t < seq; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = sign * static_cast<double>(t) *
                           std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      table->cos[t * half + i] = static_cast<float>(std::cos(angle));
      table->sin[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  cache.emplace(key, table);
  return table;
}

void rotate(float* out, const float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, double theta,
            double sign) {
  PIPER_CHECK(head_dim % 2 == 0, "rotary needs an even head_dim, got ", head_dim);
  const int64_t half = head_dim / 2;
  const std::shared_ptr<const RotaryTable> table = rotary_table(seq, head_dim, theta, sign);
  const float* cos_t = table->cos.data();
  const float* sin_t = table->sin.data();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < batch * seq; ++bt) {
    const float* c = &cos_t[(bt % seq) * half];
    const float* s = &sin_t[(bt % seq) * half];
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = (bt * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[base + i], x2 = x[base + i + half];
        out[base + i] = x1 * c[i] - x2 * s[i];
        out[base + i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  }
}

}  // namespace

void rotary_forward(float* out, const float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                    double theta) {
  rotate(out, x, batch, seq, heads, head_dim, theta, 1.0);
}

void rotary_backward_input(float* dx, const float* dout, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                           double theta) {
  rotate(dx, dout, batch, seq, heads, head_dim, theta, -1.0);
}

void linear_forward(float* y, const float* x, const float* w, int64_t n, int64_t in, int64_t out) {
  sgemm(false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void linear_backward_input(float* dx, const float* dy, const float* w, int64_t n, int64_t in, int64_t out) {
  sgemm(false, false, n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

void linear_backward_weight(float* dw, const float* dy, const float* x, int64_t n, int64_t in, int64_t out) {
  sgemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

void swiglu_forward(float* y, float* g, float* u, float* h, const float* x, const float* wg, const float* wu,
                    const float* wd, int64_t n, int64_t d, int64_t f) {
  linear_forward(g, x, wg, n, d, f);
  linear_forward(u, x, wu, n, d, f);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) vec::swiglu_gate_forward(h + i * f, g + i * f, u + i * f, f);
  linear_forward(y, h, wd, n, f, d);
}

void swiglu_backward_input(float* dx, float* dg, float* du, const float* dy, const float* g, const float* u,
                           const float* wg, const float* wu, const float* wd, int64_t n, int64_t d, int64_t f) {
  linear_backward_input(dg, dy, wd, n, f, d);  // dg holds dh for now
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) vec::swiglu_gate_backward(dg + i * f, du + i * f, dg + i * f, g + i * f, u + i * f, f);
  sgemm(false, false, n, d, f, 1.0f, dg, f, wg, d, 0.0f, dx, d);
  sgemm(false, false, n, d, f, 1.0f, du, f, wu, d, 1.0f, dx, d);
}

void swiglu_backward_weight(float* dwg, float* dwu, float* dwd, const float* dy, const float* x, const float* h,
                            const float* dg, const float* du, int64_t n, int64_t d, int64_t f) {
  linear_backward_weight(dwd, dy, h, n, f, d);
  linear_backward_weight(dwg, dg, x, n, d, f);
  linear_backward_weight(dwu, du, x, n, d, f);
}

void gelu_mlp_forward(float* y, float* a, float* h, const float* x, const float* wu, const float* wd, int64_t n,
                      int64_t d, int64_t f) {
  linear_forward(a, x, wu, n, d, f);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * f; ++i) h[i] = gelu(a[i]);
  linear_forward(y, h, wd, n, f, d);
}

void gelu_mlp_backward_input(float* dx, float* da, const float* dy, const float* a, const float* wu, const float* wd,
                             int64_t n, int64_t d, int64_t f) {
  linear_backward_input(da, dy, wd, n, f, d);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * f; ++i) da[i] *= gelu_grad(a[i]);
  linear_backward_input(dx, da, wu, n, d, f);
}

void gelu_mlp_backward_weight(float* dwu, float* dwd, const float* dy, const float* x, const float* h, const float* da,
                              int64_t n, int64_t d, int64_t f) {
  linear_backward_weight(dwd, dy, h, n, f, d);
  linear_backward_weight(dwu, da, x, n, d, f);
}

void lm_head_loss_forward(float* loss, float* probs, const float* h, const float* w, const int32_t* targets, int64_t n,
                          int64_t d, int64_t vocab) {
  linear_forward(probs, h, w, n, d, vocab);
  std::vector<double> row_loss(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* p = probs + i * vocab;
    const float logit_t = p[targets[i]];
    const vec::SoftmaxStats st = vec::softmax_inplace(p, vocab, /*reciprocal=*/false);
    row_loss[i] = static_cast<double>(std::log(st.sum)) - static_cast<double>(logit_t - st.max);
  }
  double total = 0;
  for (double l : row_loss) total += l;  // token order, as the reference
  *loss = static_cast<float>(n > 0 ? total / static_cast<double>(n) : 0.0);
}

void lm_head_loss_backward_input(float* dh, float* dlogits, const float* probs, const int32_t* targets, const float* w,
                                 float dloss, int64_t n, int64_t d, int64_t vocab) {
  const float scale = n > 0 ? dloss / static_cast<float>(n) : 0.0f;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < vocab; ++c) dlogits[i * vocab + c] = probs[i * vocab + c] * scale;
    dlogits[i * vocab + targets[i]] -= scale;
  }
  linear_backward_input(dh, dlogits, w, n, d, vocab);
}

void lm_head_loss_backward_weight(float* dw, const float* dlogits, const float* h, int64_t n, int64_t d,
                                  int64_t vocab) {
  linear_backward_weight(dw, dlogits, h, n, d, vocab);
}

}  // namespace piper::kernels
