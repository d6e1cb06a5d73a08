// Model: the chunks of a ModelSpec in the order the IR graph builds them (ir::build_graph), with their
// parameters drawn deterministically from a seed.
//
//   embed (layer 0), per layer l: attn, then router + experts (+ shared) on MoE layers or mlp on dense layers,
//   head (layer num_layers - 1)
// Chunks are found by their graph tags (layer, part). Parameter names are "<chunk>.<tensor>", e.g.
// "L1.experts.w_gate"; checkpoints use them. Every tensor is allocated through the allocator given to create()
// (parameters, gradients). The CPU chunks cover standard (MHA/GQA/MQA) attention with RoPE, RMSNorm, SwiGLU,
// softmax/sigmoid top-k routers with an optional aux-loss-free bias, routed and shared experts and an untied LM
// head; anything else is rejected by runtime_dims() with the feature named.
// Thread-safety: the structure is immutable after create(); chunk tasks follow chunk.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/runtime/model/chunks/chunk.h"
#include "piper/spec/model_spec.h"

namespace piper::runtime {

// Runtime choices that are not part of the architecture.
struct ModelOptions {
  double aux_loss_coef = 0.01;     // Switch load-balance loss for routers without a balancing bias
  double bias_update_rate = 1e-3;  // aux-loss-free bias step (models with moe.router_bias)
  // Expert parallelism: the experts are split into expert_ranks contiguous blocks; this model holds block
  // expert_rank (the experts chunk of an ep rank). 1 = every expert.
  int expert_ranks = 1;
  int expert_rank = 0;
  // Testing load imbalance (expert migration): every router adds router_skew * (E - 1 - e) / (E - 1) to expert
  // e's score when it selects the top-k (not to the routing weights, like the aux-loss-free bias), so that low
  // experts receive more tokens. 0 = off. Part of the model's function: runs to compare must use the same value.
  double router_skew = 0.0;
};

// The chunk dimensions of `model`; InvalidArgument naming the first feature the CPU chunks lack.
Result<ChunkDims> runtime_dims(const ModelSpec& model, const ModelOptions& options = {});

class Model {
 public:
  static Result<std::unique_ptr<Model>> create(const ModelSpec& spec, const ModelOptions& options, uint64_t seed,
                                               Allocator* allocator);
  // Only the chunks for which keep(layer, part) is true (a pipeline rank's stages): their parameters are the
  // same bits as in the whole model, since every chunk draws its own from (seed, name).
  using KeepFn = std::function<bool(int layer, Part part)>;
  static Result<std::unique_ptr<Model>> create(const ModelSpec& spec, const ModelOptions& options, uint64_t seed,
                                               Allocator* allocator, const KeepFn& keep);

  const ChunkDims& dims() const { return dims_; }
  // The chunk tagged (layer, part), or nullptr (also for no part: an instruction of no chunk).
  Chunk* find(int layer, std::optional<Part> part) const;
  const std::vector<std::unique_ptr<Chunk>>& chunks() const { return chunks_; }
  // Puts `chunk` in place of the chunk with the same (layer, part), e.g. its tensor-parallel slice
  // (chunks/tp_slice.h). InvalidArgument when the model has no such chunk. Call before building an optimizer.
  Status replace_chunk(std::unique_ptr<Chunk> chunk);
  // Every parameter (trainable or not) in chunk order.
  std::vector<Param*> params() const;
  int64_t num_params() const;  // trainable elements
  void zero_grads();

 private:
  ChunkDims dims_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
};

}  // namespace piper::runtime
