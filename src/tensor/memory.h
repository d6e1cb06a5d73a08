// Memory accounting for tensors: every byte a Tensor owns is allocated through an Allocator and counted in a
// MemoryTracker under one of five categories (parameters, gradients, optimizer state, activations, buffers).
//
// The tracker keeps, per category, the bytes live now and the peak; and the peak of the total (which is not the
// sum of per-category peaks). The executor compares these peaks with the resource model's prediction.
// Thread-safety: MemoryTracker and TrackingAllocator may be used from many threads at once.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace piper {

enum class MemCategory : int { kParameters = 0, kGradients, kOptimizer, kActivations, kBuffers };
inline constexpr int kNumMemCategories = 5;

// "parameters", "gradients", "optimizer", "activations", "buffers".
const char* to_string(MemCategory category);

// A snapshot of a tracker's counters, all in bytes.
struct MemoryStats {
  std::array<int64_t, kNumMemCategories> live_bytes{};
  std::array<int64_t, kNumMemCategories> peak_bytes{};
  int64_t live_total_bytes = 0;
  int64_t peak_total_bytes = 0;
  int64_t num_allocations = 0;
};

class MemoryTracker {
 public:
  void on_allocate(MemCategory category, int64_t bytes);
  void on_free(MemCategory category, int64_t bytes);
  MemoryStats stats() const;
  // Sets every peak to the current live value (e.g. after loading parameters, before the first step).
  void reset_peaks();

 private:
  mutable std::mutex mutex_;
  MemoryStats stats_;
};

// The allocation hook. Implementations must return memory aligned to kTensorAlignment bytes and count it.
class Allocator {
 public:
  static constexpr size_t kTensorAlignment = 64;
  virtual ~Allocator() = default;
  // Returns nullptr only if the system is out of memory. bytes may be 0 (returns a valid unique pointer).
  virtual void* allocate(size_t bytes, MemCategory category) = 0;
  virtual void deallocate(void* ptr, size_t bytes, MemCategory category) = 0;
};

// Heap allocation (aligned) counted in a tracker. The tracker must outlive every allocation made through it.
class TrackingAllocator : public Allocator {
 public:
  explicit TrackingAllocator(MemoryTracker* tracker) : tracker_(tracker) {}
  void* allocate(size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category) override;
  MemoryTracker* tracker() const { return tracker_; }

 private:
  MemoryTracker* tracker_;
};

// The process-wide default: a TrackingAllocator over default_memory_tracker(). Never destroyed.
Allocator* default_allocator();
MemoryTracker* default_memory_tracker();

}  // namespace piper
