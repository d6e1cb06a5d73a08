// Test helpers: a small MoE model spec and the sequential reference composition of the chunks.
//
// reference_step() runs, for each microbatch in order, F of every chunk in model order, then B+W of every
// chunk in reverse order, wiring the messages by hand (embed -> attn -> router -> experts (+ shared) / mlp ->
// ... -> head) instead of from the IR graph. It is the specification the executor's plan-driven step must match.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "piper/runtime/data/data_loader.h"
#include "piper/runtime/model/model.h"
#include "piper/spec/model_spec.h"

namespace piper::runtime::testing {

// 3 layers (dense, MoE with a shared expert, MoE), hidden 16, GQA 2/1 heads of 8, 4 experts top-2, vocab 32.
ModelSpec small_moe_spec(bool shared_expert = true);

// Writes a token file (.u16) with a learnable pattern of ids in [0, 32) (small_moe_spec's vocabulary) to `path`
// and returns `path`.
std::string write_pattern_token_file(const std::string& path);

// Random batch of ids in [0, vocab).
Batch random_batch(int64_t batch_size, int64_t seq, int64_t vocab, uint64_t seed);

struct ReferenceResult {
  double loss = 0;      // mean LM loss over microbatches
  double aux_loss = 0;  // routers' weighted aux losses (already averaged)
};

// Zeroes the gradients, runs forward + backward over `num_microbatches` equal microbatches and leaves the
// gradients in the model. backward = false runs the forwards only (for finite differences).
ReferenceResult reference_step(Model& model, const Batch& batch, int num_microbatches, Allocator* allocator,
                               bool backward = true);

}  // namespace piper::runtime::testing
