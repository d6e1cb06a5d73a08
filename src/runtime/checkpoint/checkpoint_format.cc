#include "piper/runtime/checkpoint/checkpoint_format.h"

#include <cstdio>
#include <cstring>

#include "piper/runtime/checkpoint/safetensors.h"

namespace piper::checkpoint_format {

Status bad_index(const std::string& path, const std::string& what) {
  return data_loss("checkpoint index '" + path + "' is corrupt: " + what + "; resume from an earlier checkpoint");
}

std::string index_checksum(const Json& index) {
  Json rest = index;
  rest.erase(kIndexChecksumKey);
  const std::string text = rest.dump();
  return hex64(fnv1a64(text.data(), text.size()));
}

Shape stored_shape(const Shape& extent, int64_t begin, int64_t end) {
  int64_t numel = 1;
  for (int64_t e : extent) numel *= e;
  return begin == 0 && end == numel ? extent : Shape{end - begin};
}

Status check_box(const std::string& name, const Shape& shape, const Shape& offset, const Shape& extent,
                 int64_t begin, int64_t end) {
  const std::string box = "tensor '" + name + "': box at " + shape_to_string(offset) + " of extent " +
                          shape_to_string(extent);
  if (offset.size() != shape.size() || extent.size() != shape.size()) {
    return invalid_argument(box + " does not have the rank of the tensor's shape " + shape_to_string(shape));
  }
  int64_t numel = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    // Written so that nothing overflows: the sizes come from a file.
    if (shape[d] < 0 || offset[d] < 0 || extent[d] < 0 || offset[d] > shape[d] || extent[d] > shape[d] - offset[d]) {
      return invalid_argument(box + " lies outside the tensor's shape " + shape_to_string(shape));
    }
    if (__builtin_mul_overflow(numel, extent[d], &numel)) {
      return invalid_argument(box + " has more than 2^63 elements");
    }
  }
  if (begin < 0 || begin > end || end > numel) {
    return invalid_argument(box + ": element range [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") lies outside its " + std::to_string(numel) + " elements");
  }
  return ok_status();
}

bool boxes_overlap(const Shape& a_offset, const Shape& a_extent, const Shape& b_offset, const Shape& b_extent) {
  for (size_t d = 0; d < a_offset.size(); ++d) {
    if (a_offset[d] + a_extent[d] <= b_offset[d] || b_offset[d] + b_extent[d] <= a_offset[d]) return false;
  }
  return true;
}

void copy_piece(const Shape& src_offset, const Shape& src_extent, int64_t begin, int64_t end, const float* src,
                const Shape& dst_offset, const Shape& dst_extent, float* dst, std::vector<uint8_t>* covered) {
  if (src_offset == dst_offset && src_extent == dst_extent) {
    if (end > begin) std::memcpy(dst + begin, src, static_cast<size_t>(end - begin) * sizeof(float));
    for (int64_t i = begin; i < end; ++i) ++(*covered)[static_cast<size_t>(i)];
    return;
  }
  // Element by element: the source box's coordinates run like an odometer from `begin`.
  const size_t rank = src_extent.size();
  std::vector<int64_t> coord(rank, 0), dst_stride(rank, 1);
  for (size_t d = rank; d-- > 1;) dst_stride[d - 1] = dst_stride[d] * dst_extent[d];
  int64_t rest = begin;
  for (size_t d = rank; d-- > 0;) {
    coord[d] = src_extent[d] > 0 ? rest % src_extent[d] : 0;
    rest = src_extent[d] > 0 ? rest / src_extent[d] : 0;
  }
  for (int64_t i = begin; i < end; ++i) {
    bool inside = true;
    int64_t at = 0;
    for (size_t d = 0; d < rank && inside; ++d) {
      const int64_t g = src_offset[d] + coord[d] - dst_offset[d];
      inside = g >= 0 && g < dst_extent[d];
      at += g * dst_stride[d];
    }
    if (inside) {
      dst[at] = src[i - begin];
      ++(*covered)[static_cast<size_t>(at)];
    }
    for (size_t d = rank; d-- > 0;) {
      if (++coord[d] < src_extent[d]) break;
      coord[d] = 0;
    }
  }
}

std::string piece_key(const std::string& name, const Shape& shape, const Shape& offset, const Shape& extent,
                      int64_t begin, int64_t end) {
  int64_t numel = 1;
  for (int64_t e : extent) numel *= e;
  if (extent == shape && begin == 0 && end == numel) return name;
  return name + "@" + shape_to_string(offset) + "+" + shape_to_string(extent) + "#[" + std::to_string(begin) + ":" +
         std::to_string(end) + "]";
}

}  // namespace piper::checkpoint_format
