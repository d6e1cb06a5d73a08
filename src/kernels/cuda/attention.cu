// Causal GQA attention in fp32, flash-style: each block owns a tile of query rows of one (batch, head), streams
// key/value tiles through shared memory and keeps an online softmax (running max and sum) per row, so no
// [seq, seq] matrix is ever stored. The forward saves lse = max + log(sum) per row; the backward recomputes
// p = exp(s - lse). Backward: kernel 1 computes dq (and D = rowsum(dO·O)) per query row; kernel 2 computes dk, dv
// per key row, looping over the q heads of its kv group and the query rows at or after the key: no atomics,
// fixed order, deterministic.
// Work split: a warp owns kRowsPerWarp rows; each lane holds head_dim / 32 elements of its rows' vectors
// (head_dim <= kMaxAttnHeadDim); the dot products are warp reductions.
#include "piper/kernels/cuda/attn_tiling.h"
#include "piper/kernels/cuda/cuda_common.cuh"

namespace piper::kernels::cuda {
namespace {

using detail::stream;
using detail::warp_sum;

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
static_assert(kWarps * kRowsPerWarp == tiling::kQTile, "a block owns kQTile rows");
using tiling::kKTile;
using tiling::kQTile;
using tiling::qkv_offset;
constexpr int kPerLane = kMaxAttnHeadDim / 32;  // element e of a lane's slice of a row is column lane + 32 * e

__global__ void __launch_bounds__(kWarps * 32)
    attn_forward_k(float* out, float* lse, const float* q, const float* k, const float* v, AttnShape s, float scale) {
  __shared__ float ks[kKTile][kMaxAttnHeadDim];
  __shared__ float vs[kKTile][kMaxAttnHeadDim];
  const int64_t hd = s.head_dim, group = s.q_heads / s.kv_heads;
  const int64_t bh = blockIdx.y, b = bh / s.q_heads, h = bh % s.q_heads, hk = h / group;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kQTile;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float qr[kRowsPerWarp][kPerLane], acc[kRowsPerWarp][kPerLane];
  tiling::OnlineSoftmax sm[kRowsPerWarp];
  _Pragma("unroll") for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t c = lane + 32 * e;
      qr[r][e] = (c < hd && i < s.seq) ? q[qkv_offset(b, i, s.q_heads, h, s.seq, hd) + c] : 0.0f;
      acc[r][e] = 0;
    }
  }
  const int64_t tiles = tiling::key_tiles(q0, s.seq);
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t k0 = tile * kKTile;
    __syncthreads();  // the previous tile is no longer read
    for (int64_t idx = threadIdx.x; idx < kKTile * hd; idx += blockDim.x) {
      const int64_t jr = idx / hd, c = idx % hd, j = k0 + jr;
      const bool valid = j < s.seq;
      ks[jr][c] = valid ? k[qkv_offset(b, j, s.kv_heads, hk, s.seq, hd) + c] : 0.0f;
      vs[jr][c] = valid ? v[qkv_offset(b, j, s.kv_heads, hk, s.seq, hd) + c] : 0.0f;
    }
    __syncthreads();
    _Pragma("unroll") for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t i = q0 + warp * kRowsPerWarp + r;
      if (i >= s.seq) continue;                         // warp-uniform
      const int64_t jmax = tiling::causal_keys(i, k0);  // causal: keys j <= i
      for (int64_t jr = 0; jr < jmax; ++jr) {
        float dot = 0;
        _Pragma("unroll") for (int e = 0; e < kPerLane; ++e) {
          const int64_t c = lane + 32 * e;
          if (c < hd) dot += qr[r][e] * ks[jr][c];
        }
        float corr;
        const float p = sm[r].update(warp_sum(dot) * scale, &corr);
        _Pragma("unroll") for (int e = 0; e < kPerLane; ++e) {
          const int64_t c = lane + 32 * e;
          if (c < hd) acc[r][e] = acc[r][e] * corr + p * vs[jr][c];
        }
      }
    }
  }
  _Pragma("unroll") for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    if (i >= s.seq) continue;
    const float inv = 1.0f / sm[r].l;
    _Pragma("unroll") for (int e = 0; e < kPerLane; ++e) {
      const int64_t c = lane + 32 * e;
      if (c < hd) out[qkv_offset(b, i, s.q_heads, h, s.seq, hd) + c] = acc[r][e] * inv;
    }
    if (lane == 0) lse[bh * s.seq + i] = sm[r].lse();
  }
}

