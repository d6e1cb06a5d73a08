#include "piper/tensor/tensor.h"

#include <gtest/gtest.h>

#include "piper/tensor/memory.h"

namespace piper {
namespace {

TEST(TensorTest, ZerosHasContiguousStrides) {
  MemoryTracker tracker;
  TrackingAllocator alloc(&tracker);
  Result<Tensor> t = Tensor::zeros({2, 3, 4}, MemCategory::kActivations, &alloc);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->numel(), 24);
  EXPECT_EQ(t->strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t->dim(-1), 4);
  for (int64_t i = 0; i < t->numel(); ++i) EXPECT_EQ((*t)[i], 0.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % Allocator::kTensorAlignment, 0u);
}

TEST(TensorTest, UninitializedHasTheShapeAndIsCounted) {
  MemoryTracker tracker;
  TrackingAllocator alloc(&tracker);
  {
    Tensor t = Tensor::uninitialized_or_die({3, 5}, MemCategory::kBuffers, &alloc);
    EXPECT_EQ(t.numel(), 15);
    EXPECT_EQ(t.strides(), (Shape{5, 1}));
    EXPECT_EQ(t.category(), MemCategory::kBuffers);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % Allocator::kTensorAlignment, 0u);
    EXPECT_EQ(tracker.stats().live_bytes[static_cast<int>(MemCategory::kBuffers)], 60);
    t.fill(2.0f);  // writable
    EXPECT_EQ(t[14], 2.0f);
  }
  EXPECT_EQ(tracker.stats().live_total_bytes, 0);
}

TEST(TensorTest, BadShapesAreErrors) {
  Result<Tensor> neg = Tensor::zeros({2, -1}, MemCategory::kBuffers);
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(neg.status().message().find("[2, -1]"), std::string::npos);
  EXPECT_FALSE(Tensor::zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}, MemCategory::kBuffers).ok());
  EXPECT_FALSE(Tensor::zeros({int64_t{1} << 40, int64_t{1} << 40}, MemCategory::kBuffers).ok());
}

TEST(TensorTest, ReshapeKeepsDataAndChecksCount) {
  Tensor t = Tensor::zeros_or_die({6}, MemCategory::kBuffers);
  t[5] = 7.0f;
  ASSERT_TRUE(t.reshape({2, 3}).ok());
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t[5], 7.0f);
  Status s = t.reshape({4, 2});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(TensorTest, TrackerCountsLiveAndPeakPerCategory) {
  MemoryTracker tracker;
  TrackingAllocator alloc(&tracker);
  {
    Tensor p = Tensor::zeros_or_die({100}, MemCategory::kParameters, &alloc);
    {
      Tensor a = Tensor::zeros_or_die({50}, MemCategory::kActivations, &alloc);
      Tensor b = Tensor::zeros_or_die({25}, MemCategory::kActivations, &alloc);
      MemoryStats s = tracker.stats();
      EXPECT_EQ(s.live_bytes[static_cast<int>(MemCategory::kActivations)], 300);
      EXPECT_EQ(s.live_total_bytes, 700);
    }
    Tensor g = Tensor::zeros_or_die({10}, MemCategory::kGradients, &alloc);
    Tensor moved = std::move(g);  // a move must not double count or double free
    MemoryStats s = tracker.stats();
    EXPECT_EQ(s.live_bytes[static_cast<int>(MemCategory::kActivations)], 0);
    EXPECT_EQ(s.peak_bytes[static_cast<int>(MemCategory::kActivations)], 300);
    EXPECT_EQ(s.live_bytes[static_cast<int>(MemCategory::kGradients)], 40);
    EXPECT_EQ(s.peak_total_bytes, 700);
    EXPECT_EQ(s.live_total_bytes, 440);
    tracker.reset_peaks();
    EXPECT_EQ(tracker.stats().peak_total_bytes, 440);
    Tensor c = moved.clone(MemCategory::kOptimizer);
    EXPECT_EQ(tracker.stats().live_bytes[static_cast<int>(MemCategory::kOptimizer)], 40);
  }
  MemoryStats s = tracker.stats();
  EXPECT_EQ(s.live_total_bytes, 0);
  EXPECT_EQ(s.num_allocations, 5);
  EXPECT_STREQ(to_string(MemCategory::kOptimizer), "optimizer");
}

}  // namespace
}  // namespace piper
