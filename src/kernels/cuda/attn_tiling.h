// The index math and the online-softmax step of the CUDA attention kernels (attention.cu), as __host__
// __device__ functions: the kernels call them, and tests/kernels/cuda_host_test.cc runs the kernels' tile loops
// on the CPU with them (CudaAttentionTiling.*) against the reference attention. Plain C++ without nvcc.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PIPER_HD __host__ __device__ __forceinline__
#else
#define PIPER_HD inline
#endif

namespace piper::kernels::cuda::tiling {

constexpr int kQTile = 16;  // query rows (forward, dq) or key rows (dk/dv) per block
constexpr int kKTile = 16;  // rows per shared-memory tile of the streamed operand

PIPER_HD int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
PIPER_HD int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// Element offset of row t, head h of a [batch, seq, heads, hd] array.
PIPER_HD int64_t qkv_offset(int64_t b, int64_t t, int64_t heads, int64_t h, int64_t seq, int64_t hd) {
  return ((b * seq + t) * heads + h) * hd;
}
// Forward / dq: the key tiles a query block starting at q0 visits (causal: keys < min(q0 + kQTile, seq)).
PIPER_HD int64_t key_tiles(int64_t q0, int64_t seq) {
  const int64_t q_end = imin(q0 + kQTile, seq);
  return (q_end + kKTile - 1) / kKTile;
}
// Keys of the tile starting at k0 that query i sees: k0 .. k0 + count - 1 (count may be 0).
PIPER_HD int64_t causal_keys(int64_t i, int64_t k0) { return imax(0, imin(kKTile, i - k0 + 1)); }
// dk/dv: the query tiles a key block starting at j0 visits: [first, last).
PIPER_HD int64_t first_query_tile(int64_t j0) { return j0 / kKTile; }
PIPER_HD int64_t query_tiles(int64_t seq) { return (seq + kKTile - 1) / kKTile; }
// Queries of the tile starting at i0 that see key j (i >= j, i < seq): [begin, end) within the tile.
PIPER_HD int64_t causal_queries_begin(int64_t j, int64_t i0) { return imax(0, j - i0); }
PIPER_HD int64_t causal_queries_end(int64_t i0, int64_t seq) { return imin(kKTile, seq - i0); }

// Running max m and sum l of exp(s - m) over the scores seen so far. update() returns p = exp(s - m_new) and the
// factor `corr` by which the accumulated output must be scaled.
struct OnlineSoftmax {
  float m = -INFINITY, l = 0.0f;
  PIPER_HD float update(float s, float* corr) {
    const float m_new = fmaxf(m, s);
    *corr = expf(m - m_new);  // 0 on the first score (m = -inf)
    const float p = expf(s - m_new);
    l = l * *corr + p;
    m = m_new;
    return p;
  }
  PIPER_HD float lse() const { return m + logf(l); }
};

}  // namespace piper::kernels::cuda::tiling
