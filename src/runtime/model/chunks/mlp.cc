// mlp (dense layers) and the feed-forward block shared with `shared`: y = SwiGLU(rms(x)) (+ x when residual).
#include "piper/kernels/cpu/ops.h"
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

class FfnChunk : public Chunk {
 public:
  FfnChunk(Part part, int layer, const ChunkDims& d, int64_t width, bool residual, uint64_t seed, Allocator* allocator)
      : Chunk(part, layer, d, allocator), f_(width), residual_(residual) {
    add_param("norm", {d.hidden}, seed, 0.0f, 1.0f, false);
    add_param("w_gate", {f_, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("w_up", {f_, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("w_down", {d.hidden, f_}, seed, residual_init_std(d), 0.0f, true);
  }

  Result<std::unique_ptr<Stash>> forward(const StepContext& ctx, const Microbatch& mb,
                                         const std::vector<const Activation*>& inputs, Activation* out) override {
    const int64_t n = mb.num_tokens(), h = dims_.hidden;
    auto st = std::make_unique<FfnStash>();
    st->n = n;
    PIPER_ASSIGN_OR_RETURN(st->x, sum_hidden(*this, inputs, n, h));
    st->rstd = new_output({n}, MemCategory::kActivations);
    st->xn = new_output({n, h}, MemCategory::kActivations);
    kernels::rmsnorm_forward(st->xn.data(), st->rstd.data(), st->x->data(), w(0), n, h, dims_.norm_eps);
    st->g = new_output({n, f_}, MemCategory::kActivations);
    st->u = new_output({n, f_}, MemCategory::kActivations);
    st->hh = new_output({n, f_}, MemCategory::kActivations);
    auto y = new_shared_output({n, h}, MemCategory::kActivations);
    kernels::swiglu_forward(y->data(), st->g.data(), st->u.data(), st->hh.data(), st->xn.data(), w(1), w(2), w(3), n,
                            h, f_);
    if (residual_) add_into(y->data(), y->data(), st->x->data(), n * h);
    out->hidden = std::move(y);
    return std::unique_ptr<Stash>(std::move(st));
  }

  Status backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads, Stash& stash,
                        Gradient* dx) override {
    auto& st = static_cast<FfnStash&>(stash);
    const int64_t n = st.n, h = dims_.hidden;
    PIPER_ASSIGN_OR_RETURN(st.dout, sum_dhidden(*this, grads, n, h));
    st.dxn = new_output({n, h}, MemCategory::kBuffers);
    st.dg = new_output({n, f_}, MemCategory::kBuffers);
    st.du = new_output({n, f_}, MemCategory::kBuffers);
    kernels::swiglu_backward_input(st.dxn.data(), st.dg.data(), st.du.data(), st.dout->data(), st.g.data(),
                                   st.u.data(), w(1), w(2), w(3), n, h, f_);
    auto dxt = new_shared_output({n, h}, MemCategory::kBuffers);
    kernels::rmsnorm_backward_input(dxt->data(), st.dxn.data(), st.x->data(), w(0), st.rstd.data(), n, h);
    if (residual_) add_into(dxt->data(), dxt->data(), st.dout->data(), n * h);
    dx->dhidden = std::move(dxt);
    return ok_status();
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
