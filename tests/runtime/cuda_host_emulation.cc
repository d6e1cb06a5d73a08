// A host-memory emulation of kernels/cuda/cuda_api.h for tests only: "device" buffers are malloc'ed (filled
// with NaN bytes, so a read before a write shows up), every kernel is the documented contract computed with
// the CPU reference, and GEMM operands are bf16 exactly as on the GPU. Linked instead of piper_kernels_cuda
// into runtime_gpu_emulation_tests, it lets the GPU trainer's orchestration (chunk order, GEMM shapes and
// transposes, routing, microbatches, the optimizer) run and be compared with the CPU trainer on any machine.
// It says nothing about the CUDA kernels themselves (cuda_kernels_tests check those on a GPU).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "piper/kernels/cpu/moe_reference.h"
#include "piper/kernels/cpu/reference.h"
#include "piper/kernels/cuda/cuda_api.h"

namespace piper::kernels::cuda {

int device_count() { return 1; }
Status device_status() { return ok_status(); }
std::string device_description() { return "host emulation of the CUDA API (tests only)"; }
void synchronize() {}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) {
    ptr_ = std::malloc(bytes);
    std::memset(ptr_, 0xff, bytes);  // NaN floats: reading before writing poisons the result
  }
}
DeviceBuffer::~DeviceBuffer() { std::free(ptr_); }
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    std::free(ptr_);
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}
template <typename T>
DeviceBuffer device_array(int64_t count, bool zero) {
  DeviceBuffer b(static_cast<size_t>(count) * sizeof(T));
  if (zero && count > 0) std::memset(b.get(), 0, b.bytes());
  return b;
}
template DeviceBuffer device_array<float>(int64_t, bool);
template DeviceBuffer device_array<double>(int64_t, bool);
template DeviceBuffer device_array<uint16_t>(int64_t, bool);
template DeviceBuffer device_array<int32_t>(int64_t, bool);
template DeviceBuffer device_array<int64_t>(int64_t, bool);

void copy_to_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void copy_to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void copy_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void fill_zero(void* dst, size_t bytes) { std::memset(dst, 0, bytes); }
void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_ld, src + r * src_ld, cols * sizeof(float));
}

void cast_to_bf16(Bf16* out, const float* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}
void cast_to_f32(float* out, const Bf16* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_bf16(in[i]);
}
void add_scaled(float* out, const float* a, const float* b, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + scale * b[i];
}

namespace {
// The elements of a stored operand widened to fp32 (op(X) is [rows, cols]; stored transposed when trans).
std::vector<float> widen(const Bf16* x, bool trans, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t sr = trans ? cols : rows, sc = trans ? rows : cols;
  std::vector<float> out(static_cast<size_t>(sr * ld), 0.0f);
  for (int64_t i = 0; i < sr; ++i) {
    for (int64_t j = 0; j < sc; ++j) out[i * ld + j] = from_bf16(x[i * ld + j]);
  }
  return out;
}
}  // namespace

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const Bf16* a, int64_t lda,
               const Bf16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const std::vector<float> A = widen(a, ta, m, k, lda), B = widen(b, tb, k, n, ldb);
  ref::gemm<float>(ta, tb, m, n, k, alpha, A.data(), lda, B.data(), ldb, beta, c, ldc);
}
void gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  ref::gemm<float>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void grouped_gemm_bf16(const std::vector<GemmProblem>& problems, GroupedMode) {
  for (const GemmProblem& p : problems) {
    gemm_bf16(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc);
  }
}

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(out + i * d, table + static_cast<int64_t>(ids[i]) * d, d * sizeof(float));
}
void embedding_backward_weight(float* dtable, const float* dout, const int64_t* offsets, const int64_t* tokens,
                               int64_t vocab, int64_t d) {
  for (int64_t v = 0; v < vocab; ++v) {
    for (int64_t p = offsets[v]; p < offsets[v + 1]; ++p) {
      for (int64_t j = 0; j < d; ++j) dtable[v * d + j] += dout[tokens[p] * d + j];
    }
  }
}

