// Constructors of the concrete chunks (one file each) and helpers they share. Internal to chunks/.
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include "piper/runtime/model/chunks/chunk.h"

namespace piper::runtime {

// The rows of the vocabulary an embed or head chunk holds: shard `shard` of `shards` equal row blocks
// (vocabulary parallelism, tp_slice.h). The default is the whole vocabulary.
struct VocabSlice {
  int shard = 0, shards = 1;
  int64_t rows(int64_t vocab) const { return vocab / shards; }
  int64_t begin(int64_t vocab) const { return shard * rows(vocab); }
};

std::unique_ptr<Chunk> make_embed_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator,
                                        VocabSlice slice = {});
// residual = false: no residual add (a tensor-parallel slice on tensor rank > 0, tp_slice.h).
std::unique_ptr<Chunk> make_attn_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator,
                                       bool residual = true);
std::unique_ptr<Chunk> make_router_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator);
std::unique_ptr<Chunk> make_experts_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator);
std::unique_ptr<Chunk> make_shared_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator);
std::unique_ptr<Chunk> make_mlp_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator);
// Pre-norm SwiGLU block of the given width, with or without the residual add (mlp, shared).
std::unique_ptr<Chunk> make_ffn_chunk(Part part, int layer, const ChunkDims& dims, int64_t width, bool residual,
                                      uint64_t seed, Allocator* allocator);
std::unique_ptr<Chunk> make_head_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator,
                                       VocabSlice slice = {});

// Standard deviation of the initial weights: 0.02, and 0.02 / sqrt(2 · layers) for projections that write into
// the residual stream (GPT-2's scaled init).
inline float init_std() { return 0.02f; }
float residual_init_std(const ChunkDims& dims);

// out[i] = a[i] + b[i].
void add_into(float* out, const float* a, const float* b, int64_t n);

}  // namespace piper::runtime
