// mlp (dense layers) and the feed-forward block shared with `shared`: y = SwiGLU(rms(x)) (+ x when residual).
#include "piper/kernels/cpu/gemm.h"
#include "piper/kernels/cpu/ops.h"
#include "piper/kernels/cpu/vec_math.h"
#include "piper/runtime/model/chunks/parts.h"

namespace piper::runtime {
namespace {

struct FfnStash : Stash {
  int64_t n = 0;
  std::shared_ptr<const Tensor> x;
  Tensor rstd, xn, g, u, hh;  // hh = silu(g) * u (down-projection input)
  // B -> W
  std::shared_ptr<const Tensor> dout;
  Tensor dg, du, dxn;
};

class FfnChunk : public RowPiecesChunk {
 public:
  FfnChunk(Part part, int layer, const ChunkDims& d, int64_t width, bool residual, uint64_t seed, Allocator* allocator)
      : RowPiecesChunk(part, layer, d, allocator), f_(width), residual_(residual) {
    add_param("norm", {d.hidden}, seed, 0.0f, 1.0f, false);
    add_param("w_gate", {f_, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("w_up", {f_, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("w_down", {d.hidden, f_}, seed, residual_init_std(d), 0.0f, true);
  }

  // Run whole, as its pieces over every row (RowPiecesChunk; the fast swiglu kernels' steps, in their order).
  int64_t stash_rows(const Stash& stash) const override { return static_cast<const FfnStash&>(stash).n; }

  std::unique_ptr<Stash> forward_begin(const Microbatch& mb, std::shared_ptr<const Tensor> x) override {
    const int64_t n = mb.num_tokens();
    auto st = std::make_unique<FfnStash>();
    st->n = n;
    st->x = std::move(x);
    st->rstd = new_output({n}, MemCategory::kActivations);
    st->xn = new_output({n, dims_.hidden}, MemCategory::kActivations);
    st->g = new_output({n, f_}, MemCategory::kActivations);
    st->u = new_output({n, f_}, MemCategory::kActivations);
    st->hh = new_output({n, f_}, MemCategory::kActivations);
    return st;
  }

  // Norm, gate and up projections of `rows`.
  void forward_in(Stash& stash, RowRange r) override {
    auto& st = static_cast<FfnStash&>(stash);
    const int64_t h = dims_.hidden;
    if (r.size() == 0) return;
    const float* xn = st.xn.data() + r.begin * h;
    kernels::rmsnorm_forward(st.xn.data() + r.begin * h, st.rstd.data() + r.begin, st.x->data() + r.begin * h, w(0),
                             r.size(), h, dims_.norm_eps);
    kernels::linear_forward(st.g.data() + r.begin * f_, xn, w(1), r.size(), h, f_);
    kernels::linear_forward(st.u.data() + r.begin * f_, xn, w(2), r.size(), h, f_);
  }

  // The SwiGLU gate of every row.
  void forward_rest(Stash& stash) override {
    auto& st = static_cast<FfnStash&>(stash);
    for (int64_t i = 0; i < st.n; ++i) {
      kernels::vec::swiglu_gate_forward(st.hh.data() + i * f_, st.g.data() + i * f_, st.u.data() + i * f_, f_);
    }
  }

  // The down projection (and the residual) of `rows` into y.
  void forward_out(Stash& stash, RowRange r, Tensor* y) override {
    auto& st = static_cast<FfnStash&>(stash);
    const int64_t h = dims_.hidden;
    if (r.size() == 0) return;
    float* yr = y->data() + r.begin * h;
    kernels::linear_forward(yr, st.hh.data() + r.begin * f_, w(3), r.size(), f_, h);
    if (residual_) add_into(yr, yr, st.x->data() + r.begin * h, r.size() * h);
  }

  void backward_begin(Stash& stash, std::shared_ptr<const Tensor> dout) override {
    auto& st = static_cast<FfnStash&>(stash);
    st.dout = std::move(dout);
    st.dxn = new_output({st.n, dims_.hidden}, MemCategory::kBuffers);
    st.dg = new_output({st.n, f_}, MemCategory::kBuffers);
    st.du = new_output({st.n, f_}, MemCategory::kBuffers);
  }

  // The down projection's input gradient of `rows` (held in dg until the gate's backward).
  void backward_in(Stash& stash, RowRange r) override {
    auto& st = static_cast<FfnStash&>(stash);
    if (r.size() == 0) return;
    kernels::linear_backward_input(st.dg.data() + r.begin * f_, st.dout->data() + r.begin * dims_.hidden, w(3),
                                   r.size(), f_, dims_.hidden);
  }

  // The SwiGLU gate's backward of every row.
  void backward_rest(Stash& stash) override {
    auto& st = static_cast<FfnStash&>(stash);
    for (int64_t i = 0; i < st.n; ++i) {
      float* dg = st.dg.data() + i * f_;
      kernels::vec::swiglu_gate_backward(dg, st.du.data() + i * f_, dg, st.g.data() + i * f_, st.u.data() + i * f_, f_);
    }
  }

  // The gate and up projections' and the norm's input gradients (and the residual's) of `rows` into dx.
  void backward_out(Stash& stash, RowRange r, Tensor* dx) override {
    auto& st = static_cast<FfnStash&>(stash);
    const int64_t h = dims_.hidden, m = r.size();
    if (m == 0) return;
    float* dxn = st.dxn.data() + r.begin * h;
    float* dxr = dx->data() + r.begin * h;
    kernels::sgemm(false, false, m, h, f_, 1.0f, st.dg.data() + r.begin * f_, f_, w(1), h, 0.0f, dxn, h);
    kernels::sgemm(false, false, m, h, f_, 1.0f, st.du.data() + r.begin * f_, f_, w(2), h, 1.0f, dxn, h);
    kernels::rmsnorm_backward_input(dxr, dxn, st.x->data() + r.begin * h, w(0), st.rstd.data() + r.begin, m, h);
    if (residual_) add_into(dxr, dxr, st.dout->data() + r.begin * h, m * h);
  }

  void backward_weight(const StepContext& ctx, Stash& stash) override {
    auto& st = static_cast<FfnStash&>(stash);
    const int64_t n = st.n, h = dims_.hidden;
    kernels::rmsnorm_backward_weight(g(0), st.dxn.data(), st.x->data(), st.rstd.data(), n, h);
    kernels::swiglu_backward_weight(g(1), g(2), g(3), st.dout->data(), st.xn.data(), st.hh.data(), st.dg.data(),
                                    st.du.data(), n, h, f_);
    st.dout.reset();
    st.dg = Tensor();
    st.du = Tensor();
    st.dxn = Tensor();
  }

 private:
  const float* w(size_t i) const { return params_[i].value.data(); }
  float* g(size_t i) { return params_[i].grad.data(); }
  int64_t f_;
  bool residual_;
};

}  // namespace

std::unique_ptr<Chunk> make_ffn_chunk(Part part, int layer, const ChunkDims& dims, int64_t width, bool residual,
                                      uint64_t seed, Allocator* allocator) {
  return std::make_unique<FfnChunk>(part, layer, dims, width, residual, seed, allocator);
}

std::unique_ptr<Chunk> make_mlp_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator) {
  return make_ffn_chunk(Part::kDenseMlp, layer, dims, dims.intermediate, true, seed, allocator);
}

}  // namespace piper::runtime
