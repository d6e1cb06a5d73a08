// MemoryPool: the executor's allocator. Counts every tensor's bytes in a MemoryTracker by category (live and
// peak, what the resource model predicts) and caches freed blocks for reuse.
//
// A training step allocates the same shapes every step; handing back a cached block avoids the page faults
// and kernel zeroing of fresh memory, which cost about 30 % of a tiny-moe step without the cache. Not every shape
// repeats: under expert parallelism the rows an ep rank receives change every step, so blocks are cached by size
// class (block_size: above 64 KiB one of 8 classes per power of two) and a request takes the smallest cached block
// of at least its class and at most twice it. A request no cached block serves allocates a new one and, while the
// cache holds more bytes than the most ever in use at once, first returns cached blocks to the system, largest
// first: so the pool stays within about twice what a step uses however the shapes vary (it kept every distinct size
// before: tiny-moe dp=4 ep=4 grew 284 -> 1,564 MiB over 5 -> 60 steps), and a step whose blocks all came back at
// its end finds them at the next one's start. Freeing a block the pool did not hand out (or twice) aborts: it is
// a bug that would otherwise corrupt memory or the counts.
// reserved_bytes() is what the pool holds from the system (in use + cached). Thread-safety: allocate/deallocate
// may be called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "piper/tensor/memory.h"

namespace piper::runtime {

class MemoryPool : public Allocator {
 public:
  explicit MemoryPool(MemoryTracker* tracker) : tracker_(tracker) {}
  ~MemoryPool() override;
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  void* allocate(size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, size_t bytes, MemCategory category) override;

  int64_t reserved_bytes() const;
  int64_t peak_reserved_bytes() const;
  int64_t cached_bytes() const;  // held in the cache, free for reuse

  // The size of the block that serves a request of `bytes`: a multiple of kTensorAlignment, and above 64 KiB
  // rounded up to one of 8 sizes per power of two (at most 12.5 % more than asked).
  static size_t block_size(size_t bytes);

 private:
  void* take_cached(size_t size);     // with mutex_ held; nullptr when no cached block fits
  void release_cached_over(int64_t bound);  // with mutex_ held: cached blocks, largest first, down to bound
  void note_in_use();                 // with mutex_ held
  MemoryTracker* tracker_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;  // block size -> cached blocks
  std::unordered_map<void*, size_t> size_of_;  // block in use -> its size
  int64_t reserved_ = 0, peak_reserved_ = 0, cached_ = 0, peak_in_use_ = 0;
};

}  // namespace piper::runtime
