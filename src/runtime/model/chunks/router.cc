// router: pre-norm top-k gating. Passes the residual through to `experts` with the normed input and the routing.
// Balancing: a Switch-style auxiliary loss (aux_loss_coef > 0, weighted 1 / M per microbatch), and/or DeepSeek's
// aux-loss-free bias (expert_bias): the step's expert counts move a selection-only bias after the update.
#include <mutex>

#include "piper/kernels/cpu/ops.h"
#include "piper/runtime/model/chunks/parts.h"

namespace piper::runtime {
namespace {

struct RouterStash : Stash {
  int64_t n = 0;
  std::shared_ptr<const Tensor> x, hn;
  Tensor rstd, scores;
  std::shared_ptr<const Routed> routed;
  bool norm_dropped = false;  // recompute_norm: hn recomputed in B, freed after W
  std::vector<double> aux_counts;  // sequence parallelism: expert counts of the whole microbatch (all slices)
  // B -> W
  Tensor dlogits, dhn;
};

class RouterChunk : public Chunk {
 public:
  RouterChunk(int layer, const ChunkDims& d, uint64_t seed, Allocator* allocator)
      : Chunk(Part::kRouter, layer, d, allocator), counts_(static_cast<size_t>(d.num_experts), 0) {
    add_param("norm", {d.hidden}, seed, 0.0f, 1.0f, false);
    add_param("w_router", {d.num_experts, d.hidden}, seed, init_std(), 0.0f, false);
    if (d.expert_bias) add_param("bias", {d.num_experts}, seed, 0.0f, 0.0f, false, /*trainable=*/false);
  }

  Result<std::unique_ptr<Stash>> forward(const StepContext& ctx, const Microbatch& mb,
                                         const std::vector<const Activation*>& inputs, Activation* out) override {
    const int64_t n = mb.num_tokens(), h = dims_.hidden, E = dims_.num_experts, k = dims_.top_k;
    auto st = std::make_unique<RouterStash>();
    st->n = n;
    PIPER_ASSIGN_OR_RETURN(st->x, sum_hidden(*this, inputs, n, h));
    st->rstd = new_tensor({n}, MemCategory::kActivations);
    auto hn = new_shared({n, h}, MemCategory::kActivations);
    kernels::rmsnorm_forward(hn->data(), st->rstd.data(), st->x->data(), params_[0].value.data(), n, h,
                             dims_.norm_eps);
    st->hn = hn;
    st->scores = new_tensor({n, E}, MemCategory::kActivations);
    auto routed = std::make_shared<Routed>();
    routed->normed = hn;
    routed->topk_idx.assign(static_cast<size_t>(n * k), 0);
    routed->topk_w = new_tensor({n, k}, MemCategory::kActivations);
    float aux = 0;
    const float* bias = dims_.expert_bias ? params_[2].value.data() : nullptr;
    std::vector<float> skewed;
    if (dims_.router_skew > 0.0) {
      // Testing: a fixed preference for low experts on top of any balancing bias (selection only).
      skewed.assign(static_cast<size_t>(E), 0.0f);
      for (int64_t e = 0; e < E; ++e) {
        const double pref = E > 1 ? static_cast<double>(E - 1 - e) / static_cast<double>(E - 1) : 0.0;
        skewed[static_cast<size_t>(e)] = static_cast<float>(dims_.router_skew * pref) + (bias ? bias[e] : 0.0f);
      }
      bias = skewed.data();
    }
    kernels::RouterConfig cfg = config(ctx);
    // Sequence parallelism: the load-balance loss is the whole microbatch's, from counts summed over the slices.
    const bool sliced = ctx.token_shards > 1 && cfg.aux_loss_coef > 0;
    if (sliced) cfg.aux_loss_coef = 0;
    kernels::router_forward(st->scores.data(), routed->topk_idx.data(), routed->topk_w.data(), &aux, hn->data(),
                            params_[1].value.data(), bias, n, h, cfg);
    if (sliced) {
      PIPER_ASSIGN_OR_RETURN(aux, sliced_aux_loss(ctx, routed->topk_idx, *st));
    }
    routed->routing = kernels::build_routing(routed->topk_idx.data(), n, dims_.top_k, dims_.num_experts);
    st->aux_loss = aux;
    if (dims_.expert_bias && !ctx.recompute) {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int e = 0; e < dims_.num_experts; ++e) counts_[static_cast<size_t>(e)] += routed->routing.count(e);
    }
    if (ctx.recompute_norm) {
      // Module recomputation ("layernorm"): the norm output leaves with the message; the backward recomputes it.
      routed->normed_recomputed = true;
      st->hn = nullptr;
      st->routed = routing_only(routed);
    } else {
      st->routed = routed;
    }
    out->hidden = st->x;
    out->routed = std::move(routed);
    return std::unique_ptr<Stash>(std::move(st));
  }