void rmsnorm_forward(float* y, Bf16* y_bf16, float* rstd, const float* x, const float* w, int64_t n, int64_t d,
                     double eps) {
  ref::rmsnorm_forward<float>(y, rstd, x, w, n, d, eps);
  if (y_bf16 != nullptr) cast_to_bf16(y_bf16, y, n * d);
}
void rmsnorm_backward_input(float* dx, const float* dy, const float* x, const float* w, const float* rstd,
                            const float* add, int64_t n, int64_t d) {
  ref::rmsnorm_backward_input<float>(dx, dy, x, w, rstd, n, d);
  if (add != nullptr) add_scaled(dx, dx, add, 1.0f, n * d);
}
void rmsnorm_backward_weight(float* dw, const float* dy, const float* x, const float* rstd, int64_t n, int64_t d) {
  ref::rmsnorm_backward_weight<float>(dw, dy, x, rstd, n, d);
}
void rotary(float* out, const float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, double theta,
            double sign) {
  if (sign > 0) {
    ref::rotary_forward<float>(out, x, batch, seq, heads, head_dim, theta);
  } else {
    ref::rotary_backward_input<float>(out, x, batch, seq, heads, head_dim, theta);
  }
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const AttnShape& s) {
  const AttentionShape cs{s.batch, s.seq, s.q_heads, s.kv_heads, s.head_dim};
  std::vector<float> probs(static_cast<size_t>(s.batch * s.q_heads * s.seq * s.seq));
  ref::attention_forward<float>(out, probs.data(), q, k, v, cs);
  const int64_t group = s.q_heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      for (int64_t i = 0; i < s.seq; ++i) {
        std::vector<float> sc(static_cast<size_t>(i + 1));
        float mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          float dot = 0;
          for (int64_t c = 0; c < s.head_dim; ++c) {
            dot += q[((b * s.seq + i) * s.q_heads + h) * s.head_dim + c] *
                   k[((b * s.seq + j) * s.kv_heads + h / group) * s.head_dim + c];
          }
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        float sum = 0;
        for (float x : sc) sum += std::exp(x - mx);
        lse[(b * s.q_heads + h) * s.seq + i] = mx + std::log(sum);
      }
    }
  }
}
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, const AttnShape& s) {
  const AttentionShape cs{s.batch, s.seq, s.q_heads, s.kv_heads, s.head_dim};
  std::vector<float> probs(static_cast<size_t>(s.batch * s.q_heads * s.seq * s.seq));
  std::vector<float> o(static_cast<size_t>(s.batch * s.seq * s.q_heads * s.head_dim));
  ref::attention_forward<float>(o.data(), probs.data(), q, k, v, cs);
  ref::attention_backward_input<float>(dq, dk, dv, dout, q, k, v, probs.data(), cs);
}

void swiglu_act_forward(float* h, Bf16* h_bf16, const float* g, const float* u, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    h[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    if (h_bf16 != nullptr) h_bf16[i] = to_bf16(h[i]);
  }
}
void swiglu_act_backward(float* dg, float* du, const float* dh, const float* g, const float* u, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const float gi = g[i], ui = u[i], d = dh[i];
    const float sig = 1.0f / (1.0f + std::exp(-gi));
    du[i] = d * gi * sig;
    dg[i] = d * ui * sig * (1.0f + gi * (1.0f - sig));
  }
}

void router_select(float* scores, int32_t* topk_idx, float* topk_w, const float* bias, int64_t n, int num_experts,
                   int top_k, bool softmax, bool norm_topk) {
  RouterConfig cfg;
  cfg.num_experts = num_experts, cfg.top_k = top_k;
  cfg.score = softmax ? ScoreFunc::kSoftmax : ScoreFunc::kSigmoid;
  cfg.norm_topk = norm_topk;
  float aux = 0;
  ref::router_select<float>(scores, topk_idx, topk_w, &aux, bias, n, cfg);
}
void router_dlogits(float* dlogits, const float* dtopk_w, const float* scores, const int32_t* topk_idx,
                    const float* topk_w, const float* aux_ds, int64_t n, int E, int K, bool softmax, bool norm_topk) {
  std::vector<float> ds(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const float* s = scores + t * E;
    for (int e = 0; e < E; ++e) ds[e] = aux_ds != nullptr ? aux_ds[e] : 0.0f;
    if (norm_topk) {
      float sel = 0, dot = 0;
      for (int j = 0; j < K; ++j) sel += s[topk_idx[t * K + j]], dot += dtopk_w[t * K + j] * topk_w[t * K + j];
      for (int j = 0; j < K; ++j) ds[topk_idx[t * K + j]] += (dtopk_w[t * K + j] - dot) / sel;
    } else {
      for (int j = 0; j < K; ++j) ds[topk_idx[t * K + j]] += dtopk_w[t * K + j];
    }
    float sds = 0;
    for (int e = 0; e < E; ++e) sds += s[e] * ds[e];
    for (int e = 0; e < E; ++e) dlogits[t * E + e] = softmax ? s[e] * (ds[e] - sds) : ds[e] * s[e] * (1.0f - s[e]);
  }
}
void column_sums(double* out, const float* in, int64_t rows, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += in[r * cols + c];
    out[c] = acc;
  }
}

