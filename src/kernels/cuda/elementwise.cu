// Element-wise, normalisation, routing, permutation, loss and optimizer kernels (fp32 math, bf16 copies for GEMM
// operands). Every reduction runs in a fixed order; no atomics.
#include <cmath>

#include "piper/kernels/cuda/cuda_common.cuh"

namespace piper::kernels::cuda {
namespace {

using detail::blocks_for;
using detail::kThreads;
using detail::stream;

__device__ __forceinline__ Bf16 bf16_bits(float x) {
  const __nv_bfloat16 b = __float2bfloat16_rn(x);
  return *reinterpret_cast<const Bf16*>(&b);
}
__device__ __forceinline__ float bf16_value(Bf16 bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void cast_to_bf16_k(Bf16* out, const float* in, int64_t n) { GRID_STRIDE(i, n) out[i] = bf16_bits(in[i]); }
__global__ void cast_to_f32_k(float* out, const Bf16* in, int64_t n) { GRID_STRIDE(i, n) out[i] = bf16_value(in[i]); }
__global__ void add_scaled_k(float* out, const float* a, const float* b, float scale, int64_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + scale * b[i];
}

// ---- embedding
__global__ void embedding_forward_k(float* out, const int32_t* ids, const float* table, int64_t n, int64_t d) {
  GRID_STRIDE(i, n * d) {
    const int64_t t = i / d, j = i % d;
    out[i] = table[static_cast<int64_t>(ids[t]) * d + j];
  }
}
// One block per id (grid-stride over ids), threads over the row; tokens of the id in order.
__global__ void embedding_backward_weight_k(float* dtable, const float* dout, const int64_t* offsets,
                                            const int64_t* tokens, int64_t vocab, int64_t d) {
  for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
    const int64_t lo = offsets[v], hi = offsets[v + 1];
    if (lo == hi) continue;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = dtable[v * d + j];
      for (int64_t p = lo; p < hi; ++p) acc += dout[tokens[p] * d + j];
      dtable[v * d + j] = acc;
    }
  }
}

// ---- RMSNorm: one block per row.
__global__ void rmsnorm_forward_k(float* y, Bf16* y_bf16, float* rstd, const float* x, const float* w, int64_t n,
                                  int64_t d, float eps) {
  __shared__ float scratch[32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* xi = x + i * d;
    float ss = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xi[j] * xi[j];
    ss = detail::block_sum(ss, scratch);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    if (threadIdx.x == 0) rstd[i] = r;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float v = xi[j] * r * w[j];
      y[i * d + j] = v;
      if (y_bf16 != nullptr) y_bf16[i * d + j] = bf16_bits(v);
    }
  }
}
__global__ void rmsnorm_backward_input_k(float* dx, const float* dy, const float* x, const float* w, const float* rstd,
                                         const float* add, int64_t n, int64_t d) {
  __shared__ float scratch[32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const float* xi = x + i * d;
    const float* dyi = dy + i * d;
    const float r = rstd[i];
    float dot = 0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) dot += w[j] * dyi[j] * xi[j];
    dot = detail::block_sum(dot, scratch);
    const float c = r * r * r * dot / static_cast<float>(d);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float v = r * w[j] * dyi[j] - c * xi[j];
      if (add != nullptr) v += add[i * d + j];
      dx[i * d + j] = v;
    }
  }
}
// One thread per column, rows in order.
__global__ void rmsnorm_backward_weight_k(float* dw, const float* dy, const float* x, const float* rstd, int64_t n,
                                          int64_t d) {
  GRID_STRIDE(j, d) {
    float acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += dy[i * d + j] * x[i * d + j] * rstd[i];
    dw[j] += acc;
  }
}

// ---- rotary: one thread per (token, head, pair).
__global__ void rotary_k(float* out, const float* x, int64_t tokens, int64_t seq, int64_t heads, int64_t head_dim,
                         double theta, double sign) {
  const int64_t half = head_dim / 2;
  GRID_STRIDE(idx, tokens * heads * half) {
    const int64_t i = idx % half, th = idx / half, t = (th / heads) % seq;
    const double angle =
        sign * static_cast<double>(t) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sin(angle));
    const int64_t base = th * head_dim;
    const float x1 = x[base + i], x2 = x[base + i + half];
    out[base + i] = x1 * c - x2 * s;
    out[base + i + half] = x2 * c + x1 * s;
  }
}