// dq for each query row, and D = rowsum(dO · O).
__global__ void __launch_bounds__(kWarps * 32)
    attn_backward_dq_k(float* dq, float* dsum, const float* dout, const float* out, const float* lse, const float* q,
                       const float* k, const float* v, AttnShape s, float scale) {
  __shared__ float ks[kKTile][kMaxAttnHeadDim];
  __shared__ float vs[kKTile][kMaxAttnHeadDim];
  const int64_t hd = s.head_dim, group = s.q_heads / s.kv_heads;
  const int64_t bh = blockIdx.y, b = bh / s.q_heads, h = bh % s.q_heads, hk = h / group;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kQTile;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float qr[kRowsPerWarp][kPerLane], dor[kRowsPerWarp][kPerLane], acc[kRowsPerWarp][kPerLane];
  float Drow[kRowsPerWarp], L[kRowsPerWarp];
  _Pragma("unroll") for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    const bool valid = i < s.seq;
    const int64_t base = valid ? qkv_offset(b, i, s.q_heads, h, s.seq, hd) : 0;
    float d = 0;
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t c = lane + 32 * e;
      const bool in = valid && c < hd;
      qr[r][e] = in ? q[base + c] : 0.0f;
      dor[r][e] = in ? dout[base + c] : 0.0f;
      d += in ? dor[r][e] * out[base + c] : 0.0f;
      acc[r][e] = 0;
    }
    Drow[r] = warp_sum(d);
    L[r] = valid ? lse[bh * s.seq + i] : 0.0f;
    if (valid && lane == 0) dsum[bh * s.seq + i] = Drow[r];
  }
  const int64_t tiles = tiling::key_tiles(q0, s.seq);
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t k0 = tile * kKTile;
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < kKTile * hd; idx += blockDim.x) {
      const int64_t jr = idx / hd, c = idx % hd, j = k0 + jr;
      const bool valid = j < s.seq;
      ks[jr][c] = valid ? k[qkv_offset(b, j, s.kv_heads, hk, s.seq, hd) + c] : 0.0f;
      vs[jr][c] = valid ? v[qkv_offset(b, j, s.kv_heads, hk, s.seq, hd) + c] : 0.0f;
    }
    __syncthreads();
    _Pragma("unroll") for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t i = q0 + warp * kRowsPerWarp + r;
      if (i >= s.seq) continue;
      const int64_t jmax = tiling::causal_keys(i, k0);
      for (int64_t jr = 0; jr < jmax; ++jr) {
        float dot = 0, dp = 0;
        _Pragma("unroll") for (int e = 0; e < kPerLane; ++e) {
          const int64_t c = lane + 32 * e;
          if (c < hd) dot += qr[r][e] * ks[jr][c], dp += dor[r][e] * vs[jr][c];
        }
        const float p = expf(warp_sum(dot) * scale - L[r]);
        const float ds = p * (warp_sum(dp) - Drow[r]);
        _Pragma("unroll") for (int e = 0; e < kPerLane; ++e) {
          const int64_t c = lane + 32 * e;
          if (c < hd) acc[r][e] += ds * ks[jr][c];
        }
      }
    }
  }
  _Pragma("unroll") for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    if (i >= s.seq) continue;
    _Pragma("unroll") for (int e = 0; e < kPerLane; ++e) {
      const int64_t c = lane + 32 * e;
      if (c < hd) dq[qkv_offset(b, i, s.q_heads, h, s.seq, hd) + c] = acc[r][e] * scale;
    }
  }
}

