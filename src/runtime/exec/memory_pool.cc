#include "piper/runtime/exec/memory_pool.h"

#include <algorithm>
#include <cstdlib>

namespace piper::runtime {

MemoryPool::~MemoryPool() {
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) std::free(p);
  }
}

size_t MemoryPool::rounded(size_t bytes) {
  return std::max<size_t>(kTensorAlignment, (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment);
}

void* MemoryPool::allocate(size_t bytes, MemCategory category) {
  const size_t size = rounded(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
    }
  }
  if (ptr == nullptr) {
    ptr = std::aligned_alloc(kTensorAlignment, size);
    if (ptr == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    reserved_ += static_cast<int64_t>(size);
    peak_reserved_ = std::max(peak_reserved_, reserved_);
  }
  tracker_->on_allocate(category, static_cast<int64_t>(bytes));
  return ptr;
}

void MemoryPool::deallocate(void* ptr, size_t bytes, MemCategory category) {
  if (ptr == nullptr) return;
  tracker_->on_free(category, static_cast<int64_t>(bytes));
  std::lock_guard<std::mutex> lock(mutex_);
  free_[rounded(bytes)].push_back(ptr);
}

int64_t MemoryPool::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}

int64_t MemoryPool::peak_reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_reserved_;
}

}  // namespace piper::runtime
