// Device management, buffers, errors and the GEMMs (cuBLASLt; grouped through cublasGemmGroupedBatchedEx).
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

#include "piper/kernels/cuda/cuda_common.cuh"

namespace piper::kernels::cuda {
namespace detail {

void throw_cuda(const char* call, const std::string& error, const char* file, int line) {
  throw CudaError(std::string(call) + " failed: " + error + " (" + file + ":" + std::to_string(line) + ")");
}

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw_cuda((std::string("launch of kernel ") + kernel).c_str(),
               std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e), file, line);
  }
}

namespace {
constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt workspace (Hopper kernels want >= 32 MiB)

struct State {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  State() {
    PIPER_CUDA_CHECK(cudaSetDevice(0));
    PIPER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // Keep freed blocks in the stream-ordered pool instead of returning them at every synchronisation: the
    // trainer allocates and frees its activations every microbatch.
    cudaMemPool_t pool = nullptr;
    PIPER_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    PIPER_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    PIPER_CUBLAS_CHECK(cublasCreate(&cublas));
    PIPER_CUBLAS_CHECK(cublasSetStream(cublas, stream));
    PIPER_CUBLAS_CHECK(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH));
    PIPER_CUBLAS_CHECK(cublasSetWorkspace(cublas, nullptr, 0));
    PIPER_CUBLAS_CHECK(cublasLtCreate(&lt));
    PIPER_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
  }
};

State& state() {
  static State* s = new State();  // never destroyed: kernels may run until exit
  return *s;
}
}  // namespace

cudaStream_t stream() { return state().stream; }
cublasHandle_t cublas() { return state().cublas; }
cublasLtHandle_t cublas_lt() { return state().lt; }
void* lt_workspace() { return state().workspace; }
size_t lt_workspace_bytes() { return kWorkspaceBytes; }

}  // namespace detail

using detail::stream;

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

Status device_status() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return failed_precondition(std::string("no CUDA device: cudaGetDeviceCount failed with ") + cudaGetErrorName(e) +
                               " (" + cudaGetErrorString(e) + "); run on a machine with an NVIDIA GPU and driver");
  }
  if (n == 0) return failed_precondition("no CUDA device: cudaGetDeviceCount found 0 devices");
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major < 9) {
    return failed_precondition("no CUDA device: device 0 (" + std::string(p.name) + ") is sm_" +
                               std::to_string(p.major * 10 + p.minor) +
                               " but Piper's kernels are built for sm_90 only (PIPER_CUDA_ARCH)");
  }
  return ok_status();
}

std::string device_description() {
  cudaDeviceProp p{};
  PIPER_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  char mem[64];
  std::snprintf(mem, sizeof(mem), "%.1f GiB", static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " + mem + ", " +
         std::to_string(p.multiProcessorCount) + " SMs";
}

void synchronize() { PIPER_CUDA_CHECK(cudaStreamSynchronize(stream())); }

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) PIPER_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, stream()));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream());
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream());
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

template <typename T>
DeviceBuffer device_array(int64_t count, bool zero) {
  DeviceBuffer b(static_cast<size_t>(count) * sizeof(T));
  if (zero && count > 0) fill_zero(b.get(), b.bytes());
  return b;
}
template DeviceBuffer device_array<float>(int64_t, bool);
template DeviceBuffer device_array<double>(int64_t, bool);
template DeviceBuffer device_array<uint16_t>(int64_t, bool);
template DeviceBuffer device_array<int32_t>(int64_t, bool);
template DeviceBuffer device_array<int64_t>(int64_t, bool);

void copy_to_device(void* dst, const void* host_src, size_t bytes) {
  PIPER_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream()));
  PIPER_CUDA_CHECK(cudaStreamSynchronize(stream()));  // the host buffer may go away after we return
}
void copy_to_host(void* host_dst, const void* src, size_t bytes) {
  PIPER_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  PIPER_CUDA_CHECK(cudaStreamSynchronize(stream()));
}
void copy_device(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) PIPER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}
void fill_zero(void* dst, size_t bytes) {
  if (bytes > 0) PIPER_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
}

void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  PIPER_CUDA_CHECK(cudaMemcpy2DAsync(
      dst, static_cast<size_t>(dst_ld) * sizeof(float), src, static_cast<size_t>(src_ld) * sizeof(float),
      static_cast<size_t>(cols) * sizeof(float), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream()));
}

