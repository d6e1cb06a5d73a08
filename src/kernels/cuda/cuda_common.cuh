// Shared by the .cu files: error checks, the library's stream and handles, launch helpers.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "piper/kernels/cuda/cuda_api.h"

namespace piper::kernels::cuda::detail {

[[noreturn]] void throw_cuda(const char* call, const std::string& error, const char* file, int line);

#define PIPER_CUDA_CHECK(call)                                                                                \
  do {                                                                                                        \
    cudaError_t piper_err_ = (call);                                                                          \
    if (piper_err_ != cudaSuccess) {                                                                          \
      ::piper::kernels::cuda::detail::throw_cuda(                                                             \
          #call, std::string(cudaGetErrorName(piper_err_)) + ": " + cudaGetErrorString(piper_err_), __FILE__, \
          __LINE__);                                                                                          \
    }                                                                                                         \
  } while (0)
#define PIPER_CUBLAS_CHECK(call)                                                                               \
  do {                                                                                                         \
    cublasStatus_t piper_st_ = (call);                                                                         \
    if (piper_st_ != CUBLAS_STATUS_SUCCESS) {                                                                  \
      ::piper::kernels::cuda::detail::throw_cuda(#call, cublasGetStatusString(piper_st_), __FILE__, __LINE__); \
    }                                                                                                          \
  } while (0)
// After a kernel launch: a bad launch configuration is reported here, naming the kernel.
#define PIPER_CUDA_LAUNCHED(name) ::piper::kernels::cuda::detail::check_launch(name, __FILE__, __LINE__)
void check_launch(const char* kernel, const char* file, int line);

cudaStream_t stream();
cublasHandle_t cublas();
cublasLtHandle_t cublas_lt();
void* lt_workspace();
size_t lt_workspace_bytes();

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int threads = kThreads) { return static_cast<unsigned>(grid_size(n, threads)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result. Fixed order.
__device__ __forceinline__ float block_sum(float v, float* scratch /* [32] shared */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(t);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

}  // namespace piper::kernels::cuda::detail
