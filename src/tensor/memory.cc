#include "piper/tensor/memory.h"

#include <algorithm>
#include <cstdlib>

#include "piper/base/check.h"

namespace piper {

const char* to_string(MemCategory category) {
  switch (category) {
    case MemCategory::kParameters:
      return "parameters";
    case MemCategory::kGradients:
      return "gradients";
    case MemCategory::kOptimizer:
      return "optimizer";
    case MemCategory::kActivations:
      return "activations";
    case MemCategory::kBuffers:
      return "buffers";
  }
  return "unknown";
}

void MemoryTracker::on_allocate(MemCategory category, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int c = static_cast<int>(category);
  stats_.live_bytes[c] += bytes;
  stats_.peak_bytes[c] = std::max(stats_.peak_bytes[c], stats_.live_bytes[c]);
  stats_.live_total_bytes += bytes;
  stats_.peak_total_bytes = std::max(stats_.peak_total_bytes, stats_.live_total_bytes);
  ++stats_.num_allocations;
}

void MemoryTracker::on_free(MemCategory category, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int c = static_cast<int>(category);
  PIPER_CHECK(stats_.live_bytes[c] >= bytes, "freeing more ", to_string(category), " bytes than are live");
  stats_.live_bytes[c] -= bytes;
  stats_.live_total_bytes -= bytes;
}

MemoryStats MemoryTracker::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.live_bytes;
  stats_.peak_total_bytes = stats_.live_total_bytes;
}

void* TrackingAllocator::allocate(size_t bytes, MemCategory category) {
  // aligned_alloc needs a size that is a multiple of the alignment (and non-zero for a unique pointer).
  const size_t rounded =
      std::max<size_t>(kTensorAlignment, (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment);
  void* ptr = std::aligned_alloc(kTensorAlignment, rounded);
  if (ptr != nullptr) tracker_->on_allocate(category, static_cast<int64_t>(bytes));
  return ptr;
}

void TrackingAllocator::deallocate(void* ptr, size_t bytes, MemCategory category) {
  if (ptr == nullptr) return;
  std::free(ptr);
  tracker_->on_free(category, static_cast<int64_t>(bytes));
}

MemoryTracker* default_memory_tracker() {
  static MemoryTracker* tracker = new MemoryTracker();
  return tracker;
}

Allocator* default_allocator() {
  static Allocator* allocator = new TrackingAllocator(default_memory_tracker());
  return allocator;
}

}  // namespace piper
