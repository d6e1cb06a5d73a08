#include "piper/runtime/model/chunks/chunk.h"

#include <algorithm>
#include <cmath>

#include "piper/base/hash.h"
#include "piper/kernels/cpu/vec_math.h"
#include "piper/runtime/model/chunks/parts.h"
#include "piper/tensor/rng.h"

namespace piper::runtime {

std::string Chunk::name() const {
  if (part_ == Part::kEmbedding || part_ == Part::kHead) return chunk_name(part_);
  return "L" + std::to_string(layer_) + "." + chunk_name(part_);
}

void Chunk::zero_grads() {
  for (Param& p : params_) {
    if (p.trainable) p.grad.fill(0.0f);
  }
}

Tensor* Chunk::add_param(const std::string& short_name, const Shape& shape, uint64_t seed, float stddev, float fill,
                         bool decay, bool trainable, uint64_t offset) {
  Param p;
  p.name = name() + "." + short_name;
  p.value = Tensor::zeros_or_die(shape, MemCategory::kParameters, allocator_);
  if (stddev > 0) {
    // The stream is a hash of the name: the draw does not depend on the order parameters are created in.
    Rng rng(seed, fnv1a64(p.name.data(), p.name.size()));
    fill_normal(p.value.data(), p.value.numel(), rng, offset, 0.0f, stddev);
  } else {
    p.value.fill(fill);
  }
  if (trainable) p.grad = Tensor::zeros_or_die(shape, MemCategory::kGradients, allocator_);
  p.trainable = trainable;
  p.decay = decay;
  params_.push_back(std::move(p));
  return &params_.back().value;
}

Tensor Chunk::new_tensor(const Shape& shape, MemCategory category) const {
  return Tensor::zeros_or_die(shape, category, allocator_);
}

std::shared_ptr<Tensor> Chunk::new_shared(const Shape& shape, MemCategory category) const {
  return std::make_shared<Tensor>(Tensor::zeros_or_die(shape, category, allocator_));
}

Tensor Chunk::new_output(const Shape& shape, MemCategory category) const {
  return Tensor::uninitialized_or_die(shape, category, allocator_);
}

std::shared_ptr<Tensor> Chunk::new_shared_output(const Shape& shape, MemCategory category) const {
  return std::make_shared<Tensor>(Tensor::uninitialized_or_die(shape, category, allocator_));
}

namespace {

Status check_rows(const Chunk& chunk, const Tensor* t, int64_t n, int64_t h, const char* what) {
  if (t == nullptr || t->numel() != n * h) {
    return invalid_argument(chunk.name() + ": " + what + " must be [" + std::to_string(n) + ", " +
                            std::to_string(h) + "], got " + (t ? shape_to_string(t->shape()) : "none"));
  }
  return ok_status();
}

template <typename Msg, typename Get>
Result<std::shared_ptr<const Tensor>> sum_field(const Chunk& chunk, const std::vector<const Msg*>& msgs, int64_t n,
                                                int64_t h, MemCategory category, const char* what, Get get) {
  if (msgs.empty()) return invalid_argument(chunk.name() + ": no incoming " + what + "; the graph must feed it");
  for (const Msg* m : msgs) PIPER_RETURN_IF_ERROR(check_rows(chunk, get(*m).get(), n, h, what));
  if (msgs.size() == 1) return get(*msgs[0]);
  auto sum = std::make_shared<Tensor>(get(*msgs[0])->clone(category));
  for (size_t i = 1; i < msgs.size(); ++i) {
    const float* src = get(*msgs[i])->data();
    float* dst = sum->data();
    for (int64_t j = 0; j < n * h; ++j) dst[j] += src[j];
  }
  return std::shared_ptr<const Tensor>(std::move(sum));
}

}  // namespace

Result<std::shared_ptr<const Tensor>> sum_hidden(const Chunk& chunk, const std::vector<const Activation*>& inputs,
                                                 int64_t n, int64_t h) {
  return sum_field(chunk, inputs, n, h, MemCategory::kActivations, "hidden input",
                   [](const Activation& a) { return a.hidden; });
}

Result<std::shared_ptr<const Tensor>> sum_dhidden(const Chunk& chunk, const std::vector<const Gradient*>& grads,
                                                  int64_t n, int64_t h) {
  return sum_field(chunk, grads, n, h, MemCategory::kBuffers, "gradient", [](const Gradient& g) { return g.dhidden; });
}

float residual_init_std(const ChunkDims& dims) {
  return init_std() / std::sqrt(2.0f * static_cast<float>(std::max(1, dims.num_layers)));
}

void add_into(float* out, const float* a, const float* b, int64_t n) {
  constexpr int64_t kBlock = 65536;
  const int64_t num_blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (num_blocks > 1)
  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    const int64_t i = blk * kBlock;
    kernels::vec::add_arrays(out + i, a + i, b + i, std::min(kBlock, n - i));
  }
}

Result<std::unique_ptr<Chunk>> make_chunk(Part part, int layer, const ChunkDims& dims, uint64_t seed,
                                          Allocator* allocator) {
  switch (part) {
    case Part::kEmbedding:
      return make_embed_chunk(layer, dims, seed, allocator);
    case Part::kAttention:
      return make_attn_chunk(layer, dims, seed, allocator);
    case Part::kRouter:
      return make_router_chunk(layer, dims, seed, allocator);
    case Part::kExperts:
      return make_experts_chunk(layer, dims, seed, allocator);
    case Part::kSharedExperts:
      return make_shared_chunk(layer, dims, seed, allocator);
    case Part::kDenseMlp:
      return make_mlp_chunk(layer, dims, seed, allocator);
    case Part::kHead:
      return make_head_chunk(layer, dims, seed, allocator);
    case Part::kNorms:
    case Part::kAttentionCore:
      break;
  }
  return invalid_argument(std::string("no runtime chunk for part '") + to_string(part) +
                          "': it is priced inside the attention chunk (chunks: embed, attn, router, experts, shared, "
                          "mlp, head)");
}

std::shared_ptr<const Routed> routing_only(const std::shared_ptr<const Routed>& r) {
  if (r == nullptr || !r->normed_recomputed) return r;
  auto out = std::make_shared<Routed>();
  out->topk_idx = r->topk_idx;
  out->topk_w = r->topk_w.clone();
  out->routing = r->routing;
  out->normed_recomputed = true;
  return out;
}

Result<std::unique_ptr<Stash>> RowPiecesChunk::forward(const StepContext& ctx, const Microbatch& mb,
                                                       const std::vector<const Activation*>& inputs,
                                                       Activation* out) {
  const int64_t n = mb.num_tokens(), h = dims_.hidden;
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Tensor> x, sum_hidden(*this, inputs, n, h));
  std::unique_ptr<Stash> st = forward_begin(mb, std::move(x));
  forward_in(*st, {0, n});
  forward_rest(*st);
  auto y = new_shared_output({n, h}, MemCategory::kActivations);
  forward_out(*st, {0, n}, y.get());
  out->hidden = std::move(y);
  return st;
}

Status RowPiecesChunk::backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads,
                                      Stash& stash, Gradient* dx) {
  const int64_t n = stash_rows(stash), h = dims_.hidden;
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Tensor> dout, sum_dhidden(*this, grads, n, h));
  backward_begin(stash, std::move(dout));
  backward_in(stash, {0, n});
  backward_rest(stash);
  auto dxt = new_shared_output({n, h}, MemCategory::kBuffers);
  backward_out(stash, {0, n}, dxt.get());
  dx->dhidden = std::move(dxt);
  return ok_status();
}

}  // namespace piper::runtime
