// CUDA kernels of the training step (bf16 GEMMs with fp32 accumulation, fp32 element-wise math), behind a plain
// C++ API: no CUDA type appears here, so CPU code (the GPU trainer, tests) includes it without nvcc.
//
// Precision: every GEMM reads bf16 operands (uint16_t bit patterns, see Bf16) and accumulates and writes fp32;
// norms, softmax, rotary, SwiGLU's activation, the loss and AdamW run in fp32. Kernels that produce a GEMM
// operand also write its bf16 copy (fused cast), and AdamW writes the bf16 copy of each fp32 master weight.
// Layouts and semantics are those of the CPU reference (kernels/cpu/reference.h, moe_reference.h): row-major,
// weights [out, in], attention [batch, seq, heads, head_dim]. Pointers are device pointers unless named host_.
// All work runs in order on one CUDA stream owned by this library; host copies synchronise it.
// Determinism: no kernel uses atomics; every reduction has a fixed order (same inputs -> same bits). cuBLAS(Lt)
// is deterministic for a fixed algorithm on the same GPU.
// Errors: a failed CUDA, cuBLAS or cuBLASLt call throws CudaError naming the call, the error string, the
// file and the line. device_status() never throws.
// Built only with the CUDA toolkit (PIPER_CUDA, src/kernels/CMakeLists.txt); kernels/cuda/host_plan.h holds the
// host-side parts that every build has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/kernels/cuda/host_plan.h"

namespace piper::kernels::cuda {

using Bf16 = uint16_t;  // bf16 bit pattern (the upper half of an fp32)

class CudaError : public std::runtime_error {
 public:
  explicit CudaError(const std::string& what) : std::runtime_error(what) {}
};

// Number of usable CUDA devices; 0 when there is none or no driver (never throws).
int device_count();
// OK when device 0 can be used. Otherwise FailedPrecondition "no CUDA device: <reason from the runtime>".
Status device_status();
// "NVIDIA H200, sm_90, 139.8 GiB" (device 0); throws CudaError without a device.
std::string device_description();
// Waits for all work queued so far.
void synchronize();

// Owning device allocation (stream-ordered, from the CUDA memory pool). Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A device array of `count` T (zeroed when zero = true).
template <typename T>
DeviceBuffer device_array(int64_t count, bool zero = false);

void copy_to_device(void* dst, const void* host_src, size_t bytes);
void copy_to_host(void* host_dst, const void* src, size_t bytes);
void copy_device(void* dst, const void* src, size_t bytes);
void fill_zero(void* dst, size_t bytes);
// Strided 2-D copy of `rows` rows of `cols` floats (row pitches dst_ld, src_ld in elements), device to device.
void copy_columns(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols);

template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer b(host.size() * sizeof(T));
  if (!host.empty()) copy_to_device(b.get(), host.data(), host.size() * sizeof(T));
  return b;
}
template <typename T>
std::vector<T> download(const void* src, int64_t count) {
  std::vector<T> out(static_cast<size_t>(count));
  if (count > 0) copy_to_host(out.data(), src, static_cast<size_t>(count) * sizeof(T));
  return out;
}

// ---- conversions and element-wise helpers
void cast_to_bf16(Bf16* out, const float* in, int64_t n);
void cast_to_f32(float* out, const Bf16* in, int64_t n);
// out = a + scale * b (out may alias a or b).
void add_scaled(float* out, const float* a, const float* b, float scale, int64_t n);

// ---- GEMM, row-major like ref::gemm: C[m,n] = alpha · op(A) · op(B) + beta · C (op(A) is [m,k]; A is stored
// [k,m] when trans_a). bf16 operands, fp32 accumulation and fp32 C (cuBLASLt).
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const Bf16* a, int64_t lda,
               const Bf16* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Same contract in fp32 (no TF32): the router's logits and tests.
void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Many independent bf16 GEMMs (experts). kGrouped: one cublasGemmGroupedBatchedEx call (falls back to kLoop if
// this cuBLAS rejects the types); kLoop: one cuBLASLt call per problem.
enum class GroupedMode { kGrouped, kLoop };
void grouped_gemm_bf16(const std::vector<GemmProblem>& problems, GroupedMode mode = GroupedMode::kGrouped);

// ---- embedding: out[i] = table[ids[i]]; W: dtable[v] += sum of dout rows of the tokens with id v, in token
// order (plan: EmbeddingPlan uploaded as offsets [vocab + 1] and tokens [n]).
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t n, int64_t d);
void embedding_backward_weight(float* dtable, const float* dout, const int64_t* offsets, const int64_t* tokens,
                               int64_t vocab, int64_t d);

// ---- RMSNorm (one block per row). y_bf16 may be null. dx = B (+ add when add != null, the residual's gradient).
void rmsnorm_forward(float* y, Bf16* y_bf16, float* rstd, const float* x, const float* w, int64_t n, int64_t d,
                     double eps);
