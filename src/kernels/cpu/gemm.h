// The fp32 GEMM behind every fast CPU kernel, and the kernels' thread count.
//
// Two backends, chosen at run time (docs/gemm.md has the measurements behind the default):
// - oneDNN (default when built in): picks its kernels for the host CPU; OpenMP threads; a call made inside an
//   OpenMP parallel region runs on the calling thread only, so kernels can parallelise over heads or experts and
//   call it from each thread.
// - OpenBLAS: needs OPENBLAS_CORETYPE set before the process starts on CPUs newer than the library (else it
//   falls back to kernels 2-8x slower); its threads are its own, so kernels call it from one thread only.
// Both give the same bits for any thread count (measured: they split M and N, never K; tested in
// tests/kernels). Thread-safety: sgemm may be called concurrently; set_* must not race with kernels.
#pragma once

#include <cstdint>
#include <string>

#include "piper/base/status.h"

namespace piper::kernels {

enum class GemmBackend { kOneDnn, kOpenBlas };

const char* to_string(GemmBackend backend);
// "onednn" or "openblas"; InvalidArgument listing the choices otherwise.
Result<GemmBackend> parse_gemm_backend(const std::string& text);
bool gemm_backend_available(GemmBackend backend);
GemmBackend gemm_backend();
// FailedPrecondition if the backend was not built in.
Status set_gemm_backend(GemmBackend backend);
// True when sgemm may be called from inside the kernels' own OpenMP parallel regions.
bool gemm_nests_in_threads();

// Row-major C[m,n] = alpha · op(A) · op(B) + beta · C. op(A) is [m,k]; A is stored [k,m] when trans_a.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Threads used by kernels and by the GEMM libraries (OpenMP and OpenBLAS). Results do not depend on it.
void set_kernel_threads(int num_threads);
int kernel_threads();

// Non-empty when the environment makes OpenBLAS slow on an AVX-512 CPU: OPENBLAS_CORETYPE unset (0.3.21 may not
// recognise the core and fall back to SSE3 kernels) or set to an AVX2-only family (Haswell, Zen: about 2x slower
// than SkylakeX/Cooperlake). The text says what to set. The pure form takes the variable (nullptr = unset) and
// whether the CPU has AVX-512. warn_gemm_environment() logs the warning once per process (call at start-up).
std::string gemm_environment_warning(const char* coretype, bool cpu_has_avx512);
std::string gemm_environment_warning();
void warn_gemm_environment();

}  // namespace piper::kernels