void permute_forward(float* xp, Bf16* xp_bf16, const float* x, const int64_t* token_of_row, int64_t rows, int64_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < d; ++j) {
      const float v = x[token_of_row[r] * d + j];
      if (xp != nullptr) xp[r * d + j] = v;
      if (xp_bf16 != nullptr) xp_bf16[r * d + j] = to_bf16(v);
    }
  }
}
void permute_backward(float* dx, const float* dxp, const int64_t* row_of_slot, const float* add, int64_t n, int top_k,
                      int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < d; ++j) {
      float acc = 0;
      for (int q = 0; q < top_k; ++q) acc += dxp[row_of_slot[t * top_k + q] * d + j];
      dx[t * d + j] = acc + (add != nullptr ? add[t * d + j] : 0.0f);
    }
  }
}
void unpermute_forward(float* y, const float* yp, const float* topk_w, const int64_t* row_of_slot,
                       const float* residual, float scale, int64_t n, int top_k, int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < d; ++j) {
      float acc = 0;
      for (int q = 0; q < top_k; ++q) acc += topk_w[t * top_k + q] * yp[row_of_slot[t * top_k + q] * d + j];
      y[t * d + j] = (residual != nullptr ? residual[t * d + j] : 0.0f) + scale * acc;
    }
  }
}
void unpermute_backward(float* dyp, Bf16* dyp_bf16, float* dtopk_w, const float* dy, const float* yp,
                        const float* topk_w, const int64_t* row_of_slot, float scale, int64_t n, int top_k, int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    for (int q = 0; q < top_k; ++q) {
      const int64_t row = row_of_slot[t * top_k + q];
      float dot = 0;
      for (int64_t j = 0; j < d; ++j) {
        const float g = scale * dy[t * d + j];
        dyp[row * d + j] = topk_w[t * top_k + q] * g;
        if (dyp_bf16 != nullptr) dyp_bf16[row * d + j] = to_bf16(dyp[row * d + j]);
        dot += g * yp[row * d + j];
      }
      dtopk_w[t * top_k + q] = dot;
    }
  }
}

void softmax_xent_forward(float* probs, float* row_loss, const int32_t* targets, int64_t n, int64_t V) {
  for (int64_t i = 0; i < n; ++i) {
    float* p = probs + i * V;
    float mx = p[0];
    for (int64_t c = 1; c < V; ++c) mx = std::max(mx, p[c]);
    const float lt = p[targets[i]];
    float sum = 0;
    for (int64_t c = 0; c < V; ++c) sum += (p[c] = std::exp(p[c] - mx));
    for (int64_t c = 0; c < V; ++c) p[c] /= sum;
    row_loss[i] = std::log(sum) - (lt - mx);
  }
}
void softmax_xent_backward(float* dlogits, Bf16* dlogits_bf16, const float* probs, const int32_t* targets, float scale,
                           int64_t n, int64_t V) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < V; ++c) {
      float v = probs[i * V + c] * scale;
      if (c == targets[i]) v -= scale;
      dlogits[i * V + c] = v;
      if (dlogits_bf16 != nullptr) dlogits_bf16[i * V + c] = to_bf16(v);
    }
  }
}

void sum_squares_blocks(double* partials, const float* g, int64_t n) {
  for (int64_t b = 0; b * kNormBlock < n; ++b) {
    double acc = 0;
    for (int64_t i = b * kNormBlock; i < std::min(n, (b + 1) * kNormBlock); ++i)
      acc += static_cast<double>(g[i]) * g[i];
    partials[b] = acc;
  }
}
void adamw(float* p, Bf16* p_bf16, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * a.grad_scale;
    const float mi = a.b1 * m[i] + (1.0f - a.b1) * gi;
    const float vi = a.b2 * v[i] + (1.0f - a.b2) * gi * gi;
    const float mhat = mi / a.bc1, vhat = vi / a.bc2;
    p[i] = p[i] - a.lr * (mhat / (std::sqrt(vhat) + a.eps) + a.wd * p[i]);
    m[i] = mi, v[i] = vi;
    if (p_bf16 != nullptr) p_bf16[i] = to_bf16(p[i]);
  }
}

}  // namespace piper::kernels::cuda
