// head: final RMSNorm, LM head and mean token cross-entropy. B starts the backward with dloss = 1 / M.
#include "piper/kernels/cpu/ops.h"
#include "piper/runtime/model/chunks/parts.h"

namespace piper::runtime {
namespace {

struct HeadStash : Stash {
  int64_t n = 0;
  std::vector<int32_t> targets;
  std::shared_ptr<const Tensor> x;
  Tensor rstd, xn, probs;  // probs [n, vocab] (fp32 softmax, the logits' memory)
  // B -> W
  Tensor dlogits, dxn;
};

class HeadChunk : public Chunk {
 public:
  HeadChunk(int layer, const ChunkDims& d, uint64_t seed, Allocator* allocator)
      : Chunk(Part::kHead, layer, d, allocator) {
    add_param("norm", {d.hidden}, seed, 0.0f, 1.0f, false);
    add_param("w_out", {d.vocab, d.hidden}, seed, init_std(), 0.0f, true);
  }

  Result<std::unique_ptr<Stash>> forward(const StepContext& ctx, const Microbatch& mb,
                                         const std::vector<const Activation*>& inputs, Activation* out) override {
    const int64_t n = mb.num_tokens(), h = dims_.hidden, V = dims_.vocab;
    auto st = std::make_unique<HeadStash>();
    st->n = n;
    st->targets.assign(mb.targets, mb.targets + n);
    for (int64_t i = 0; i < n; ++i) {
      if (st->targets[i] < 0 || st->targets[i] >= V) {
        return out_of_range("head: target token id " + std::to_string(st->targets[i]) + " at position " +
                            std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
      }
    }
    PIPER_ASSIGN_OR_RETURN(st->x, sum_hidden(*this, inputs, n, h));
    st->rstd = new_output({n}, MemCategory::kActivations);
    st->xn = new_output({n, h}, MemCategory::kActivations);
    kernels::rmsnorm_forward(st->xn.data(), st->rstd.data(), st->x->data(), params_[0].value.data(), n, h,
                             dims_.norm_eps);
    st->probs = new_output({n, V}, MemCategory::kActivations);
    float loss = 0;
    kernels::lm_head_loss_forward(&loss, st->probs.data(), st->xn.data(), params_[1].value.data(),
                                  st->targets.data(), n, h, V);
    st->loss = loss;
    *out = Activation{};
    return std::unique_ptr<Stash>(std::move(st));
  }

  Status backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads, Stash& stash,
                        Gradient* dx) override {
    if (!grads.empty()) return invalid_argument("head: the loss head takes no incoming gradient");
    auto& st = static_cast<HeadStash&>(stash);
    const int64_t n = st.n, h = dims_.hidden, V = dims_.vocab;
    st.dxn = new_output({n, h}, MemCategory::kBuffers);
    st.dlogits = new_output({n, V}, MemCategory::kBuffers);
    const float dloss = 1.0f / static_cast<float>(ctx.num_microbatches * ctx.token_shards);
    kernels::lm_head_loss_backward_input(st.dxn.data(), st.dlogits.data(), st.probs.data(), st.targets.data(),
                                         params_[1].value.data(), dloss, n, h, V);
    auto dxt = new_shared_output({n, h}, MemCategory::kBuffers);
    kernels::rmsnorm_backward_input(dxt->data(), st.dxn.data(), st.x->data(), params_[0].value.data(),
                                    st.rstd.data(), n, h);
    dx->dhidden = std::move(dxt);
    return ok_status();
  }

  void backward_weight(const StepContext& ctx, Stash& stash) override {
    auto& st = static_cast<HeadStash&>(stash);
    const int64_t n = st.n, h = dims_.hidden, V = dims_.vocab;
    kernels::rmsnorm_backward_weight(params_[0].grad.data(), st.dxn.data(), st.x->data(), st.rstd.data(), n, h);
    kernels::lm_head_loss_backward_weight(params_[1].grad.data(), st.dlogits.data(), st.xn.data(), n, h, V);
    st.dlogits = Tensor();
    st.dxn = Tensor();
  }
};

}  // namespace

std::unique_ptr<Chunk> make_head_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator) {
  return std::make_unique<HeadChunk>(layer, dims, seed, allocator);
}

}  // namespace piper::runtime
