// runtime::MemoryPool (runtime/exec/memory_pool.h): blocks by size class, reuse across nearby sizes, a cache bounded
// by what is in use, and the tracker counting the requested bytes.
#include "piper/runtime/exec/memory_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace piper::runtime {
namespace {

TEST(MemoryPool, BlockSizesAreAlignedThenEightClassesPerPowerOfTwo) {
  EXPECT_EQ(MemoryPool::block_size(0), 64u);
  EXPECT_EQ(MemoryPool::block_size(1), 64u);
  EXPECT_EQ(MemoryPool::block_size(65), 128u);
  EXPECT_EQ(MemoryPool::block_size(64 << 10), size_t{64} << 10);
  // 1 MiB + 1 byte: the classes above 1 MiB step by 128 KiB.
  EXPECT_EQ(MemoryPool::block_size((1 << 20) + 1), size_t{(1 << 20) + (128 << 10)});
  for (size_t bytes : {size_t{70000}, size_t{1000000}, size_t{3} << 20, size_t{123456789}}) {
    const size_t b = MemoryPool::block_size(bytes);
    EXPECT_GE(b, bytes);
    EXPECT_LE(static_cast<double>(b), 1.125 * static_cast<double>(bytes) + 64) << bytes;
    EXPECT_EQ(b % Allocator::kTensorAlignment, 0u);
  }
}

TEST(MemoryPool, ANearbySizeReusesACachedBlock) {
  MemoryTracker tracker;
  MemoryPool pool(&tracker);
  void* a = pool.allocate(3'000'000, MemCategory::kActivations);
  ASSERT_NE(a, nullptr);
  pool.deallocate(a, 3'000'000, MemCategory::kActivations);
  const int64_t reserved = pool.reserved_bytes();
  // Another row count of the same width, as an ep rank's next step receives: the cached block serves it.
  void* b = pool.allocate(3'100'000, MemCategory::kActivations);
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.reserved_bytes(), reserved);
  EXPECT_EQ(tracker.stats().live_bytes[static_cast<int>(MemCategory::kActivations)], 3'100'000);
  pool.deallocate(b, 3'100'000, MemCategory::kActivations);
  EXPECT_EQ(tracker.stats().live_bytes[static_cast<int>(MemCategory::kActivations)], 0);
  // More than twice the block: not served by it, and the cache (no more than the most in use so far) is kept.
  void* c = pool.allocate(7'000'000, MemCategory::kActivations);
  EXPECT_EQ(pool.cached_bytes(), static_cast<int64_t>(MemoryPool::block_size(3'000'000)));
  EXPECT_EQ(pool.reserved_bytes(),
            static_cast<int64_t>(MemoryPool::block_size(3'000'000) + MemoryPool::block_size(7'000'000)));
  pool.deallocate(c, 7'000'000, MemCategory::kActivations);
}

TEST(MemoryPool, VaryingSizesKeepTheCacheBoundedByWhatIsInUse) {
  MemoryTracker tracker;
  MemoryPool pool(&tracker);
  // A resident 8 MiB (weights) and, each "step", three activations whose sizes change from step to step.
  void* resident = pool.allocate(8 << 20, MemCategory::kParameters);
  uint64_t x = 12345;
  int64_t most_reserved = 0;
  for (int step = 0; step < 500; ++step) {
    std::vector<std::pair<void*, size_t>> live;
    for (int i = 0; i < 3; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const size_t bytes = (size_t{1} << 16) + (x >> 33) % (size_t{4} << 20);  // 64 KiB .. 4.06 MiB
      void* p = pool.allocate(bytes, MemCategory::kActivations);
      ASSERT_NE(p, nullptr);
      live.emplace_back(p, bytes);
    }
    for (auto& [p, bytes] : live) pool.deallocate(p, bytes, MemCategory::kActivations);
    most_reserved = std::max(most_reserved, pool.reserved_bytes());
  }
  // In use at most 8 MiB + 3 x 4.6 MiB (the largest class); the cache at most as much again. (Caching each of the
  // 1,500 sizes, as the pool once did, would hold about 3 GiB.)
  EXPECT_LE(most_reserved, 2 * ((8 << 20) + 3 * (int64_t{46} << 20) / 10));
  pool.deallocate(resident, 8 << 20, MemCategory::kParameters);
}

TEST(MemoryPool, AStepsBlocksAreThereAtTheNextStepsStart) {
  MemoryTracker tracker;
  MemoryPool pool(&tracker);
  // Activations larger than what stays resident: every block comes back at the step's end, and the next step's
  // first request (a size the cache has no class for) must not give them back to the system.
  void* resident = pool.allocate(1 << 20, MemCategory::kParameters);
  std::vector<void*> acts;
  for (int i = 0; i < 4; ++i) acts.push_back(pool.allocate(4 << 20, MemCategory::kActivations));
  for (void* p : acts) pool.deallocate(p, 4 << 20, MemCategory::kActivations);
  const int64_t cached = pool.cached_bytes();
  void* other = pool.allocate(100 << 10, MemCategory::kBuffers);
  EXPECT_EQ(pool.cached_bytes(), cached);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(pool.allocate(4 << 20, MemCategory::kActivations), acts[3 - i]);
  for (void* p : acts) pool.deallocate(p, 4 << 20, MemCategory::kActivations);
  pool.deallocate(other, 100 << 10, MemCategory::kBuffers);
  pool.deallocate(resident, 1 << 20, MemCategory::kParameters);
}

TEST(MemoryPoolDeathTest, FreeingABlockTwiceAborts) {
  MemoryTracker tracker;
  MemoryPool pool(&tracker);
  void* p = pool.allocate(1000, MemCategory::kBuffers);
  pool.deallocate(p, 1000, MemCategory::kBuffers);
  EXPECT_DEATH(pool.deallocate(p, 1000, MemCategory::kBuffers), "did not hand out or was freed already");
}

}  // namespace
}  // namespace piper::runtime
