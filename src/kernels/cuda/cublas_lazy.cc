// cuBLAS and cuBLASLt, loaded on first use instead of at process start.
//
// Why: libcublasLt's static initialisers touch about 210 MB when the library is loaded (measured: an empty
// program linked with -lcublasLt peaks at 211 MB RSS against 1 MB without; -lcudart costs 1.5 MB, -lnccl 3.5 MB).
// Linked normally, every `piper` command paid it, `piper simulate` and `piper plan` included, which never run a
// GEMM on a GPU. piper_kernels_cuda therefore does not link cuBLAS: the entry points runtime.cu calls are defined
// here with the headers' signatures and forward to the libraries, opened with dlopen on the first call (the first
// GPU GEMM or handle creation). A library that cannot be opened or lacks a symbol throws CudaError naming it and
// how to fix it, like any failed cuBLAS call.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "piper/kernels/cuda/cuda_api.h"

namespace piper::kernels::cuda {
namespace {

enum Lib { kCublas = 0, kCublasLt = 1 };

void* open_library(Lib lib) {
  static void* handles[2] = {nullptr, nullptr};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (handles[lib] != nullptr) return handles[lib];
  const std::string name = std::string(lib == kCublas ? "libcublas.so." : "libcublasLt.so.") +
                           std::to_string(CUBLAS_VER_MAJOR);
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef PIPER_CUDA_LIBRARY_DIR
  if (h == nullptr) h = dlopen((std::string(PIPER_CUDA_LIBRARY_DIR) + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
  if (h == nullptr) {
    const char* why = dlerror();
    throw CudaError("cannot load " + name + " (" + (why != nullptr ? why : "unknown error") +
                    "): install the CUDA toolkit's cuBLAS or add its directory to LD_LIBRARY_PATH");
  }
  handles[lib] = h;
  return h;
}

template <typename Fn>
Fn symbol(Lib lib, const char* name) {
  void* h = open_library(lib);
  void* p = dlsym(h, name);
  if (p == nullptr) {
    throw CudaError(std::string("cuBLAS entry point ") + name + " not found in the loaded library: it is older than "
                    "the headers Piper was built with (CUDA " + std::to_string(CUBLAS_VER_MAJOR) + "); rebuild or "
                    "install the matching toolkit");
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace
}  // namespace piper::kernels::cuda

// Each entry point resolves its target once (a function-local static: thread-safe initialisation).
#define PIPER_CUBLAS_FORWARD(lib, name, ...)                                                              \
  static const auto fn = ::piper::kernels::cuda::symbol<decltype(&name)>(::piper::kernels::cuda::lib, #name); \
  return fn(__VA_ARGS__)

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  PIPER_CUBLAS_FORWARD(kCublas, cublasCreate_v2, handle);
}
cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  PIPER_CUBLAS_FORWARD(kCublas, cublasSetStream_v2, handle, stream);
}
cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  PIPER_CUBLAS_FORWARD(kCublas, cublasSetMathMode, handle, mode);
}
cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  PIPER_CUBLAS_FORWARD(kCublas, cublasSetWorkspace_v2, handle, workspace, bytes);
}
const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  PIPER_CUBLAS_FORWARD(kCublas, cublasGetStatusString, status);
}
cublasStatus_t CUBLASWINAPI cublasGemmGroupedBatchedEx_64(
    cublasHandle_t handle, const cublasOperation_t transa_array[], const cublasOperation_t transb_array[],
    const int64_t m_array[], const int64_t n_array[], const int64_t k_array[], const void* alpha_array,
    const void* const Aarray[], cudaDataType_t Atype, const int64_t lda_array[], const void* const Barray[],
    cudaDataType_t Btype, const int64_t ldb_array[], const void* beta_array, void* const Carray[],
    cudaDataType_t Ctype, const int64_t ldc_array[], int64_t group_count, const int64_t group_size[],
    cublasComputeType_t computeType) {
  PIPER_CUBLAS_FORWARD(kCublas, cublasGemmGroupedBatchedEx_64, handle, transa_array, transb_array, m_array, n_array,
                       k_array, alpha_array, Aarray, Atype, lda_array, Barray, Btype, ldb_array, beta_array, Carray,
                       Ctype, ldc_array, group_count, group_size, computeType);
}

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) {
  PIPER_CUBLAS_FORWARD(kCublasLt, cublasLtCreate, handle);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
  PIPER_CUBLAS_FORWARD(kCublasLt, cublasLtMatmulDescCreate, desc, compute, scale);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t bytes) {
  PIPER_CUBLAS_FORWARD(kCublasLt, cublasLtMatmulDescSetAttribute, desc, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  PIPER_CUBLAS_FORWARD(kCublasLt, cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  PIPER_CUBLAS_FORWARD(kCublasLt, cublasLtMatmulPreferenceCreate, pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t bytes) {
  PIPER_CUBLAS_FORWARD(kCublasLt, cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, bytes);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  PIPER_CUBLAS_FORWARD(kCublasLt, cublasLtMatmulPreferenceDestroy, pref);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                           cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                           cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                           cublasLtMatmulPreference_t pref, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[], int* returned) {
  PIPER_CUBLAS_FORWARD(kCublasLt, cublasLtMatmulAlgoGetHeuristic, handle, desc, a, b, c, d, pref, requested, results,
                       returned);
}
cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                           const void* A, cublasLtMatrixLayout_t a, const void* B,
                                           cublasLtMatrixLayout_t b, const void* beta, const void* C,
                                           cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                           cudaStream_t stream) {
  PIPER_CUBLAS_FORWARD(kCublasLt, cublasLtMatmul, handle, desc, alpha, A, a, B, b, beta, C, c, D, d, algo, workspace,
                       workspace_bytes, stream);
}

}  // extern "C"
