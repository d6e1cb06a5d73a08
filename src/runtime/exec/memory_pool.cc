#include "piper/runtime/exec/memory_pool.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>

namespace piper::runtime {

MemoryPool::~MemoryPool() { release_cached_over(0); }

size_t MemoryPool::block_size(size_t bytes) {
  const size_t aligned =
      std::max<size_t>(kTensorAlignment, (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment);
  constexpr size_t kExactUpTo = size_t{64} << 10;
  if (aligned <= kExactUpTo) return aligned;
  // 8 classes per power of two: steps of 1/8 of the power of two below the size.
  const size_t step = std::bit_floor(aligned) / 8;
  return (aligned + step - 1) / step * step;
}

void* MemoryPool::take_cached(size_t size) {
  auto it = free_.lower_bound(size);
  if (it == free_.end() || it->first > 2 * size) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  cached_ -= static_cast<int64_t>(it->first);
  size_of_[ptr] = it->first;
  if (it->second.empty()) free_.erase(it);
  return ptr;
}

void MemoryPool::note_in_use() { peak_in_use_ = std::max(peak_in_use_, reserved_ - cached_); }

void MemoryPool::release_cached_over(int64_t bound) {
  while (cached_ > bound && !free_.empty()) {
    auto last = std::prev(free_.end());
    std::free(last->second.back());
    last->second.pop_back();
    cached_ -= static_cast<int64_t>(last->first);
    reserved_ -= static_cast<int64_t>(last->first);
    if (last->second.empty()) free_.erase(last);
  }
}

void* MemoryPool::allocate(size_t bytes, MemCategory category) {
  const size_t size = block_size(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ptr = take_cached(size);
    if (ptr != nullptr) {
      note_in_use();
    } else {
      release_cached_over(peak_in_use_);
    }
  }
  if (ptr == nullptr) {
    ptr = std::aligned_alloc(kTensorAlignment, size);
    if (ptr == nullptr) {
      // Out of memory: the whole cache goes back to the system before giving up.
      {
        std::lock_guard<std::mutex> lock(mutex_);
        release_cached_over(0);
      }
      ptr = std::aligned_alloc(kTensorAlignment, size);
    }
    if (ptr == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    size_of_[ptr] = size;
    reserved_ += static_cast<int64_t>(size);
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    note_in_use();
  }
  tracker_->on_allocate(category, static_cast<int64_t>(bytes));
  return ptr;
}

void MemoryPool::deallocate(void* ptr, size_t bytes, MemCategory category) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = size_of_.find(ptr);
    if (it == size_of_.end()) {
      std::fprintf(stderr,
                   "piper: MemoryPool: freeing %p (%zu bytes), which it did not hand out or was freed "
                   "already: a bug in the executor\n",
                   ptr, bytes);
      std::abort();
    }
    free_[it->second].push_back(ptr);
    cached_ += static_cast<int64_t>(it->second);
    size_of_.erase(it);
  }
  tracker_->on_free(category, static_cast<int64_t>(bytes));
}

int64_t MemoryPool::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}

int64_t MemoryPool::peak_reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_reserved_;
}

int64_t MemoryPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

}  // namespace piper::runtime
