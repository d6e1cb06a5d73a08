// Reference kernels for the dense layers: gemm, embedding, RMSNorm, rotary, linear, SwiGLU and GELU MLPs.
#include <cmath>
#include <vector>

#include "piper/base/check.h"
#include "piper/kernels/cpu/reference.h"

namespace piper::kernels::ref {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const T av = trans_a ? a[p * lda + i] : a[i * lda + p];
        const T bv = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += av * bv;
      }
      c[i * ldc + j] = alpha * acc + (beta == T(0) ? T(0) : beta * c[i * ldc + j]);
    }
  }
}

template <typename T>
void embedding_forward(T* out, const int32_t* ids, const T* table, int64_t n, int64_t vocab, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    PIPER_DCHECK(ids[i] >= 0 && ids[i] < vocab);
    for (int64_t j = 0; j < d; ++j) out[i * d + j] = table[ids[i] * d + j];
  }
}

template <typename T>
void embedding_backward_weight(T* dtable, const T* dout, const int32_t* ids, int64_t n, int64_t vocab, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    PIPER_DCHECK(ids[i] >= 0 && ids[i] < vocab);
    for (int64_t j = 0; j < d; ++j) dtable[ids[i] * d + j] += dout[i * d + j];
  }
}

template <typename T>
void rmsnorm_forward(T* y, T* rstd, const T* x, const T* w, int64_t n, int64_t d, double eps) {
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    T ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += xi[j] * xi[j];
    const T r = T(1) / std::sqrt(ss / T(d) + T(eps));
    rstd[i] = r;
    for (int64_t j = 0; j < d; ++j) y[i * d + j] = xi[j] * r * w[j];
  }
}

template <typename T>
void rmsnorm_backward_input(T* dx, const T* dy, const T* x, const T* w, const T* rstd, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    const T* dyi = dy + i * d;
    const T r = rstd[i];
    T dot = 0;  // sum_j w_j dy_j x_j
    for (int64_t j = 0; j < d; ++j) dot += w[j] * dyi[j] * xi[j];
    const T c = r * r * r * dot / T(d);
    for (int64_t j = 0; j < d; ++j) dx[i * d + j] = r * w[j] * dyi[j] - c * xi[j];
  }
}

template <typename T>
void rmsnorm_backward_weight(T* dw, const T* dy, const T* x, const T* rstd, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) dw[j] += dy[i * d + j] * x[i * d + j] * rstd[i];
  }
}

namespace {

template <typename T>
void rotate(T* out, const T* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, double theta,
            double sign) {
  PIPER_CHECK(head_dim % 2 == 0, "rotary needs an even head_dim, got ", head_dim);
  const int64_t half = head_dim / 2;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = sign * static_cast<double>(t) *
                             std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
        const T c = static_cast<T>(std::cos(angle)), s = static_cast<T>(std::sin(angle));
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t base = ((b * seq + t) * heads + h) * head_dim;
          const T x1 = x[base + i], x2 = x[base + i + half];
          out[base + i] = x1 * c - x2 * s;
          out[base + i + half] = x2 * c + x1 * s;
        }
      }
    }
  }
}

template <typename T>
T silu(T g) {
  return g / (T(1) + std::exp(-g));
}

// gelu(a) = 0.5 a (1 + tanh(c (a + 0.044715 a³))), c = sqrt(2/pi).
template <typename T>
T gelu(T a) {
  const T c = T(0.7978845608028654);
  return T(0.5) * a * (T(1) + std::tanh(c * (a + T(0.044715) * a * a * a)));
}

template <typename T>
T gelu_grad(T a) {
  const T c = T(0.7978845608028654);
  const T th = std::tanh(c * (a + T(0.044715) * a * a * a));
  return T(0.5) * (T(1) + th) + T(0.5) * a * (T(1) - th * th) * c * (T(1) + T(3) * T(0.044715) * a * a);
}

}  // namespace

template <typename T>
void rotary_forward(T* out, const T* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, double theta) {
  rotate(out, x, batch, seq, heads, head_dim, theta, 1.0);
}

template <typename T>
void rotary_backward_input(T* dx, const T* dout, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                           double theta) {
  // The rotation is orthogonal: its transpose is the rotation by the opposite angle.
  rotate(dx, dout, batch, seq, heads, head_dim, theta, -1.0);
}

template <typename T>
void linear_forward(T* y, const T* x, const T* w, int64_t n, int64_t in, int64_t out) {
  gemm<T>(false, true, n, out, in, T(1), x, in, w, in, T(0), y, out);
}

