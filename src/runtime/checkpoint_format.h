// Internal to the checkpoint code (checkpoint.cc reads, checkpoint_save.cc writes): names of the format and
// the box arithmetic of pieces (checkpoint.h). Not a public header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/tensor/tensor.h"

namespace piper::checkpoint_format {

inline constexpr const char* kFormat = "piper-checkpoint";
inline constexpr int kVersion = 2;
inline constexpr const char* kIndexFile = "index.json";
inline constexpr const char* kLatestFile = "latest";

std::string hex64(uint64_t v);
Status bad_index(const std::string& path, const std::string& what);

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