// ---- SwiGLU activation
__global__ void swiglu_act_forward_k(float* h, Bf16* h_bf16, const float* g, const float* u, int64_t count) {
  GRID_STRIDE(i, count) {
    const float gi = g[i];
    const float v = gi / (1.0f + expf(-gi)) * u[i];
    h[i] = v;
    if (h_bf16 != nullptr) h_bf16[i] = bf16_bits(v);
  }
}
__global__ void swiglu_act_backward_k(float* dg, float* du, const float* dh, const float* g, const float* u,
                                      int64_t count) {
  GRID_STRIDE(i, count) {
    const float gi = g[i], ui = u[i], d = dh[i];
    const float sig = 1.0f / (1.0f + expf(-gi));
    du[i] = d * gi * sig;
    dg[i] = d * ui * sig * (1.0f + gi * (1.0f - sig));
  }
}

// ---- router: one thread per token (E is small: tens to a few hundred experts).
__global__ void router_select_k(float* scores, int32_t* topk_idx, float* topk_w, const float* bias, int64_t n, int E,
                                int K, bool softmax, bool norm_topk) {
  GRID_STRIDE(t, n) {
    float* s = scores + t * E;
    if (softmax) {
      float mx = s[0];
      for (int e = 1; e < E; ++e) mx = fmaxf(mx, s[e]);
      float sum = 0;
      for (int e = 0; e < E; ++e) sum += (s[e] = expf(s[e] - mx));
      for (int e = 0; e < E; ++e) s[e] /= sum;
    } else {
      for (int e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + expf(-s[e]));
    }
    float wsum = 0;
    for (int j = 0; j < K; ++j) {
      int best = -1;
      float best_v = 0;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int q = 0; q < j; ++q) taken |= topk_idx[t * K + q] == e;
        if (taken) continue;
        const float v = s[e] + (bias != nullptr ? bias[e] : 0.0f);
        if (best < 0 || v > best_v) best = e, best_v = v;  // strict: ties keep the lower index
      }
      topk_idx[t * K + j] = best;
      topk_w[t * K + j] = s[best];
      wsum += s[best];
    }
    if (norm_topk) {
      for (int j = 0; j < K; ++j) topk_w[t * K + j] /= wsum;
    }
  }
}
// One thread per token; ds lives in the dlogits row (written before it is read back).
__global__ void router_dlogits_k(float* dlogits, const float* dtopk_w, const float* scores, const int32_t* topk_idx,
                                 const float* topk_w, const float* aux_ds, int64_t n, int E, int K, bool softmax,
                                 bool norm_topk) {
  GRID_STRIDE(t, n) {
    const float* s = scores + t * E;
    float* ds = dlogits + t * E;
    for (int e = 0; e < E; ++e) ds[e] = aux_ds != nullptr ? aux_ds[e] : 0.0f;
    if (norm_topk) {
      float sel_sum = 0, dot = 0;
      for (int j = 0; j < K; ++j) {
        sel_sum += s[topk_idx[t * K + j]];
        dot += dtopk_w[t * K + j] * topk_w[t * K + j];
      }
      for (int j = 0; j < K; ++j) ds[topk_idx[t * K + j]] += (dtopk_w[t * K + j] - dot) / sel_sum;
    } else {
      for (int j = 0; j < K; ++j) ds[topk_idx[t * K + j]] += dtopk_w[t * K + j];
    }
    if (softmax) {
      float sds = 0;
      for (int e = 0; e < E; ++e) sds += s[e] * ds[e];
      for (int e = 0; e < E; ++e) ds[e] = s[e] * (ds[e] - sds);
    } else {
      for (int e = 0; e < E; ++e) ds[e] = ds[e] * s[e] * (1.0f - s[e]);
    }
  }
}
__global__ void column_sums_k(double* out, const float* in, int64_t rows, int64_t cols) {
  GRID_STRIDE(c, cols) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(in[r * cols + c]);
    out[c] = acc;
  }
}

