// experts: permute the normed tokens by expert, grouped SwiGLU experts, weighted unpermute, residual add.
#include "piper/kernels/cpu/ops.h"
#include "piper/runtime/chunks/parts.h"

namespace piper::runtime {
namespace {

struct ExpertsStash : Stash {
  int64_t n = 0;
  std::shared_ptr<const Routed> routed;
  Tensor xp, g, u, hh, yp;  // [rows, h] / [rows, f]: dispatched tokens, intermediates, expert outputs
  // B -> W
  Tensor dyp, dg, du;
};

class ExpertsChunk : public Chunk {
 public:
  ExpertsChunk(int layer, const ChunkDims& d, uint64_t seed, Allocator* allocator)
      : Chunk("experts", layer, d, allocator) {
    const int64_t E = d.num_experts, f = d.expert_intermediate;
    add_param("w_gate", {E, f, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("w_up", {E, f, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("w_down", {E, d.hidden, f}, seed, residual_init_std(d), 0.0f, true);
  }

  Result<std::unique_ptr<Stash>> forward(const StepContext& ctx, const Microbatch& mb,
                                         const std::vector<const Activation*>& inputs, Activation* out) override {
    const int64_t n = mb.num_tokens(), h = dims_.hidden, f = dims_.expert_intermediate;
    if (inputs.size() != 1 || !inputs[0]->routed || !inputs[0]->hidden || inputs[0]->hidden->numel() != n * h) {
      return invalid_argument(name() + ": expects one input from its router (residual + routing), got " +
                              std::to_string(inputs.size()) + "; the graph must link router -> experts");
    }
    auto st = std::make_unique<ExpertsStash>();
    st->n = n;
    st->routed = inputs[0]->routed;
    const Routed& r = *st->routed;
    const int64_t rows = n * dims_.top_k;
    st->xp = new_output({rows, h}, MemCategory::kActivations);
    kernels::permute_forward(st->xp.data(), r.normed->data(), r.routing, h);
    st->g = new_output({rows, f}, MemCategory::kActivations);
    st->u = new_output({rows, f}, MemCategory::kActivations);
    st->hh = new_output({rows, f}, MemCategory::kActivations);
    st->yp = new_output({rows, h}, MemCategory::kActivations);
    kernels::expert_swiglu_forward(st->yp.data(), st->g.data(), st->u.data(), st->hh.data(), st->xp.data(), w(0), w(1),
                                   w(2), r.routing, h, f);
    auto y = new_shared_output({n, h}, MemCategory::kActivations);
    kernels::unpermute_forward(y->data(), st->yp.data(), r.topk_w.data(), r.routing, h);
    const float scale = static_cast<float>(dims_.routed_scaling);
    const float* x = inputs[0]->hidden->data();
    float* yd = y->data();
    for (int64_t i = 0; i < n * h; ++i) yd[i] = x[i] + scale * yd[i];
    out->hidden = std::move(y);
    return std::unique_ptr<Stash>(std::move(st));
  }

  Status backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads, Stash& stash,
                        Gradient* dx) override {
    auto& st = static_cast<ExpertsStash&>(stash);
    const int64_t n = st.n, h = dims_.hidden, f = dims_.expert_intermediate, rows = n * dims_.top_k;
    const Routed& r = *st.routed;
    PIPER_ASSIGN_OR_RETURN(auto dout, sum_dhidden(*this, grads, n, h));
    const float* dy = dout->data();
    Tensor scaled;
    if (dims_.routed_scaling != 1.0) {
      scaled = dout->clone(MemCategory::kBuffers);
      for (int64_t i = 0; i < n * h; ++i) scaled[i] *= static_cast<float>(dims_.routed_scaling);
      dy = scaled.data();
    }
    st.dyp = new_output({rows, h}, MemCategory::kBuffers);
    auto dtopk_w = new_shared_output({n, dims_.top_k}, MemCategory::kBuffers);
    kernels::unpermute_backward_input(st.dyp.data(), dtopk_w->data(), dy, st.yp.data(), r.topk_w.data(), r.routing, h);
    Tensor dxp = new_output({rows, h}, MemCategory::kBuffers);
    st.dg = new_output({rows, f}, MemCategory::kBuffers);
    st.du = new_output({rows, f}, MemCategory::kBuffers);
    kernels::expert_swiglu_backward_input(dxp.data(), st.dg.data(), st.du.data(), st.dyp.data(), st.g.data(),
                                          st.u.data(), w(0), w(1), w(2), r.routing, h, f);
    auto dhn = new_shared_output({n, h}, MemCategory::kBuffers);
    kernels::permute_backward_input(dhn->data(), dxp.data(), r.routing, h);
    dx->dhidden = std::move(dout);
    dx->dnormed = std::move(dhn);
    dx->dtopk_w = std::move(dtopk_w);
    return ok_status();
  }

  void backward_weight(const StepContext& ctx, Stash& stash) override {
    auto& st = static_cast<ExpertsStash&>(stash);
    kernels::expert_swiglu_backward_weight(g(0), g(1), g(2), st.dyp.data(), st.xp.data(), st.hh.data(),
                                           st.dg.data(), st.du.data(), st.routed->routing, dims_.hidden,
                                           dims_.expert_intermediate);
    st.dyp = Tensor();
    st.dg = Tensor();
    st.du = Tensor();
  }

 private:
  const float* w(size_t i) const { return params_[i].value.data(); }
  float* g(size_t i) { return params_[i].grad.data(); }
};

}  // namespace

std::unique_ptr<Chunk> make_experts_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator) {
  return std::make_unique<ExpertsChunk>(layer, dims, seed, allocator);
}

}  // namespace piper::runtime
