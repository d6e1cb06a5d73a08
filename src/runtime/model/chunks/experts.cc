// experts: permute the normed tokens by expert, grouped SwiGLU experts, weighted unpermute, residual add.
// Under expert parallelism (an input carrying EpRows) the chunk holds only its local experts and computes only
// the rows the dispatch delivered: the permutation, the weighted combine and the residual add happen at the
// tokens' source ranks (exec/executor_ep.cc); here the rows are grouped by local expert and back again.
#include <mutex>

#include "piper/kernels/cpu/ops.h"
#include "piper/kernels/cpu/vec_math.h"
#include "piper/runtime/model/chunks/parts.h"

namespace piper::runtime {
namespace {

struct ExpertsStash : Stash {
  int64_t n = 0;
  std::shared_ptr<const Routed> routed;
  // Expert parallelism: the dispatched rows' routing weights (the backward's; the rows themselves are not kept,
  // xp holds them permuted) and the rows grouped by local expert.
  bool ep = false;
  std::vector<float> ep_weight;
  kernels::Routing local;
  bool act_dropped = false;  // recompute_act: hh freed after F, recomputed in backward_weight
  Tensor xp, g, u, hh, yp;  // [rows, h] / [rows, f]: dispatched tokens, intermediates, expert outputs
  // B -> W
  Tensor dyp, dg, du;
  const kernels::Routing& routing() const { return ep ? local : routed->routing; }
};

class ExpertsChunk : public Chunk {
 public:
  ExpertsChunk(int layer, const ChunkDims& d, uint64_t seed, Allocator* allocator)
      : Chunk(Part::kExperts, layer, d, allocator), counts_(static_cast<size_t>(d.num_experts), 0) {
    const int64_t E = d.local_experts(), f = d.expert_intermediate;
    // The local experts' slices of the whole model's [num_experts, ...] tensors: same bits as on one rank.
    const uint64_t offset = static_cast<uint64_t>(d.expert_begin) * static_cast<uint64_t>(f * d.hidden);
    add_param("w_gate", {E, f, d.hidden}, seed, init_std(), 0.0f, true, true, offset);
    add_param("w_up", {E, f, d.hidden}, seed, init_std(), 0.0f, true, true, offset);
    add_param("w_down", {E, d.hidden, f}, seed, residual_init_std(d), 0.0f, true, true, offset);
    if (E != d.num_experts) {
      // Expert parallelism: the block of experts [expert_begin, expert_begin + E) of the whole [num_experts, ...]
      // tensors (checkpoints store and restore it by this box; a migrating runtime saves per logical expert).
      for (Param& p : params_) {
        p.global_shape = p.value.shape();
        p.global_shape[0] = d.num_experts;
        p.global_offset = Shape(p.global_shape.size(), 0);
        p.global_offset[0] = d.expert_begin;
      }
    }
  }

  Result<std::unique_ptr<Stash>> forward(const StepContext& ctx, const Microbatch& mb,
                                         const std::vector<const Activation*>& inputs, Activation* out) override {
    const int64_t n = mb.num_tokens(), h = dims_.hidden;
    // Disaggregated (af-pipe): the rows come from the attention ranks without their residual and routing.
    if (inputs.size() == 1 && inputs[0]->ep && !inputs[0]->hidden) return forward_ep(ctx, *inputs[0], out);
    if (inputs.size() != 1 || !inputs[0]->routed || !inputs[0]->hidden || inputs[0]->hidden->numel() != n * h) {
      return invalid_argument(name() + ": expects one input from its router (residual + routing), got " +
                              std::to_string(inputs.size()) + "; the graph must link router -> experts");
    }
    if (inputs[0]->ep) return forward_ep(ctx, *inputs[0], out);
    if (dims_.local_experts() != dims_.num_experts) {
      return invalid_argument(name() + " holds experts [" + std::to_string(dims_.expert_begin) + ", " +
                              std::to_string(dims_.expert_begin + dims_.local_experts()) + ") of " +
                              std::to_string(dims_.num_experts) + " but its input was not dispatched; an expert-"
                              "parallel model needs the plan's all-to-all (strategy ep=...)");
    }
    auto st = std::make_unique<ExpertsStash>();
    st->n = n;
    st->routed = routing_only(inputs[0]->routed);
    const Routed& r = *st->routed;
    run_experts(*st, inputs[0]->routed->normed->data(), n * dims_.top_k);
    drop_act(ctx, *st);
    if (!ctx.recompute) count(r.routing, 0);
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
    if (st.ep) return backward_input_ep(grads, st, dx);
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
    if (st.act_dropped) {
      // Dropped after F (recompute_act): silu(g) * u again, row by row as the forward's kernel computes it.
      const int64_t rows = st.g.numel() / dims_.expert_intermediate;
      st.hh = new_tensor({rows, dims_.expert_intermediate}, MemCategory::kBuffers);  // recompute scratch
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t at = i * dims_.expert_intermediate;
        kernels::vec::swiglu_gate_forward(st.hh.data() + at, st.g.data() + at, st.u.data() + at,
                                          dims_.expert_intermediate);
      }
    }
    kernels::expert_swiglu_backward_weight(g(0), g(1), g(2), st.dyp.data(), st.xp.data(), st.hh.data(),
                                           st.dg.data(), st.du.data(), st.routing(), dims_.hidden,
                                           dims_.expert_intermediate);
    st.dyp = Tensor();
    st.dg = Tensor();
    st.du = Tensor();
    if (st.act_dropped) st.hh = Tensor();
  }

