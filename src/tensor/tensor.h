// Tensor: an fp32, contiguous, row-major array that owns its buffer.
//
// Shapes have 0..8 dimensions; strides are the contiguous ones (in elements) and exist for callers that index
// by hand. Memory comes from an Allocator (default: default_allocator()) and is counted under the tensor's
// MemCategory for as long as the tensor lives. Tensors are move-only; clone() copies explicitly.
// Creation validates the shape (negative sizes, too many dimensions, element-count overflow) and returns a
// Status; element access is unchecked (PIPER_DCHECK in debug builds).
// Thread-safety: like a std::vector<float>; concurrent reads are fine, writes need external ordering.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/tensor/memory.h"

namespace piper {

using Shape = std::vector<int64_t>;

// "[2, 3, 4]".
std::string shape_to_string(const Shape& shape);
// Product of the sizes; InvalidArgument naming the shape if a size is negative, there are more than
// Tensor::kMaxDims dimensions, or the count overflows int64.
Result<int64_t> shape_numel(const Shape& shape);

class Tensor {
 public:
  static constexpr int kMaxDims = 8;

  Tensor() = default;  // empty: no dimensions, no buffer, numel() == 0
  ~Tensor();
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  // Zero-filled tensor. ResourceExhausted if the allocator has no memory.
  static Result<Tensor> zeros(const Shape& shape, MemCategory category, Allocator* allocator = nullptr);
  // Zero-filled; aborts (PIPER_CHECK) on a bad shape or no memory. For shapes the program itself computed.
  static Tensor zeros_or_die(const Shape& shape, MemCategory category, Allocator* allocator = nullptr);
  // Like zeros_or_die, but the contents are unspecified (whatever the allocator's block held): only for outputs
  // that a kernel overwrites entirely before anything reads them. Saves the memset (and page faults on fresh memory).
  static Tensor uninitialized_or_die(const Shape& shape, MemCategory category, Allocator* allocator = nullptr);

  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return numel_ * static_cast<int64_t>(sizeof(float)); }
  MemCategory category() const { return category_; }
  bool empty() const { return data_ == nullptr; }

  float* data() { return data_; }
  const float* data() const { return data_; }
  float& operator[](int64_t i) { return data_[i]; }
  float operator[](int64_t i) const { return data_[i]; }

  // Same data, new shape with the same element count; InvalidArgument otherwise.
  Status reshape(const Shape& shape);
  void fill(float value);
  // A copy in the given category (same allocator).
  Tensor clone(MemCategory category) const;
  Tensor clone() const { return clone(category_); }

 private:
  void release();
  Shape shape_;
  Shape strides_;
  int64_t numel_ = 0;
  float* data_ = nullptr;
  MemCategory category_ = MemCategory::kBuffers;
  Allocator* allocator_ = nullptr;
};

}  // namespace piper
