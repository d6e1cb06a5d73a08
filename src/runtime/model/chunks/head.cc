// head: final RMSNorm, LM head and mean token cross-entropy. B starts the backward with dloss = 1 / M.
// A vocabulary slice (VocabSlice, tp_slice.h) holds rows [begin, begin + rows) of w_out and computes the logits of
// those rows for every token of the microbatch (its input is whole: all-gathered under sequence parallelism). The
// cross-entropy needs the whole vocabulary's max, sum of exponentials and the target's logit: the slices exchange
// 3 floats per token over tp (StepContext::gather_over_vocab) and each then holds the whole softmax of its rows and
// the same loss. B's input gradient is this slice's part; the plan's tp reduction after B sums the parts.
#include "piper/kernels/cpu/ops.h"
#include "piper/runtime/model/chunks/parts.h"

namespace piper::runtime {
namespace {

struct HeadStash : Stash {
  int64_t n = 0;
  std::vector<int32_t> targets;
  std::shared_ptr<const Tensor> x;
  Tensor rstd, xn, probs;  // probs [n, rows] (fp32 softmax over the whole vocabulary, the logits' memory)
  // B -> W
  Tensor dlogits, dxn;
};

class HeadChunk : public Chunk {
 public:
  HeadChunk(int layer, const ChunkDims& d, uint64_t seed, Allocator* allocator, VocabSlice slice)
      : Chunk(Part::kHead, layer, d, allocator),
        slice_(slice),
        begin_(slice.begin(d.vocab)),
        rows_(slice.rows(d.vocab)) {
    add_param("norm", {d.hidden}, seed, 0.0f, 1.0f, false);
    add_param("w_out", {rows_, d.hidden}, seed, init_std(), 0.0f, true);
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
    st->probs = new_output({n, rows_}, MemCategory::kActivations);
    PIPER_ASSIGN_OR_RETURN(st->loss, cross_entropy(ctx, *st));
    *out = Activation{};
    return std::unique_ptr<Stash>(std::move(st));
  }

  Status backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads, Stash& stash,
                        Gradient* dx) override {
    if (!grads.empty()) return invalid_argument("head: the loss head takes no incoming gradient");
    auto& st = static_cast<HeadStash&>(stash);
    const int64_t n = st.n, h = dims_.hidden;
    st.dxn = new_output({n, h}, MemCategory::kBuffers);
    st.dlogits = new_output({n, rows_}, MemCategory::kBuffers);
    const float dloss = 1.0f / static_cast<float>(ctx.num_microbatches * ctx.token_shards);
    kernels::lm_head_shard_backward_input(st.dxn.data(), st.dlogits.data(), st.probs.data(), st.targets.data(),
                                          params_[1].value.data(), dloss, n, h, begin_, rows_);
    auto dxt = new_shared_output({n, h}, MemCategory::kBuffers);
    kernels::rmsnorm_backward_input(dxt->data(), st.dxn.data(), st.x->data(), params_[0].value.data(),
                                    st.rstd.data(), n, h);
    dx->dhidden = std::move(dxt);
    return ok_status();
  }

  void backward_weight(const StepContext& ctx, Stash& stash) override {
    auto& st = static_cast<HeadStash&>(stash);
    const int64_t n = st.n, h = dims_.hidden;
    kernels::rmsnorm_backward_weight(params_[0].grad.data(), st.dxn.data(), st.x->data(), st.rstd.data(), n, h);
    kernels::lm_head_loss_backward_weight(params_[1].grad.data(), st.dlogits.data(), st.xn.data(), n, h, rows_);
    st.dlogits = Tensor();
    st.dxn = Tensor();
  }

 private:
  // The logits of this slice's rows, their softmax over the whole vocabulary (into st.probs) and the mean token
  // loss; a slice gathers the other slices' statistics (kernels::lm_head_shard_*).
  Result<float> cross_entropy(const StepContext& ctx, HeadStash& st) const {
    const int64_t n = st.n, h = dims_.hidden;
    std::vector<float> stats(static_cast<size_t>(n * kernels::kVocabStats));
    kernels::lm_head_shard_forward(st.probs.data(), stats.data(), st.xn.data(), params_[1].value.data(),
                                   st.targets.data(), n, h, begin_, rows_);
    std::vector<float> all;
    if (slice_.shards > 1) {
      if (!ctx.gather_over_vocab) {
        return internal_error(name() + ": a vocabulary slice (" + std::to_string(slice_.shards) +
                              " shards) runs without gather_over_vocab");
      }
      all.resize(stats.size() * static_cast<size_t>(slice_.shards));
      PIPER_RETURN_IF_ERROR(ctx.gather_over_vocab(stats.data(), all.data(), static_cast<int64_t>(stats.size())));
    }
    float loss = 0;
    kernels::lm_head_shard_loss(&loss, st.probs.data(), slice_.shards > 1 ? all.data() : stats.data(), slice_.shards,
                                slice_.shard, n, rows_);
    return loss;
  }

  VocabSlice slice_;
  int64_t begin_, rows_;  // the vocabulary rows [begin_, begin_ + rows_) of w_out
};

}  // namespace

std::unique_ptr<Chunk> make_head_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator,
                                       VocabSlice slice) {
  return std::make_unique<HeadChunk>(layer, dims, seed, allocator, slice);
}

}  // namespace piper::runtime