// ---------------------------------------------------------------- GEMM
namespace {

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristics must know it.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

struct LtKey {
  int type;  // 0 = bf16 operands, 1 = fp32
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  uint32_t al_a, al_b, al_c;
  bool beta_zero;
  bool operator<(const LtKey& o) const {
    return std::tie(type, ta, tb, m, n, k, lda, ldb, ldc, al_a, al_b, al_c, beta_zero) <
           std::tie(o.type, o.ta, o.tb, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.al_a, o.al_b, o.al_c, o.beta_zero);
  }
};

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

std::mutex g_lt_mutex;
std::map<LtKey, LtPlan>& lt_plans() {
  static auto* m = new std::map<LtKey, LtPlan>();
  return *m;
}

// Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's first operand is our B, its second
// our A. A row-major [r, c] array with leading dimension ld is a column-major [c, r] one.
const LtPlan& lt_plan(const LtKey& key) {
  std::lock_guard<std::mutex> lock(g_lt_mutex);
  auto it = lt_plans().find(key);
  if (it != lt_plans().end()) return it->second;
  const cudaDataType_t in_type = key.type == 0 ? CUDA_R_16BF : CUDA_R_32F;
  LtPlan p;
  PIPER_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's op on its first operand (our B): stored col-major [n, k] (row-major B [k, n]) needs none;
  // stored [k, n] (trans_b: row-major B [n, k]) is transposed.
  const cublasOperation_t op_first = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  PIPER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  PIPER_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  // First operand (our B): column-major rows x cols as stored.
  const uint64_t b_rows = key.tb ? key.k : key.n, b_cols = key.tb ? key.n : key.k;
  const uint64_t a_rows = key.ta ? key.m : key.k, a_cols = key.ta ? key.k : key.m;
  PIPER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in_type, b_rows, b_cols, key.ldb));
  PIPER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in_type, a_rows, a_cols, key.lda));
  PIPER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, key.n, key.m, key.ldc));
  cublasLtMatmulPreference_t pref = nullptr;
  PIPER_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = detail::lt_workspace_bytes();
  PIPER_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // Lt's A is our B and vice versa.
  PIPER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.al_b,
                                                          sizeof(key.al_b)));
  PIPER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.al_a,
                                                          sizeof(key.al_a)));
  PIPER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.al_c,
                                                          sizeof(key.al_c)));
  PIPER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.al_c,
                                                          sizeof(key.al_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(detail::cublas_lt(), p.desc, p.b, p.a, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    detail::throw_cuda("cublasLtMatmulAlgoGetHeuristic",
                       std::string(st != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(st) : "no algorithm") +
                           " for m=" + std::to_string(key.m) + " n=" + std::to_string(key.n) +
                           " k=" + std::to_string(key.k) + (key.type == 0 ? " bf16" : " fp32"),
                       __FILE__, __LINE__);
  }
  p.algo = result.algo;
  return lt_plans().emplace(key, p).first->second;
}

void lt_gemm(int type, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
             const void* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // C = beta · C
    if (beta == 0.0f) {
      for (int64_t i = 0; i < m; ++i) fill_zero(c + i * ldc, static_cast<size_t>(n) * sizeof(float));
    } else if (beta != 1.0f) {
      detail::throw_cuda("gemm", "k = 0 with beta other than 0 or 1 is not supported", __FILE__, __LINE__);
    }
    return;
  }
  const LtKey key{type, ta, tb, m, n, k, lda, ldb, ldc, alignment(a), alignment(b), alignment(c), beta == 0.0f};
  const LtPlan& p = lt_plan(key);
  PIPER_CUBLAS_CHECK(cublasLtMatmul(detail::cublas_lt(), p.desc, &alpha, b, p.b, a, p.a, &beta, c, p.c, c, p.c, &p.algo,
                                    detail::lt_workspace(), detail::lt_workspace_bytes(), stream()));
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Bf16* a, int64_t lda,
               const Bf16* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  lt_gemm(0, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  lt_gemm(1, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void grouped_gemm_bf16(const std::vector<GemmProblem>& problems, GroupedMode mode) {
  if (problems.empty()) return;
  if (mode == GroupedMode::kGrouped) {
    // One group per problem (column-major: first operand our B, second our A, like lt_gemm).
    const size_t g = problems.size();
    std::vector<cublasOperation_t> ta(g), tb(g);
    std::vector<int64_t> m(g), n(g), k(g), lda(g), ldb(g), ldc(g), size(g, 1);
    std::vector<float> alpha(g), beta(g);
    std::vector<const void*> ptrs(3 * g);
    bool usable = true;
    for (size_t i = 0; i < g; ++i) {
      const GemmProblem& p = problems[i];
      if (p.k <= 0) usable = false;
      ta[i] = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      tb[i] = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      m[i] = p.n, n[i] = p.m, k[i] = p.k;
      lda[i] = p.ldb, ldb[i] = p.lda, ldc[i] = p.ldc;
      alpha[i] = p.alpha, beta[i] = p.beta;
      ptrs[i] = p.b, ptrs[g + i] = p.a, ptrs[2 * g + i] = p.c;
    }
    if (usable) {
      static DeviceBuffer* dev_ptrs = new DeviceBuffer();
      if (dev_ptrs->bytes() < ptrs.size() * sizeof(void*)) *dev_ptrs = DeviceBuffer(ptrs.size() * sizeof(void*) * 2);
      PIPER_CUDA_CHECK(
          cudaMemcpyAsync(dev_ptrs->get(), ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice, stream()));
      const void* const* d = static_cast<const void* const*>(dev_ptrs->get());
      const cublasStatus_t st = cublasGemmGroupedBatchedEx_64(
          detail::cublas(), ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), d, CUDA_R_16BF,
          lda.data(), d + g, CUDA_R_16BF, ldb.data(), beta.data(), const_cast<void* const*>(d + 2 * g), CUDA_R_32F,
          ldc.data(), static_cast<int64_t>(g), size.data(), CUBLAS_COMPUTE_32F);
      // The pageable source was staged before cudaMemcpyAsync returned; wait so that `ptrs` may go.
      PIPER_CUDA_CHECK(cudaStreamSynchronize(stream()));
      if (st == CUBLAS_STATUS_SUCCESS) return;
      if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE) {
        detail::throw_cuda("cublasGemmGroupedBatchedEx_64", cublasGetStatusString(st), __FILE__, __LINE__);
      }
      // This cuBLAS has no bf16-in / fp32-out grouped GEMM: one cuBLASLt call per problem instead.
    }
  }
  for (const GemmProblem& p : problems) {
    gemm_bf16(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, p.a, p.lda, p.b, p.ldb, p.beta, p.c, p.ldc);
  }
}

}  // namespace piper::kernels::cuda