void rmsnorm_backward_input(float* dx, const float* dy, const float* x, const float* w, const float* rstd,
                            const float* add, int64_t n, int64_t d);
void rmsnorm_backward_weight(float* dw, const float* dy, const float* x, const float* rstd, int64_t n, int64_t d);

// ---- rotary on [batch, seq, heads, head_dim]; sign = +1 forward, -1 backward (the transpose). out may alias x.
void rotary(float* out, const float* x, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, double theta,
            double sign);

// ---- causal GQA attention, fp32, flash-style: online softmax over key tiles, no [seq, seq] matrix; saves the
// log-sum-exp lse [batch, q_heads, seq] for the backward, which recomputes the probabilities.
struct AttnShape {
  int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
};
constexpr int64_t kMaxAttnHeadDim = 256;
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const AttnShape& s);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                        const float* q, const float* k, const float* v, const AttnShape& s);

// ---- SwiGLU activation: h = silu(g) · u (+ bf16 copy); backward from dh: dg, du (dg may alias dh).
void swiglu_act_forward(float* h, Bf16* h_bf16, const float* g, const float* u, int64_t count);
void swiglu_act_backward(float* dg, float* du, const float* dh, const float* g, const float* u, int64_t count);

// ---- router: `scores` holds the logits [n, E] on entry, the scores on exit (softmax or sigmoid); selects the
// top_k by score + bias (bias may be null; ties -> lower index), topk_w normalised when norm_topk.
void router_select(float* scores, int32_t* topk_idx, float* topk_w, const float* bias, int64_t n, int num_experts,
                   int top_k, bool softmax, bool norm_topk);
// dlogits from dtopk_w; aux_ds [E] is the per-expert constant gradient of the load-balance loss on the scores
// (coef·E·count_e/(n·k)/n, zeros without the aux loss).
void router_dlogits(float* dlogits, const float* dtopk_w, const float* scores, const int32_t* topk_idx,
                    const float* topk_w, const float* aux_ds, int64_t n, int num_experts, int top_k, bool softmax,
                    bool norm_topk);
// out[c] = sum_r in[r, c] in row order (fp64 accumulation), written as double.
void column_sums(double* out, const float* in, int64_t rows, int64_t cols);

// ---- MoE dispatch / combine (Routing uploaded: row_of_slot [n·k], token_of_row [rows]).
// xp[row] = x[token_of_row[row]] (fp32 and/or bf16; either may be null).
void permute_forward(float* xp, Bf16* xp_bf16, const float* x, const int64_t* token_of_row, int64_t rows, int64_t d);
// dx[t] = sum_j dxp[row_of_slot[t, j]] (+ add[t] when add != null).
void permute_backward(float* dx, const float* dxp, const int64_t* row_of_slot, const float* add, int64_t n, int top_k,
                      int64_t d);
// y[t] = residual[t] + scale · sum_j topk_w[t,j] · yp[row_of_slot[t,j]] (residual may be null).
void unpermute_forward(float* y, const float* yp, const float* topk_w, const int64_t* row_of_slot,
                       const float* residual, float scale, int64_t n, int top_k, int64_t d);
// With dys = scale · dy: dyp[row_of_slot[t,j]] = topk_w[t,j] · dys[t] (+ bf16 copy), dtopk_w[t,j] = dys[t]·yp[row].
void unpermute_backward(float* dyp, Bf16* dyp_bf16, float* dtopk_w, const float* dy, const float* yp,
                        const float* topk_w, const int64_t* row_of_slot, float scale, int64_t n, int top_k, int64_t d);

// ---- LM head loss: `probs` holds the logits [n, V] on entry, the softmax on exit; row_loss[i] =
// -log softmax(logits_i)[targets_i] (the mean is summed on the host in order). B: dlogits = scale · (probs -
// onehot) (+ bf16 copy), scale = dloss / n.
void softmax_xent_forward(float* probs, float* row_loss, const int32_t* targets, int64_t n, int64_t vocab);
void softmax_xent_backward(float* dlogits, Bf16* dlogits_bf16, const float* probs, const int32_t* targets, float scale,
                           int64_t n, int64_t vocab);

// ---- optimizer
// partials[b] = sum of g² over block b of kNormBlock elements (fp64), b < ceil(n / kNormBlock).
constexpr int64_t kNormBlock = 4096;
void sum_squares_blocks(double* partials, const float* g, int64_t n);
struct AdamWArgs {
  float lr = 0, b1 = 0, b2 = 0, bc1 = 1, bc2 = 1, eps = 0, wd = 0, grad_scale = 1;
};
// fp32 master p, moments m, v; p_bf16 (may be null) receives the bf16 copy used by the GEMMs.
void adamw(float* p, Bf16* p_bf16, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a);

}  // namespace piper::kernels::cuda