// ---- permute / unpermute: one block per row (token), threads over d.
__global__ void permute_forward_k(float* xp, Bf16* xp_bf16, const float* x, const int64_t* token_of_row, int64_t rows,
                                  int64_t d) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* src = x + token_of_row[r] * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float v = src[j];
      if (xp != nullptr) xp[r * d + j] = v;
      if (xp_bf16 != nullptr) xp_bf16[r * d + j] = bf16_bits(v);
    }
  }
}
__global__ void permute_backward_k(float* dx, const float* dxp, const int64_t* row_of_slot, const float* add, int64_t n,
                                   int K, int64_t d) {
  for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = 0;
      for (int q = 0; q < K; ++q) acc += dxp[row_of_slot[t * K + q] * d + j];
      if (add != nullptr) acc += add[t * d + j];
      dx[t * d + j] = acc;
    }
  }
}
__global__ void unpermute_forward_k(float* y, const float* yp, const float* topk_w, const int64_t* row_of_slot,
                                    const float* residual, float scale, int64_t n, int K, int64_t d) {
  for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = 0;
      for (int q = 0; q < K; ++q) acc += topk_w[t * K + q] * yp[row_of_slot[t * K + q] * d + j];
      y[t * d + j] = (residual != nullptr ? residual[t * d + j] : 0.0f) + scale * acc;
    }
  }
}
__global__ void unpermute_backward_k(float* dyp, Bf16* dyp_bf16, float* dtopk_w, const float* dy, const float* yp,
                                     const float* topk_w, const int64_t* row_of_slot, float scale, int64_t n, int K,
                                     int64_t d) {
  __shared__ float scratch[32];
  for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
    for (int q = 0; q < K; ++q) {
      const int64_t row = row_of_slot[t * K + q];
      const float w = topk_w[t * K + q];
      float dot = 0;
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        const float g = scale * dy[t * d + j];
        const float v = w * g;
        dyp[row * d + j] = v;
        if (dyp_bf16 != nullptr) dyp_bf16[row * d + j] = bf16_bits(v);
        dot += g * yp[row * d + j];
      }
      dot = detail::block_sum(dot, scratch);
      if (threadIdx.x == 0) dtopk_w[t * K + q] = dot;
    }
  }
}

// ---- softmax cross-entropy: one block per row.
__global__ void softmax_xent_forward_k(float* probs, float* row_loss, const int32_t* targets, int64_t n, int64_t V) {
  __shared__ float scratch[32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    float* p = probs + i * V;
    float mx = -INFINITY;
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) mx = fmaxf(mx, p[c]);
    mx = detail::block_max(mx, scratch);
    const float logit_t = p[targets[i]];
    __syncthreads();  // every thread has read p[target] before it is overwritten
    float sum = 0;
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) sum += (p[c] = expf(p[c] - mx));
    sum = detail::block_sum(sum, scratch);
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) p[c] /= sum;
    if (threadIdx.x == 0) row_loss[i] = logf(sum) - (logit_t - mx);
  }
}
__global__ void softmax_xent_backward_k(float* dlogits, Bf16* dlogits_bf16, const float* probs, const int32_t* targets,
                                        float scale, int64_t n, int64_t V) {
  GRID_STRIDE(idx, n * V) {
    const int64_t i = idx / V, c = idx % V;
    float v = probs[idx] * scale;
    if (c == targets[i]) v -= scale;
    dlogits[idx] = v;
    if (dlogits_bf16 != nullptr) dlogits_bf16[idx] = bf16_bits(v);
  }
}

// ---- optimizer
__global__ void sum_squares_blocks_k(double* partials, const float* g, int64_t n) {
  __shared__ double scratch[32];
  const int64_t b = blockIdx.x;
  const int64_t lo = b * kNormBlock, hi = min(n, lo + kNormBlock);
  double acc = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) acc += static_cast<double>(g[i]) * g[i];
  acc = detail::warp_sum_d(acc);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t += scratch[w];
    partials[b] = t;
  }
}
__global__ void adamw_k(float* p, Bf16* p_bf16, const float* g, float* m, float* v, int64_t n, AdamWArgs a) {
  GRID_STRIDE(i, n) {
    const float gi = g[i] * a.grad_scale;
    const float mi = a.b1 * m[i] + (1.0f - a.b1) * gi;
    const float vi = a.b2 * v[i] + (1.0f - a.b2) * gi * gi;
    const float pi = p[i];
    const float mhat = mi / a.bc1, vhat = vi / a.bc2;
    const float np = pi - a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.wd * pi);
    p[i] = np;
    m[i] = mi;
    v[i] = vi;
    if (p_bf16 != nullptr) p_bf16[i] = bf16_bits(np);
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(rows, 1), 65535));
}

}  // namespace

