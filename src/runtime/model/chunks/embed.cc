// embed: token ids -> hidden vectors (a table lookup). No input gradient; W scatters the output gradient.
// A vocabulary slice (VocabSlice, tp_slice.h) looks up the ids it holds and writes zeros for the others: the tp
// reduction after it (all-reduce, or reduce-scatter under sequence parallelism) sums the slices' outputs.
#include "piper/kernels/cpu/ops.h"
#include "piper/runtime/model/chunks/parts.h"

namespace piper::runtime {
namespace {

struct EmbedStash : Stash {
  std::vector<int32_t> ids;
  std::shared_ptr<const Tensor> dout;  // B -> W
};

class EmbedChunk : public Chunk {
 public:
  EmbedChunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator, VocabSlice slice)
      : Chunk(Part::kEmbedding, layer, dims, allocator),
        begin_(slice.begin(dims.vocab)),
        rows_(slice.rows(dims.vocab)) {
    add_param("table", {rows_, dims.hidden}, seed, 0.02f, 0.0f, false);
  }

  Result<std::unique_ptr<Stash>> forward(const StepContext& ctx, const Microbatch& mb,
                                         const std::vector<const Activation*>& inputs, Activation* out) override {
    if (!inputs.empty()) return invalid_argument("embed: takes token ids only, got " + std::to_string(inputs.size()) +
                                                 " hidden inputs");
    const int64_t n = mb.num_tokens(), h = dims_.hidden;
    auto st = std::make_unique<EmbedStash>();
    st->ids.assign(mb.inputs, mb.inputs + n);
    for (int64_t i = 0; i < n; ++i) {
      if (st->ids[i] < 0 || st->ids[i] >= dims_.vocab) {
        return out_of_range("embed: token id " + std::to_string(st->ids[i]) + " at position " + std::to_string(i) +
                            " is outside the vocabulary [0, " + std::to_string(dims_.vocab) +
                            "); tokenize with the model's vocabulary");
      }
    }
    auto x = new_shared({n, h}, MemCategory::kActivations);
    kernels::embedding_shard_forward(x->data(), st->ids.data(), params_[0].value.data(), n, begin_, rows_, h);
    out->hidden = std::move(x);
    return std::unique_ptr<Stash>(std::move(st));
  }

  Status backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads, Stash& stash,
                        Gradient* dx) override {
    auto& st = static_cast<EmbedStash&>(stash);
    const int64_t n = static_cast<int64_t>(st.ids.size());
    PIPER_ASSIGN_OR_RETURN(st.dout, sum_dhidden(*this, grads, n, dims_.hidden));
    *dx = Gradient{};
    return ok_status();
  }

  void backward_weight(const StepContext& ctx, Stash& stash) override {
    auto& st = static_cast<EmbedStash&>(stash);
    const int64_t n = static_cast<int64_t>(st.ids.size());
    kernels::embedding_shard_backward_weight(params_[0].grad.data(), st.dout->data(), st.ids.data(), n, begin_, rows_,
                                             dims_.hidden);
    st.dout.reset();
  }

 private:
  int64_t begin_, rows_;  // the vocabulary rows [begin_, begin_ + rows_) of the table
};

}  // namespace

std::unique_ptr<Chunk> make_embed_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator,
                                        VocabSlice slice) {
  return std::make_unique<EmbedChunk>(layer, dims, seed, allocator, slice);
}

}  // namespace piper::runtime
