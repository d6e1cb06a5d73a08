// The executor core's message table (src/runtime/exec/message_table.h): one copy per consumer, the entry leaves with
// the last, forward and backward messages of one node apart, safe from several threads.
#include "piper/runtime/exec/message_table.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace piper::runtime::detail {
namespace {

std::shared_ptr<const Tensor> tensor_of(float v) {
  auto t = std::make_shared<Tensor>(Tensor::zeros_or_die({1, 2}, MemCategory::kActivations, nullptr));
  t->data()[0] = v;
  return t;
}

TEST(MessageTableTest, EachConsumerTakesOneCopyAndTheLastRemovesIt) {
  MessageTable table;
  Activation a;
  a.hidden = tensor_of(3.0f);
  table.publish(7, a, 2);
  std::optional<Activation> first = table.take<Activation>(7);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->hidden->data()[0], 3.0f);
  ASSERT_TRUE(table.leftover().has_value());
  EXPECT_EQ(*table.leftover(), 7);
  std::optional<Activation> second = table.take<Activation>(7);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->hidden, first->hidden);  // copies share the tensor
  EXPECT_FALSE(table.take<Activation>(7).has_value());
  EXPECT_FALSE(table.leftover().has_value());
}

TEST(MessageTableTest, ForwardAndBackwardMessagesOfOneNodeAreApart) {
  MessageTable table;
  Gradient g;
  g.dhidden = tensor_of(5.0f);
  table.publish(4, g, 1);
  EXPECT_FALSE(table.take<Activation>(4).has_value());
  Activation a;
  a.hidden = tensor_of(1.0f);
  table.publish(4, a, 1);
  std::optional<Gradient> got = table.take<Gradient>(4);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->dhidden->data()[0], 5.0f);
  ASSERT_TRUE(table.leftover().has_value());  // the forward message is still there
  table.clear();
  EXPECT_FALSE(table.leftover().has_value());
  EXPECT_FALSE(table.take<Activation>(4).has_value());
}

TEST(MessageTableTest, ConcurrentPublishersAndTakersLoseNothing) {
  MessageTable table;
  constexpr int kNodes = 200, kConsumers = 3;
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    for (int n = 0; n < kNodes; ++n) {
      Activation a;
      a.hidden = tensor_of(static_cast<float>(n));
      table.publish(n, a, kConsumers);
    }
  });
  std::vector<int> taken(kConsumers, 0);
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&, c] {
      for (int n = 0; n < kNodes; ++n) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (std::chrono::steady_clock::now() < give_up) {
          const std::optional<Activation> a = table.take<Activation>(n);
          if (a.has_value()) {
            if (a->hidden->data()[0] == static_cast<float>(n)) ++taken[static_cast<size_t>(c)];
            break;
          }
          std::this_thread::yield();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int c = 0; c < kConsumers; ++c) EXPECT_EQ(taken[static_cast<size_t>(c)], kNodes);
  EXPECT_FALSE(table.leftover().has_value());
}

}  // namespace
}  // namespace piper::runtime::detail