  Status backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads, Stash& stash,
                        Gradient* dx) override {
    auto& st = static_cast<RouterStash&>(stash);
    const int64_t n = st.n, h = dims_.hidden, E = dims_.num_experts;
    if (grads.size() != 1 || !grads[0]->dnormed || !grads[0]->dtopk_w || !grads[0]->dhidden) {
      return invalid_argument(name() + ": expects one gradient message from its experts chunk with the residual, "
                              "normed-input and routing-weight gradients; got " + std::to_string(grads.size()) +
                              " message(s)");
    }
    const Gradient& gin = *grads[0];
    st.dlogits = new_tensor({n, E}, MemCategory::kBuffers);
    st.dhn = new_tensor({n, h}, MemCategory::kBuffers);
    kernels::RouterConfig cfg = config(ctx);
    if (!st.aux_counts.empty()) {
      cfg.aux_counts = st.aux_counts.data();
      cfg.aux_tokens = n * ctx.token_shards;
    }
    kernels::router_backward_input(st.dhn.data(), st.dlogits.data(), gin.dtopk_w->data(), st.scores.data(),
                                   st.routed->topk_idx.data(), st.routed->topk_w.data(), params_[1].value.data(), n,
                                   h, cfg);
    add_into(st.dhn.data(), st.dhn.data(), gin.dnormed->data(), n * h);
    auto dxt = new_shared({n, h}, MemCategory::kBuffers);
    kernels::rmsnorm_backward_input(dxt->data(), st.dhn.data(), st.x->data(), params_[0].value.data(),
                                    st.rstd.data(), n, h);
    add_into(dxt->data(), dxt->data(), gin.dhidden->data(), n * h);
    dx->dhidden = std::move(dxt);
    if (st.hn == nullptr) {
      // Dropped after F (recompute_norm): the same kernel on the same input, the same bits. Here, not in W: under
      // ZeRO-3 the norm weight is gathered for F and B only. Kept for W as recompute scratch.
      auto again = new_shared({n, h}, MemCategory::kBuffers);
      Tensor rstd = new_tensor({n}, MemCategory::kBuffers);
      kernels::rmsnorm_forward(again->data(), rstd.data(), st.x->data(), params_[0].value.data(), n, h,
                               dims_.norm_eps);
      st.hn = std::move(again);
      st.norm_dropped = true;
    }
    return ok_status();
  }

  void backward_weight(const StepContext& ctx, Stash& stash) override {
    auto& st = static_cast<RouterStash&>(stash);
    const int64_t n = st.n, h = dims_.hidden;
    kernels::rmsnorm_backward_weight(params_[0].grad.data(), st.dhn.data(), st.x->data(), st.rstd.data(), n, h);
    kernels::router_backward_weight(params_[1].grad.data(), st.dlogits.data(), st.hn->data(), n, h, config(ctx));
    if (st.norm_dropped) st.hn = nullptr;
    st.dlogits = Tensor();
    st.dhn = Tensor();
  }

  std::vector<int64_t>* bias_counts() override { return dims_.expert_bias ? &counts_ : nullptr; }

  void after_update() override {
    if (!dims_.expert_bias) return;
    std::lock_guard<std::mutex> lock(mutex_);
    kernels::router_update_bias(params_[2].value.data(), counts_.data(), dims_.num_experts, dims_.bias_update_rate);
    std::fill(counts_.begin(), counts_.end(), 0);
  }

 private:
  kernels::RouterConfig config(const StepContext& ctx) const {
    kernels::RouterConfig c;
    c.num_experts = dims_.num_experts;
    c.top_k = dims_.top_k;
    c.score = dims_.router_score;
    c.norm_topk = dims_.norm_topk;
    c.aux_loss_coef = dims_.aux_loss_coef / ctx.num_microbatches;
    return c;
  }

  // This slice's part of the whole microbatch's load-balance loss: coef * E * sum_e f_e * p_e with the expert
  // fractions f_e of all slices and this slice's probability sums, both over the whole token count N (the
  // slices' parts add up to the loss of the unsplit microbatch, as in Megatron-LM). Keeps the counts for B.
  Result<float> sliced_aux_loss(const StepContext& ctx, const std::vector<int32_t>& topk_idx, RouterStash& st) {
    const int E = dims_.num_experts, K = dims_.top_k;
    if (!ctx.sum_over_shards) return internal_error(name() + ": token_shards > 1 without sum_over_shards");
    st.aux_counts.assign(static_cast<size_t>(E), 0.0);
    for (int32_t e : topk_idx) st.aux_counts[static_cast<size_t>(e)] += 1.0;
    PIPER_RETURN_IF_ERROR(ctx.sum_over_shards(st.aux_counts.data(), E));
    const double tokens = static_cast<double>(st.n * ctx.token_shards);
    double aux = 0;
    for (int e = 0; e < E; ++e) {
      double p = 0;
      for (int64_t t = 0; t < st.n; ++t) p += st.scores.data()[t * E + e];
      aux += st.aux_counts[static_cast<size_t>(e)] / (tokens * K) * (p / tokens);
    }
    return static_cast<float>(aux * config(ctx).aux_loss_coef * E);
  }

  std::mutex mutex_;
  std::vector<int64_t> counts_;  // tokens per expert since the last update (expert_bias)
};

}  // namespace

std::unique_ptr<Chunk> make_router_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator) {
  return std::make_unique<RouterChunk>(layer, dims, seed, allocator);
}

}  // namespace piper::runtime