  std::vector<int64_t> take_expert_tokens() override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int64_t> out = counts_;
    std::fill(counts_.begin(), counts_.end(), 0);
    return out;
  }

 private:
  // Grouped SwiGLU over `rows` rows of `x` permuted by st.routing(): fills xp, g, u, hh, yp.
  void run_experts(ExpertsStash& st, const float* x, int64_t rows) {
    const int64_t h = dims_.hidden, f = dims_.expert_intermediate;
    st.xp = new_output({rows, h}, MemCategory::kActivations);
    kernels::permute_forward(st.xp.data(), x, st.routing(), h);
    st.g = new_output({rows, f}, MemCategory::kActivations);
    st.u = new_output({rows, f}, MemCategory::kActivations);
    st.hh = new_output({rows, f}, MemCategory::kActivations);
    st.yp = new_output({rows, h}, MemCategory::kActivations);
    kernels::expert_swiglu_forward(st.yp.data(), st.g.data(), st.u.data(), st.hh.data(), st.xp.data(), w(0), w(1),
                                   w(2), st.routing(), h, f);
  }

  // Module recomputation ("moe_act"): the activation output is freed after F; backward_weight recomputes it.
  static void drop_act(const StepContext& ctx, ExpertsStash& st) {
    if (!ctx.recompute_act) return;
    st.hh = Tensor();
    st.act_dropped = true;
  }

  // Expert parallelism: the dispatched rows through the local experts, outputs back in dispatch order. The
  // residual and the routing pass through to the combine, which weights and adds at the source.
  Result<std::unique_ptr<Stash>> forward_ep(const StepContext& ctx, const Activation& in, Activation* out) {
    const int64_t h = dims_.hidden;
    const EpRows& ep = *in.ep;
    const int64_t rows = static_cast<int64_t>(ep.expert.size());
    if (!ep.rows || ep.rows->numel() != rows * h || ep.weight.size() != ep.expert.size()) {
      return internal_error(name() + ": dispatched rows, experts and weights disagree in count");
    }
    for (int32_t e : ep.expert) {
      if (e < 0 || e >= dims_.local_experts()) {
        return internal_error(name() + ": a dispatched row names local expert " + std::to_string(e) + " of " +
                              std::to_string(dims_.local_experts()));
      }
    }
    auto st = std::make_unique<ExpertsStash>();
    st->n = in.hidden ? in.hidden->numel() / h : 0;
    st->routed = routing_only(in.routed);
    st->ep = true;
    st->ep_weight = ep.weight;
    st->local = kernels::build_routing(ep.expert.data(), rows, 1, dims_.local_experts());
    run_experts(*st, ep.rows->data(), rows);
    drop_act(ctx, *st);
    if (!ctx.recompute) count(st->local, dims_.expert_begin);
    auto back = new_shared({rows, h}, MemCategory::kActivations);
    kernels::permute_backward_input(back->data(), st->yp.data(), st->local, h);  // one slot a row: a gather
    auto rows_out = std::make_shared<EpRows>();
    rows_out->rows = std::move(back);
    out->hidden = in.hidden;
    out->routed = in.routed;
    out->ep = std::move(rows_out);
    return std::unique_ptr<Stash>(std::move(st));
  }

  Status backward_input_ep(const std::vector<const Gradient*>& grads, ExpertsStash& st, Gradient* dx) {
    const int64_t h = dims_.hidden, f = dims_.expert_intermediate;
    const int64_t rows = static_cast<int64_t>(st.ep_weight.size());
    if (grads.size() != 1 || !grads[0]->ep || !grads[0]->ep->rows || grads[0]->ep->rows->numel() != rows * h) {
      return invalid_argument(name() + ": expects one gradient message from its combine with " +
                              std::to_string(rows) + " dispatched rows; got " + std::to_string(grads.size()) +
                              " message(s)");
    }
    st.dyp = new_tensor({rows, h}, MemCategory::kBuffers);
    auto out = std::make_shared<EpRows>();
    out->dweight.assign(static_cast<size_t>(rows), 0.0f);
    kernels::unpermute_backward_input(st.dyp.data(), out->dweight.data(), grads[0]->ep->rows->data(), st.yp.data(),
                                      st.ep_weight.data(), st.local, h);
    Tensor dxp = new_tensor({rows, h}, MemCategory::kBuffers);
    st.dg = new_tensor({rows, f}, MemCategory::kBuffers);
    st.du = new_tensor({rows, f}, MemCategory::kBuffers);
    kernels::expert_swiglu_backward_input(dxp.data(), st.dg.data(), st.du.data(), st.dyp.data(), st.g.data(),
                                          st.u.data(), w(0), w(1), w(2), st.local, h, f);
    auto back = new_shared({rows, h}, MemCategory::kBuffers);
    kernels::permute_backward_input(back->data(), dxp.data(), st.local, h);
    out->rows = std::move(back);
    dx->dhidden = grads[0]->dhidden;  // the residual's gradient, back to the source's router
    dx->ep = std::move(out);
    return ok_status();
  }

  void count(const kernels::Routing& r, int first) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int e = 0; e < r.num_experts; ++e) counts_[static_cast<size_t>(first + e)] += r.count(e);
  }

  const float* w(size_t i) const { return params_[i].value.data(); }
  float* g(size_t i) { return params_[i].grad.data(); }

  std::mutex mutex_;
  std::vector<int64_t> counts_;  // rows per expert (all num_experts) since take_expert_tokens()
};

}  // namespace

std::unique_ptr<Chunk> make_experts_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator) {
  return std::make_unique<ExpertsChunk>(layer, dims, seed, allocator);
}

}  // namespace piper::runtime