void cast_to_bf16(Bf16* out, const float* in, int64_t n) {
  cast_to_bf16_k<<<blocks_for(n), kThreads, 0, stream()>>>(out, in, n);
  PIPER_CUDA_LAUNCHED("cast_to_bf16");
}
void cast_to_f32(float* out, const Bf16* in, int64_t n) {
  cast_to_f32_k<<<blocks_for(n), kThreads, 0, stream()>>>(out, in, n);
  PIPER_CUDA_LAUNCHED("cast_to_f32");
}
void add_scaled(float* out, const float* a, const float* b, float scale, int64_t n) {
  add_scaled_k<<<blocks_for(n), kThreads, 0, stream()>>>(out, a, b, scale, n);
  PIPER_CUDA_LAUNCHED("add_scaled");
}
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t n, int64_t d) {
  embedding_forward_k<<<blocks_for(n * d), kThreads, 0, stream()>>>(out, ids, table, n, d);
  PIPER_CUDA_LAUNCHED("embedding_forward");
}
void embedding_backward_weight(float* dtable, const float* dout, const int64_t* offsets, const int64_t* tokens,
                               int64_t vocab, int64_t d) {
  embedding_backward_weight_k<<<row_blocks(vocab), 128, 0, stream()>>>(dtable, dout, offsets, tokens, vocab, d);
  PIPER_CUDA_LAUNCHED("embedding_backward_weight");
}
void rmsnorm_forward(float* y, Bf16* y_bf16, float* rstd, const float* x, const float* w, int64_t n, int64_t d,
                     double eps) {
  rmsnorm_forward_k<<<row_blocks(n), kThreads, 0, stream()>>>(y, y_bf16, rstd, x, w, n, d, static_cast<float>(eps));
  PIPER_CUDA_LAUNCHED("rmsnorm_forward");
}
void rmsnorm_backward_input(float* dx, const float* dy, const float* x, const float* w, const float* rstd,
                            const float* add, int64_t n, int64_t d) {
  rmsnorm_backward_input_k<<<row_blocks(n), kThreads, 0, stream()>>>(dx, dy, x, w, rstd, add, n, d);
  PIPER_CUDA_LAUNCHED("rmsnorm_backward_input");
}
void rmsnorm_backward_weight(float* dw, const float* dy, const float* x, const float* rstd, int64_t n, int64_t d) {
  rmsnorm_backward_weight_k<<<blocks_for(d, 128), 128, 0, stream()>>>(dw, dy, x, rstd, n, d);
  PIPER_CUDA_LAUNCHED("rmsnorm_backward_weight");
}
void rotary(float* out, const float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, double theta,
            double sign) {
  if (head_dim % 2 != 0)
    detail::throw_cuda("rotary", "head_dim must be even, got " + std::to_string(head_dim), __FILE__, __LINE__);
  const int64_t work = batch * seq * heads * (head_dim / 2);
  rotary_k<<<blocks_for(work), kThreads, 0, stream()>>>(out, x, batch * seq, seq, heads, head_dim, theta, sign);
  PIPER_CUDA_LAUNCHED("rotary");
}
void swiglu_act_forward(float* h, Bf16* h_bf16, const float* g, const float* u, int64_t count) {
  swiglu_act_forward_k<<<blocks_for(count), kThreads, 0, stream()>>>(h, h_bf16, g, u, count);
  PIPER_CUDA_LAUNCHED("swiglu_act_forward");
}
void swiglu_act_backward(float* dg, float* du, const float* dh, const float* g, const float* u, int64_t count) {
  swiglu_act_backward_k<<<blocks_for(count), kThreads, 0, stream()>>>(dg, du, dh, g, u, count);
  PIPER_CUDA_LAUNCHED("swiglu_act_backward");
}
void router_select(float* scores, int32_t* topk_idx, float* topk_w, const float* bias, int64_t n, int num_experts,
                   int top_k, bool softmax, bool norm_topk) {
  if (top_k < 1 || top_k > num_experts) {
    detail::throw_cuda("router_select",
                       "top_k " + std::to_string(top_k) + " outside [1, " + std::to_string(num_experts) + "]", __FILE__,
                       __LINE__);
  }
  router_select_k<<<blocks_for(n, 128), 128, 0, stream()>>>(scores, topk_idx, topk_w, bias, n, num_experts, top_k,
                                                            softmax, norm_topk);
  PIPER_CUDA_LAUNCHED("router_select");
}
void router_dlogits(float* dlogits, const float* dtopk_w, const float* scores, const int32_t* topk_idx,
                    const float* topk_w, const float* aux_ds, int64_t n, int num_experts, int top_k, bool softmax,
                    bool norm_topk) {
  router_dlogits_k<<<blocks_for(n, 128), 128, 0, stream()>>>(dlogits, dtopk_w, scores, topk_idx, topk_w, aux_ds, n,
                                                             num_experts, top_k, softmax, norm_topk);
  PIPER_CUDA_LAUNCHED("router_dlogits");
}
void column_sums(double* out, const float* in, int64_t rows, int64_t cols) {
  column_sums_k<<<blocks_for(cols, 128), 128, 0, stream()>>>(out, in, rows, cols);
  PIPER_CUDA_LAUNCHED("column_sums");
}
void permute_forward(float* xp, Bf16* xp_bf16, const float* x, const int64_t* token_of_row, int64_t rows, int64_t d) {
  permute_forward_k<<<row_blocks(rows), 128, 0, stream()>>>(xp, xp_bf16, x, token_of_row, rows, d);
  PIPER_CUDA_LAUNCHED("permute_forward");
}
void permute_backward(float* dx, const float* dxp, const int64_t* row_of_slot, const float* add, int64_t n, int top_k,
                      int64_t d) {
  permute_backward_k<<<row_blocks(n), 128, 0, stream()>>>(dx, dxp, row_of_slot, add, n, top_k, d);
  PIPER_CUDA_LAUNCHED("permute_backward");
}
void unpermute_forward(float* y, const float* yp, const float* topk_w, const int64_t* row_of_slot,
                       const float* residual, float scale, int64_t n, int top_k, int64_t d) {
  unpermute_forward_k<<<row_blocks(n), 128, 0, stream()>>>(y, yp, topk_w, row_of_slot, residual, scale, n, top_k, d);
  PIPER_CUDA_LAUNCHED("unpermute_forward");
}
void unpermute_backward(float* dyp, Bf16* dyp_bf16, float* dtopk_w, const float* dy, const float* yp,
                        const float* topk_w, const int64_t* row_of_slot, float scale, int64_t n, int top_k, int64_t d) {
  unpermute_backward_k<<<row_blocks(n), 128, 0, stream()>>>(dyp, dyp_bf16, dtopk_w, dy, yp, topk_w, row_of_slot, scale,
                                                            n, top_k, d);
  PIPER_CUDA_LAUNCHED("unpermute_backward");
}
void softmax_xent_forward(float* probs, float* row_loss, const int32_t* targets, int64_t n, int64_t vocab) {
  softmax_xent_forward_k<<<row_blocks(n), kThreads, 0, stream()>>>(probs, row_loss, targets, n, vocab);
  PIPER_CUDA_LAUNCHED("softmax_xent_forward");
}
void softmax_xent_backward(float* dlogits, Bf16* dlogits_bf16, const float* probs, const int32_t* targets, float scale,
                           int64_t n, int64_t vocab) {
  softmax_xent_backward_k<<<blocks_for(n * vocab), kThreads, 0, stream()>>>(dlogits, dlogits_bf16, probs, targets,
                                                                            scale, n, vocab);
  PIPER_CUDA_LAUNCHED("softmax_xent_backward");
}
void sum_squares_blocks(double* partials, const float* g, int64_t n) {
  const int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
  if (blocks == 0) return;
  sum_squares_blocks_k<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(partials, g, n);
  PIPER_CUDA_LAUNCHED("sum_squares_blocks");
}
void adamw(float* p, Bf16* p_bf16, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a) {
  adamw_k<<<blocks_for(n), kThreads, 0, stream()>>>(p, p_bf16, g, m, v, n, a);
  PIPER_CUDA_LAUNCHED("adamw");
}

}  // namespace piper::kernels::cuda
