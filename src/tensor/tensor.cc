#include "piper/tensor/tensor.h"

#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

#include "piper/base/check.h"

namespace piper {
namespace {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

}  // namespace

std::string shape_to_string(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

Result<int64_t> shape_numel(const Shape& shape) {
  if (static_cast<int>(shape.size()) > Tensor::kMaxDims) {
    return invalid_argument("tensor shape " + shape_to_string(shape) + " has " + std::to_string(shape.size()) +
                            " dimensions; at most " + std::to_string(Tensor::kMaxDims) + " are supported");
  }
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) return invalid_argument("tensor shape " + shape_to_string(shape) + " has a negative size");
    if (s != 0 && n > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(float)) / s) {
      return invalid_argument("tensor shape " + shape_to_string(shape) + " has too many elements for int64 bytes");
    }
    n *= s;
  }
  return n;
}

Tensor::~Tensor() { release(); }

Tensor::Tensor(Tensor&& other) noexcept { *this = std::move(other); }

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    release();
    shape_ = std::move(other.shape_);
    strides_ = std::move(other.strides_);
    numel_ = std::exchange(other.numel_, 0);
    data_ = std::exchange(other.data_, nullptr);
    category_ = other.category_;
    allocator_ = std::exchange(other.allocator_, nullptr);
    other.shape_.clear();
    other.strides_.clear();
  }
  return *this;
}

void Tensor::release() {
  if (data_ != nullptr) allocator_->deallocate(data_, static_cast<size_t>(nbytes()), category_);
  data_ = nullptr;
}

Result<Tensor> Tensor::zeros(const Shape& shape, MemCategory category, Allocator* allocator) {
  PIPER_ASSIGN_OR_RETURN(int64_t n, shape_numel(shape));
  if (allocator == nullptr) allocator = default_allocator();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  void* ptr = allocator->allocate(bytes, category);
  if (ptr == nullptr) {
    return resource_exhausted("cannot allocate " + std::to_string(bytes) + " bytes of " + to_string(category) +
                              " for a tensor of shape " + shape_to_string(shape));
  }
  std::memset(ptr, 0, bytes);
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.numel_ = n;
  t.data_ = static_cast<float*>(ptr);
  t.category_ = category;
  t.allocator_ = allocator;
  return t;
}

Tensor Tensor::uninitialized_or_die(const Shape& shape, MemCategory category, Allocator* allocator) {
  Result<int64_t> n = shape_numel(shape);
  PIPER_CHECK_OK(n.status());
  if (allocator == nullptr) allocator = default_allocator();
  const size_t bytes = static_cast<size_t>(*n) * sizeof(float);
  void* ptr = allocator->allocate(bytes, category);
  PIPER_CHECK(ptr != nullptr, "cannot allocate ", bytes, " bytes of ", to_string(category), " for a tensor of shape ",
              shape_to_string(shape));
  Tensor t;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.numel_ = *n;
  t.data_ = static_cast<float*>(ptr);
  t.category_ = category;
  t.allocator_ = allocator;
  return t;
}

Tensor Tensor::zeros_or_die(const Shape& shape, MemCategory category, Allocator* allocator) {
  Result<Tensor> t = zeros(shape, category, allocator);
  PIPER_CHECK_OK(t.status());
  return std::move(t).value();
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += ndim();
  PIPER_CHECK(i >= 0 && i < ndim(), "dimension ", i, " of a ", ndim(), "-d tensor");
  return shape_[i];
}

Status Tensor::reshape(const Shape& shape) {
  PIPER_ASSIGN_OR_RETURN(int64_t n, shape_numel(shape));
  if (n != numel_) {
    return invalid_argument("cannot reshape a tensor of shape " + shape_to_string(shape_) + " (" +
                            std::to_string(numel_) + " elements) to " + shape_to_string(shape) + " (" +
                            std::to_string(n) + " elements)");
  }
  shape_ = shape;
  strides_ = contiguous_strides(shape);
  return ok_status();
}

void Tensor::fill(float value) {
  for (int64_t i = 0; i < numel_; ++i) data_[i] = value;
}

Tensor Tensor::clone(MemCategory category) const {
  Tensor t = zeros_or_die(shape_, category, allocator_ != nullptr ? allocator_ : default_allocator());
  if (numel_ > 0) std::memcpy(t.data_, data_, static_cast<size_t>(nbytes()));
  return t;
}

}  // namespace piper