// dk, dv for each key row of one kv head: sums over the group's q heads (in order) and the query rows i >= j.
__global__ void __launch_bounds__(kWarps * 32)
    attn_backward_dkv_k(float* dk, float* dv, const float* dout, const float* lse, const float* dsum, const float* q,
                        const float* k, const float* v, AttnShape s, float scale) {
  __shared__ float qs[kKTile][kMaxAttnHeadDim];
  __shared__ float dos[kKTile][kMaxAttnHeadDim];
  __shared__ float ls[kKTile], ds_[kKTile];
  const int64_t hd = s.head_dim, group = s.q_heads / s.kv_heads;
  const int64_t bk = blockIdx.y, b = bk / s.kv_heads, hk = bk % s.kv_heads;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kQTile;  // this block's key rows
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float kr[kRowsPerWarp][kPerLane], vr[kRowsPerWarp][kPerLane], dka[kRowsPerWarp][kPerLane],
      dva[kRowsPerWarp][kPerLane];
  _Pragma("unroll") for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = j0 + warp * kRowsPerWarp + r;
    const bool valid = j < s.seq;
    const int64_t base = valid ? qkv_offset(b, j, s.kv_heads, hk, s.seq, hd) : 0;
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t c = lane + 32 * e;
      const bool in = valid && c < hd;
      kr[r][e] = in ? k[base + c] : 0.0f;
      vr[r][e] = in ? v[base + c] : 0.0f;
      dka[r][e] = 0, dva[r][e] = 0;
    }
  }
  const int64_t first_tile = tiling::first_query_tile(j0);  // query rows before j0 see none of these keys
  const int64_t tiles = tiling::query_tiles(s.seq);
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = hk * group + g, bh = b * s.q_heads + h;
    for (int64_t tile = first_tile; tile < tiles; ++tile) {
      const int64_t i0 = tile * kKTile;
      __syncthreads();
      for (int64_t idx = threadIdx.x; idx < kKTile * hd; idx += blockDim.x) {
        const int64_t ir = idx / hd, c = idx % hd, i = i0 + ir;
        const bool valid = i < s.seq;
        qs[ir][c] = valid ? q[qkv_offset(b, i, s.q_heads, h, s.seq, hd) + c] : 0.0f;
        dos[ir][c] = valid ? dout[qkv_offset(b, i, s.q_heads, h, s.seq, hd) + c] : 0.0f;
      }
      for (int64_t ir = threadIdx.x; ir < kKTile; ir += blockDim.x) {
        const int64_t i = i0 + ir;
        ls[ir] = i < s.seq ? lse[bh * s.seq + i] : 0.0f;
        ds_[ir] = i < s.seq ? dsum[bh * s.seq + i] : 0.0f;
      }
      __syncthreads();
      _Pragma("unroll") for (int r = 0; r < kRowsPerWarp; ++r) {
        const int64_t j = j0 + warp * kRowsPerWarp + r;
        if (j >= s.seq) continue;
        const int64_t ir_begin = tiling::causal_queries_begin(j, i0);  // causal: i >= j
        const int64_t ir_end = tiling::causal_queries_end(i0, s.seq);
        for (int64_t ir = ir_begin; ir < ir_end; ++ir) {
          float dot = 0, dp = 0;
          _Pragma("unroll") for (int e = 0; e < kPerLane; ++e) {
            const int64_t c = lane + 32 * e;
            if (c < hd) dot += qs[ir][c] * kr[r][e], dp += dos[ir][c] * vr[r][e];
          }
          const float p = expf(warp_sum(dot) * scale - ls[ir]);
          const float dsc = p * (warp_sum(dp) - ds_[ir]);
          _Pragma("unroll") for (int e = 0; e < kPerLane; ++e) {
            const int64_t c = lane + 32 * e;
            if (c < hd) dva[r][e] += p * dos[ir][c], dka[r][e] += dsc * qs[ir][c];
          }
        }
      }
    }
  }
  _Pragma("unroll") for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = j0 + warp * kRowsPerWarp + r;
    if (j >= s.seq) continue;
    const int64_t base = qkv_offset(b, j, s.kv_heads, hk, s.seq, hd);
    _Pragma("unroll") for (int e = 0; e < kPerLane; ++e) {
      const int64_t c = lane + 32 * e;
      if (c < hd) dk[base + c] = dka[r][e] * scale, dv[base + c] = dva[r][e];
    }
  }
}

void check_shape(const AttnShape& s) {
  if (s.batch < 1 || s.seq < 1 || s.q_heads < 1 || s.kv_heads < 1 || s.q_heads % s.kv_heads != 0 || s.head_dim < 1 ||
      s.head_dim > kMaxAttnHeadDim || s.batch * s.q_heads > 65535) {
    detail::throw_cuda("attention",
                       "unsupported shape batch=" + std::to_string(s.batch) + " seq=" + std::to_string(s.seq) +
                           " q_heads=" + std::to_string(s.q_heads) + " kv_heads=" + std::to_string(s.kv_heads) +
                           " head_dim=" + std::to_string(s.head_dim) + " (need q_heads % kv_heads == 0, head_dim <= " +
                           std::to_string(kMaxAttnHeadDim) + ", batch * q_heads <= 65535)",
                       __FILE__, __LINE__);
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const AttnShape& s) {
  check_shape(s);
  const dim3 grid(static_cast<unsigned>((s.seq + kQTile - 1) / kQTile), static_cast<unsigned>(s.batch * s.q_heads));
  const float scale = 1.0f / sqrtf(static_cast<float>(s.head_dim));
  attn_forward_k<<<grid, kWarps * 32, 0, stream()>>>(out, lse, q, k, v, s, scale);
  PIPER_CUDA_LAUNCHED("attention_forward");
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, const AttnShape& s) {
  check_shape(s);
  const float scale = 1.0f / sqrtf(static_cast<float>(s.head_dim));
  DeviceBuffer dsum(static_cast<size_t>(s.batch * s.q_heads * s.seq) * sizeof(float));
  const unsigned q_tiles = static_cast<unsigned>((s.seq + kQTile - 1) / kQTile);
  attn_backward_dq_k<<<dim3(q_tiles, static_cast<unsigned>(s.batch * s.q_heads)), kWarps * 32, 0, stream()>>>(
      dq, dsum.as<float>(), dout, out, lse, q, k, v, s, scale);
  PIPER_CUDA_LAUNCHED("attention_backward_dq");
  attn_backward_dkv_k<<<dim3(q_tiles, static_cast<unsigned>(s.batch * s.kv_heads)), kWarps * 32, 0, stream()>>>(
      dk, dv, dout, lse, dsum.as<float>(), q, k, v, s, scale);
  PIPER_CUDA_LAUNCHED("attention_backward_dkv");
}

}  // namespace piper::kernels::cuda
