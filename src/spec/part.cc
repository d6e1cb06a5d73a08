#include "piper/spec/part.h"

namespace piper {

const char* to_string(Part p) {
  switch (p) {
    case Part::kEmbedding:
      return "embedding";
    case Part::kNorms:
      return "norms";
    case Part::kAttention:
      return "attention";
    case Part::kAttentionCore:
      return "attention_core";
    case Part::kRouter:
      return "router";
    case Part::kExperts:
      return "experts";
    case Part::kSharedExperts:
      return "shared_experts";
    case Part::kDenseMlp:
      return "dense_mlp";
    case Part::kHead:
      return "head";
  }
  return "?";
}

bool is_chunk(Part p) { return p != Part::kNorms && p != Part::kAttentionCore; }

const char* chunk_name(Part p) {
  switch (p) {
    case Part::kEmbedding:
      return "embed";
    case Part::kAttention:
      return "attn";
    case Part::kRouter:
      return "router";
    case Part::kExperts:
      return "experts";
    case Part::kSharedExperts:
      return "shared";
    case Part::kDenseMlp:
      return "mlp";
    case Part::kHead:
      return "head";
    case Part::kNorms:
    case Part::kAttentionCore:
      return "";
  }
  return "";
}

std::optional<Part> chunk_part(std::string_view name) {
  for (Part p : kChunkParts) {
    if (name == chunk_name(p)) return p;
  }
  return std::nullopt;
}

Result<Part> parse_chunk_part(std::string_view name, const std::string& where) {
  if (std::optional<Part> p = chunk_part(name)) return *p;
  std::string names;
  for (Part p : kChunkParts) names += std::string(names.empty() ? "" : ", ") + chunk_name(p);
  return invalid_argument(where + ": part '" + std::string(name) + "' is not a chunk part; use one of " + names);
}

}  // namespace piper
