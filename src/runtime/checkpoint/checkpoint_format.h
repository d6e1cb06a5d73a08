// Internal to the checkpoint code (checkpoint.cc reads, checkpoint_save.cc writes): names of the format and
// the box arithmetic of pieces (checkpoint.h). Not a public header.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/runtime/checkpoint/checkpoint.h"
#include "piper/tensor/tensor.h"

namespace piper::checkpoint_format {

inline constexpr const char* kFormat = "piper-checkpoint";
// Version 3: the model's identity, per-tensor dtype, per-piece checksums over header entry + data, whole-file
// checksums, index_fnv1a64. Version 2 (data-only file checksums, no model identity) is refused.
inline constexpr int kVersion = 3;
inline constexpr const char* kIndexFile = "index.json";
inline constexpr const char* kLatestFile = "latest";
inline constexpr const char* kDtype = "F32";
inline constexpr const char* kIndexChecksumKey = "index_fnv1a64";
inline constexpr int64_t kMaxStep = 1'000'000'000'000;  // 10^12 optimizer steps: far beyond any real run

Status bad_index(const std::string& path, const std::string& what);

// The index's own checksum: fnv1a64 of its compact dump with sorted keys, without the checksum key.
std::string index_checksum(const Json& index);

// The shape a piece is stored under in its file: the box itself when the piece is all of it, else its range.
Shape stored_shape(const Shape& extent, int64_t begin, int64_t end);

// The contents of a valid index.json.
struct Index {
  CheckpointMeta meta;
  std::map<std::string, CheckpointReader::TensorInfo> tensors;
  std::map<std::string, CheckpointReader::FileInfo> files;
};
// Parses and validates the text of `path` (an index.json in directory `dir_name`, e.g. "step-00000012").
Result<Index> parse_index(const std::string& text, const std::string& path, const std::string& dir_name);

// InvalidArgument unless the box (offset, extent) lies inside `shape` (same rank) and [begin, end) inside it.
Status check_box(const std::string& name, const Shape& shape, const Shape& offset, const Shape& extent,
                 int64_t begin, int64_t end);
bool boxes_overlap(const Shape& a_offset, const Shape& a_extent, const Shape& b_offset, const Shape& b_extent);

// Copies flat elements [begin, end) of the source box (src holds exactly those elements) into the destination
// box wherever they fall inside it, and counts each written destination element in `covered`.
void copy_piece(const Shape& src_offset, const Shape& src_extent, int64_t begin, int64_t end, const float* src,
                const Shape& dst_offset, const Shape& dst_extent, float* dst, std::vector<uint8_t>* covered);

// The file key of a piece: the tensor name for a whole tensor, else "name@[offset]+[extent]#[begin:end]".
std::string piece_key(const std::string& name, const Shape& shape, const Shape& offset, const Shape& extent,
                      int64_t begin, int64_t end);

}  // namespace piper::checkpoint_format
