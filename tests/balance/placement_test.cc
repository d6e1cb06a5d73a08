#include "piper/balance/placement.h"

#include <gtest/gtest.h>

#include "piper/balance/greedy_repack.h"

namespace piper::balance {
namespace {

ExpertPlacement make(int experts, int ranks, int slots, int group, std::vector<int> table) {
  ExpertPlacement p;
  p.num_experts = experts;
  p.num_ranks = ranks;
  p.slots_per_rank = slots;
  p.ep_group_size = group;
  p.slot_expert = std::move(table);
  return p;
}

TEST(PlacementTest, ContiguousLayout) {
  ExpertPlacement p = ExpertPlacement::contiguous(6, 3, 3, 3).value();
  EXPECT_EQ(p.slot_expert, (std::vector<int>{0, 1, -1, 2, 3, -1, 4, 5, -1}));
  EXPECT_EQ(p.expert_rank(), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(p.expert_slot(), (std::vector<int>{0, 1, 3, 4, 6, 7}));
  EXPECT_FALSE(ExpertPlacement::contiguous(7, 3, 3, 3).ok());
  EXPECT_FALSE(ExpertPlacement::contiguous(12, 3, 3, 3).ok());
}

TEST(PlacementTest, ValidateNamesTheProblem) {
  EXPECT_TRUE(make(2, 2, 1, 2, {1, 0}).validate().ok());
  EXPECT_NE(make(2, 2, 1, 2, {1, 1}).validate().message().find("expert 1 sits in slots 0 and 1"), std::string::npos);
  EXPECT_NE(make(2, 2, 1, 2, {1, -1}).validate().message().find("expert 0 has no slot"), std::string::npos);
  EXPECT_NE(make(2, 2, 1, 2, {1, 5}).validate().message().find("holds expert 5"), std::string::npos);
  EXPECT_NE(make(2, 2, 1, 3, {1, 0}).validate().message().find("ep_group_size=3"), std::string::npos);
  EXPECT_NE(make(2, 2, 2, 2, {1, 0}).validate().message().find("slot_expert has 2 entries"), std::string::npos);
  EXPECT_FALSE(make(0, 2, 1, 2, {-1, -1}).validate().ok());
}

TEST(PlacementTest, RankTokensAndImbalance) {
  ExpertPlacement p = make(4, 2, 2, 2, {0, 3, 1, 2});
  EXPECT_EQ(rank_tokens(p, {10, 9, 1, 1}).value(), (std::vector<int64_t>{11, 10}));
  EXPECT_FALSE(rank_tokens(p, {10, 9, 1}).ok());
  EXPECT_FALSE(rank_tokens(p, {10, 9, -1, 1}).ok());
  EXPECT_DOUBLE_EQ(imbalance({11, 10}), 22.0 / 21.0);
  EXPECT_DOUBLE_EQ(imbalance({0, 0}), 1.0);
  EXPECT_DOUBLE_EQ(imbalance({}), 1.0);
  EXPECT_DOUBLE_EQ(imbalance({4, 0, 0, 0}), 4.0);
}

TEST(PlacementTest, CountMovedIgnoresSlotShufflesInsideARank) {
  ExpertPlacement a = make(4, 2, 2, 2, {0, 1, 2, 3});
  EXPECT_EQ(count_moved_experts(a, make(4, 2, 2, 2, {1, 0, 3, 2})), 0);
  EXPECT_EQ(count_moved_experts(a, make(4, 2, 2, 2, {2, 1, 0, 3})), 2);
}

TEST(PlacementTest, KeepStayersInPlace) {
  ExpertPlacement before = make(5, 2, 3, 2, {0, 1, 2, 3, 4, -1});
  // Expert 2 moves to rank 1 (listed first there); 0 and 1 stay but are listed in swapped slots.
  ExpertPlacement after = make(5, 2, 3, 2, {1, 0, -1, 2, 3, 4});
  ExpertPlacement kept = keep_stayers_in_place(before, after);
  EXPECT_EQ(kept.slot_expert, (std::vector<int>{0, 1, -1, 3, 4, 2}));
  EXPECT_EQ(count_moved_experts(after, kept), 0);
}

TEST(GreedyRepackTest, LptWithSlotLimitByHand) {
  // Heaviest first onto the least-loaded rank with a free slot: e0->r0 (10), e1->r1 (9), e2->r1 (10),
  // e3->r0 (tie 10/10 goes to the lower rank) -> r0 {0,3}=11, r1 {1,2}=10.
  ExpertPlacement cur = make(4, 2, 2, 2, {0, 1, 2, 3});
  ExpertPlacement g = greedy_repack({10, 9, 1, 1}, cur).value();
  EXPECT_EQ(g.slot_expert, (std::vector<int>{0, 3, 1, 2}));
  EXPECT_EQ(count_moved_experts(cur, g), 2);
  ExpertPlacement m = greedy_repack_min_moves({10, 9, 1, 1}, cur).value();
  EXPECT_EQ(rank_tokens(m, {10, 9, 1, 1}).value(), (std::vector<int64_t>{11, 10}));
  EXPECT_EQ(count_moved_experts(cur, m), 2);
}

TEST(GreedyRepackTest, RelabelingKeepsPacksOnTheirRanks) {
  // The packs equal the current layout with the rank labels swapped: relabeling moves nothing, raw moves all.
  ExpertPlacement cur = make(4, 2, 2, 2, {2, 3, 0, 1});
  const std::vector<int64_t> loads = {5, 1, 4, 2};
  ExpertPlacement raw = greedy_repack(loads, cur).value();
  ExpertPlacement relabeled = greedy_repack_min_moves(loads, cur).value();
  EXPECT_EQ(rank_tokens(raw, loads).value(), (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(count_moved_experts(cur, raw), 4);
  EXPECT_EQ(count_moved_experts(cur, relabeled), 0);
  EXPECT_EQ(relabeled, cur);
}

TEST(GreedyRepackTest, StaysInsideEachGroup) {
  ExpertPlacement cur = ExpertPlacement::contiguous(8, 4, 2, 2).value();
  ExpertPlacement g = greedy_repack({100, 90, 1, 1, 50, 40, 30, 20}, cur).value();
  const std::vector<int> before = cur.expert_rank(), after = g.expert_rank();
  for (int e = 0; e < 8; ++e) EXPECT_EQ(before[e] / 2, after[e] / 2) << "expert " << e;
  EXPECT_FALSE(greedy_repack({1, 2}, cur).ok());
}

}  // namespace
}  // namespace piper::balance
