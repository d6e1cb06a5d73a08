// Optimizer::shard / update_range: ZeRO's sharded AdamW state gives the same bits as the whole optimizer, and
// holds only the shard's moments.
#include "piper/runtime/model/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "reference_step.h"

namespace piper::runtime::testing {
namespace {

int64_t trainable(const Chunk& c) {
  int64_t n = 0;
  for (const Param& p : c.params()) n += p.trainable ? p.value.numel() : 0;
  return n;
}

void set_grads(Model& m, int step) {
  for (Param* p : m.params()) {
    if (!p->trainable) continue;
    for (int64_t i = 0; i < p->grad.numel(); ++i) {
      p->grad.data()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + step + p->name.size()));
    }
  }
}

// Three "ranks" each own a third of every chunk's flat elements: ranks 0 and 1 update through the parameters'
// own tensors (ZeRO-1/2), rank 2 through a shard gradient and shard value tensors (ZeRO-3).
TEST(OptimizerShard, ShardsGiveTheWholeOptimizersBits) {
  constexpr int kRanks = 3;
  const ModelSpec spec = small_moe_spec(true);
  MemoryTracker whole_tracker;
  TrackingAllocator whole_alloc(&whole_tracker);
  auto a = Model::create(spec, {}, 5, &whole_alloc).value();
  auto b = Model::create(spec, {}, 5, &whole_alloc).value();
  Optimizer whole(OptimizerSpec{}, 0, *a, &whole_alloc);
  MemoryTracker trackers[kRanks];
  std::vector<std::unique_ptr<TrackingAllocator>> allocs;
  std::vector<std::unique_ptr<Optimizer>> ranks;
  auto range = [&](const Chunk& c, int r) {
    const int64_t n = trainable(c), per = (n + kRanks - 1) / kRanks;
    return std::make_pair(std::min(n, per * r), std::min(n, per * (r + 1)));
  };
  int64_t expected_bytes[kRanks] = {0, 0, 0};
  for (int r = 0; r < kRanks; ++r) {
    allocs.push_back(std::make_unique<TrackingAllocator>(&trackers[r]));
    ranks.push_back(std::make_unique<Optimizer>(OptimizerSpec{}, 0, *b, allocs.back().get()));
    for (const auto& c : b->chunks()) {
      const auto [lo, hi] = range(*c, r);
      ranks.back()->shard(*c, lo, hi);
      expected_bytes[r] += 2 * (hi - lo) * static_cast<int64_t>(sizeof(float));
    }
    // Only the shard's moments stay allocated.
    EXPECT_EQ(trackers[r].stats().live_bytes[static_cast<size_t>(MemCategory::kOptimizer)], expected_bytes[r]);
  }
  EXPECT_EQ(expected_bytes[0] + expected_bytes[1] + expected_bytes[2],
            whole_tracker.stats().live_bytes[static_cast<size_t>(MemCategory::kOptimizer)]);
  for (int step = 1; step <= 3; ++step) {
    set_grads(*a, step);
    set_grads(*b, step);
    whole.begin_step_with_norm(2.5);
    for (auto& o : ranks) o->begin_step_with_norm(2.5);
    for (const auto& c : a->chunks()) whole.update(*c);
    for (const auto& c : b->chunks()) {
      for (int r = 0; r < 2; ++r) {
        const auto [lo, hi] = range(*c, r);
        ranks[static_cast<size_t>(r)]->update_range(*c, lo, hi);
      }
      // Rank 2: the flat gradient shard and per-parameter value shards, copied back after the update.
      const auto [lo, hi] = range(*c, 2);
      std::vector<float> grad;
      std::vector<Tensor> values;
      std::vector<std::pair<Param*, int64_t>> where;
      int64_t offset = 0;
      for (Param& p : c->params()) {
        if (!p.trainable) continue;
        const int64_t n = p.value.numel(), s = std::max(lo, offset), e = std::max(s, std::min(hi, offset + n));
        grad.insert(grad.end(), p.grad.data() + (s - offset), p.grad.data() + (e - offset));
        values.push_back(Tensor::zeros_or_die({e - s}, MemCategory::kParameters));
        std::copy(p.value.data() + (s - offset), p.value.data() + (e - offset), values.back().data());
        where.emplace_back(&p, s - offset);
        offset += n;
      }
      ranks[2]->update_range(*c, lo, hi, grad.data(), &values);
      for (size_t i = 0; i < values.size(); ++i) {
        std::copy(values[i].data(), values[i].data() + values[i].numel(),
                  where[i].first->value.data() + where[i].second);
      }
    }
  }
  const auto pa = a->params(), pb = b->params();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(std::memcmp(pa[i]->value.data(), pb[i]->value.data(), static_cast<size_t>(pa[i]->value.nbytes())), 0)
        << pa[i]->name;
  }
  // The state says which elements each rank holds: together every element once.
  std::map<std::string, int64_t> covered;
  for (auto& o : ranks) {
    for (const Optimizer::StateTensor& st : o->state()) {
      EXPECT_EQ(st.tensor->numel(), st.end - st.begin) << st.name;
      covered[st.name] += st.end - st.begin;
    }
  }
  for (const Optimizer::StateTensor& st : whole.state()) EXPECT_EQ(covered[st.name], st.tensor->numel()) << st.name;
}

}  // namespace
}  // namespace piper::runtime::testing
