#include "piper/kernels/cpu/gemm.h"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "piper/base/check.h"
#include "piper/base/log.h"

#if PIPER_HAVE_OPENBLAS
#include <cblas.h>
#endif
#if PIPER_HAVE_ONEDNN
#include <dnnl.h>
#endif

namespace piper::kernels {
namespace {

GemmBackend default_backend() { return PIPER_HAVE_ONEDNN ? GemmBackend::kOneDnn : GemmBackend::kOpenBlas; }

std::atomic<GemmBackend>& current_backend() {
  static std::atomic<GemmBackend> backend{default_backend()};
  return backend;
}

[[maybe_unused]] bool cpu_has_avx512() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) return line.find(" avx512f") != std::string::npos;
  }
  return false;
}

}  // namespace

const char* to_string(GemmBackend backend) { return backend == GemmBackend::kOneDnn ? "onednn" : "openblas"; }

Result<GemmBackend> parse_gemm_backend(const std::string& text) {
  if (text == "onednn") return GemmBackend::kOneDnn;
  if (text == "openblas") return GemmBackend::kOpenBlas;
  return invalid_argument("unknown GEMM backend '" + text + "'; choose onednn or openblas");
}

bool gemm_backend_available(GemmBackend backend) {
  return backend == GemmBackend::kOneDnn ? PIPER_HAVE_ONEDNN != 0 : PIPER_HAVE_OPENBLAS != 0;
}

GemmBackend gemm_backend() { return current_backend().load(); }

Status set_gemm_backend(GemmBackend backend) {
  if (!gemm_backend_available(backend)) {
    return failed_precondition(std::string("GEMM backend ") + to_string(backend) +
                               " was not built in; install its package (scripts/setup.sh) and reconfigure");
  }
  current_backend().store(backend);
  return ok_status();
}

bool gemm_nests_in_threads() { return gemm_backend() == GemmBackend::kOneDnn; }

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
#if PIPER_HAVE_ONEDNN
  if (gemm_backend() == GemmBackend::kOneDnn) {
    const dnnl_status_t st =
        dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    PIPER_CHECK(st == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(st), " for m=", m, " n=", n,
                " k=", k);
    return;
  }
#endif
#if PIPER_HAVE_OPENBLAS
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
#else
  PIPER_CHECK(false, "no GEMM backend built in");
#endif
}

void set_kernel_threads(int num_threads) {
  PIPER_CHECK(num_threads >= 1, "thread count ", num_threads);
  omp_set_num_threads(num_threads);
#if PIPER_HAVE_OPENBLAS
  openblas_set_num_threads(num_threads);
#endif
}

int kernel_threads() { return omp_get_max_threads(); }

std::string gemm_environment_warning(const char* coretype, bool has_avx512) {
  if (!has_avx512) return "";
  if (coretype == nullptr) {
    return "OPENBLAS_CORETYPE is unset on an AVX-512 CPU: OpenBLAS 0.3.21 may not recognise the core and fall back "
           "to SSE3 kernels (2-8x slower GEMMs). Source scripts/env.sh or export OPENBLAS_CORETYPE=Cooperlake before "
           "starting piper.";
  }
  const std::string ct = coretype;
  for (const char* slow : {"Haswell", "Zen", "Sandybridge", "Prescott", "Nehalem", "Core2", "Excavator"}) {
    if (ct == slow) {
      return "OPENBLAS_CORETYPE=" + ct +
             " selects AVX2-or-older kernels on an AVX-512 CPU (about 2x slower GEMMs "
             "with OpenBLAS); export OPENBLAS_CORETYPE=Cooperlake (or SkylakeX) before starting piper.";
    }
  }
  return "";
}

std::string gemm_environment_warning() {
#if PIPER_HAVE_OPENBLAS
  static const bool has_avx512 = cpu_has_avx512();
  return gemm_environment_warning(std::getenv("OPENBLAS_CORETYPE"), has_avx512);
#else
  return "";
#endif
}

void warn_gemm_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string w = gemm_environment_warning();
    if (!w.empty()) {
      PIPER_LOG(WARN) << w;
    }
  });
}

}  // namespace piper::kernels