template <typename T>
void linear_backward_input(T* dx, const T* dy, const T* w, int64_t n, int64_t in, int64_t out) {
  gemm<T>(false, false, n, in, out, T(1), dy, out, w, in, T(0), dx, in);
}

template <typename T>
void linear_backward_weight(T* dw, const T* dy, const T* x, int64_t n, int64_t in, int64_t out) {
  gemm<T>(true, false, out, in, n, T(1), dy, out, x, in, T(1), dw, in);
}

template <typename T>
void swiglu_forward(T* y, T* g, T* u, T* h, const T* x, const T* wg, const T* wu, const T* wd, int64_t n, int64_t d,
                    int64_t f) {
  linear_forward(g, x, wg, n, d, f);
  linear_forward(u, x, wu, n, d, f);
  for (int64_t i = 0; i < n * f; ++i) h[i] = silu(g[i]) * u[i];
  linear_forward(y, h, wd, n, f, d);
}

template <typename T>
void swiglu_backward_input(T* dx, T* dg, T* du, const T* dy, const T* g, const T* u, const T* wg, const T* wu,
                           const T* wd, int64_t n, int64_t d, int64_t f) {
  linear_backward_input(dg, dy, wd, n, f, d);  // dg holds dh for now
  for (int64_t i = 0; i < n * f; ++i) {
    const T sig = T(1) / (T(1) + std::exp(-g[i]));
    const T dh = dg[i];
    du[i] = dh * g[i] * sig;
    dg[i] = dh * u[i] * sig * (T(1) + g[i] * (T(1) - sig));
  }
  std::vector<T> tmp(static_cast<size_t>(n * d));
  linear_backward_input(dx, dg, wg, n, d, f);
  linear_backward_input(tmp.data(), du, wu, n, d, f);
  for (int64_t i = 0; i < n * d; ++i) dx[i] += tmp[i];
}

template <typename T>
void swiglu_backward_weight(T* dwg, T* dwu, T* dwd, const T* dy, const T* x, const T* h, const T* dg, const T* du,
                            int64_t n, int64_t d, int64_t f) {
  linear_backward_weight(dwd, dy, h, n, f, d);
  linear_backward_weight(dwg, dg, x, n, d, f);
  linear_backward_weight(dwu, du, x, n, d, f);
}

template <typename T>
void gelu_mlp_forward(T* y, T* a, T* h, const T* x, const T* wu, const T* wd, int64_t n, int64_t d, int64_t f) {
  linear_forward(a, x, wu, n, d, f);
  for (int64_t i = 0; i < n * f; ++i) h[i] = gelu(a[i]);
  linear_forward(y, h, wd, n, f, d);
}

template <typename T>
void gelu_mlp_backward_input(T* dx, T* da, const T* dy, const T* a, const T* wu, const T* wd, int64_t n, int64_t d,
                             int64_t f) {
  linear_backward_input(da, dy, wd, n, f, d);
  for (int64_t i = 0; i < n * f; ++i) da[i] *= gelu_grad(a[i]);
  linear_backward_input(dx, da, wu, n, d, f);
}

template <typename T>
void gelu_mlp_backward_weight(T* dwu, T* dwd, const T* dy, const T* x, const T* h, const T* da, int64_t n, int64_t d,
                              int64_t f) {
  linear_backward_weight(dwd, dy, h, n, f, d);
  linear_backward_weight(dwu, da, x, n, d, f);
}

#define PIPER_INSTANTIATE_DENSE(T)                                                                                     \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*,         \
                        int64_t);                                                                                      \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t);                         \
  template void embedding_backward_weight<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                 \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);                              \
  template void rmsnorm_backward_input<T>(T*, const T*, const T*, const T*, const T*, int64_t, int64_t);               \
  template void rmsnorm_backward_weight<T>(T*, const T*, const T*, const T*, int64_t, int64_t);                        \
  template void rotary_forward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, double);                           \
  template void rotary_backward_input<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, double);                    \
  template void linear_forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);                                  \
  template void linear_backward_input<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);                           \
  template void linear_backward_weight<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);                          \
  template void swiglu_forward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);  \
  template void swiglu_backward_input<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,       \
                                         int64_t, int64_t, int64_t);                                                   \
  template void swiglu_backward_weight<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t,       \
                                          int64_t, int64_t);                                                           \
  template void gelu_mlp_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);              \
  template void gelu_mlp_backward_input<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t); \
  template void gelu_mlp_backward_weight<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);

PIPER_INSTANTIATE_DENSE(float)
PIPER_INSTANTIATE_DENSE(double)

}  // namespace piper::kernels::ref
