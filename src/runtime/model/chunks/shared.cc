// shared: the shared experts of a MoE layer. S shared SwiGLU experts of width f equal one SwiGLU of width S·f,
// so they run as one. The output has no residual (the routed experts' chunk adds it); the next layer sums both.
// Unlike DeepSeek, which feeds one normed input to routed and shared experts, the graph gives `shared` its own
// edge from `attn`, so it has its own RMSNorm weight.
#include "piper/runtime/model/chunks/parts.h"

namespace piper::runtime {

std::unique_ptr<Chunk> make_shared_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator) {
  return make_ffn_chunk(Part::kSharedExperts, layer, dims,
                        dims.shared_intermediate * std::max(1, dims.num_shared_experts), false, seed, allocator);
}

}  // namespace piper::runtime
