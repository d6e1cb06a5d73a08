// The parts of a transformer model: one enum for the resource model (cost/layer_cost.h prices each part) and for
// the chunks that the compiled Plan, the simulator and the runtime run.
//
// Seven parts are chunks (a unit of work with F, B and W tasks): embedding, attention, router, experts, shared
// experts, dense MLP and head. Their names (`chunk_name`: "embed", "attn", "router", "experts", "shared", "mlp",
// "head") are the serialized form: IR tags, directive filters, Plan files (`piper compile --emit-plan`), chunk and
// checkpoint tensor names. A name is parsed into the enum once, where it enters (`parse_chunk_part`); code compares
// enums. kNorms and kAttentionCore are priced pieces of the attention chunk (its norms and residual adds, its
// QK^T/AV kernel), not chunks of their own; the resource model names every part with `to_string`.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "piper/base/status.h"

namespace piper {

// The order is the resource model's (cost arrays are indexed by it); do not reorder.
enum class Part : uint8_t {
  kEmbedding,
  kNorms,  // the two norms and residual adds of a layer: pointwise only
  kAttention,
  kAttentionCore,
  kRouter,
  kExperts,
  kSharedExperts,
  kDenseMlp,
  kHead
};
inline constexpr int kNumParts = 9;

// The chunk parts, in a layer's order.
inline constexpr std::array<Part, 7> kChunkParts = {Part::kEmbedding, Part::kAttention,     Part::kRouter,
                                                    Part::kExperts,   Part::kSharedExperts, Part::kDenseMlp,
                                                    Part::kHead};

// The resource model's name: "embedding", "norms", "attention", "attention_core", "router", "experts",
// "shared_experts", "dense_mlp", "head".
const char* to_string(Part p);

// Whether the part is a chunk (every part but kNorms and kAttentionCore).
bool is_chunk(Part p);

// The chunk's serialized name ("attn" for kAttention); "" for a part that is no chunk.
const char* chunk_name(Part p);

// The chunk part named `name`; nullopt for any other string (a communication's tag such as "dispatch").
std::optional<Part> chunk_part(std::string_view name);

// As chunk_part, with an error for an unknown name: "<where>: part 'xyz' is not a chunk part; use one of embed,
// attn, router, experts, shared, mlp, head".
Result<Part> parse_chunk_part(std::string_view name, const std::string& where);

}  // namespace piper
