#include "piper/balance/load_monitor.h"

#include <gtest/gtest.h>

#include "piper/balance/planner.h"

namespace piper::balance {
namespace {

// One layer, 4 experts on 2 ranks (experts 0,1 on rank 0; 2,3 on rank 1).
LoadMonitor two_rank_monitor(int window) {
  return LoadMonitor::create({ExpertPlacement::contiguous(4, 2, 2, 2).value()}, window).value();
}

TEST(LoadMonitorTest, WindowSumsAndRolls) {
  LoadMonitor m = two_rank_monitor(2);
  ASSERT_TRUE(m.record_step({{1, 2, 3, 4}}).ok());
  ASSERT_TRUE(m.record_step({{10, 0, 0, 0}}).ok());
  LayerLoadStats s = m.layer_stats(0);
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.expert_tokens, (std::vector<int64_t>{11, 2, 3, 4}));
  EXPECT_EQ(s.rank_tokens, (std::vector<int64_t>{13, 7}));
  EXPECT_DOUBLE_EQ(s.imbalance, 13.0 / 10.0);
  EXPECT_EQ(s.last_step_rank_tokens, (std::vector<int64_t>{10, 0}));
  EXPECT_DOUBLE_EQ(s.last_step_imbalance, 2.0);
  EXPECT_DOUBLE_EQ(s.mean_step_imbalance, (7.0 / 5.0 + 2.0) / 2);
  ASSERT_TRUE(m.record_step({{0, 0, 5, 5}}).ok());  // the first step leaves the window
  s = m.layer_stats(0);
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(m.steps_recorded(), 3);
  EXPECT_EQ(s.expert_tokens, (std::vector<int64_t>{10, 0, 5, 5}));
  EXPECT_DOUBLE_EQ(s.imbalance, 1.0);
  EXPECT_DOUBLE_EQ(m.max_imbalance(), 1.0);
}

TEST(LoadMonitorTest, NewPlacementChangesRankAccountingAtOnce) {
  LoadMonitor m = two_rank_monitor(4);
  ASSERT_TRUE(m.record_step({{6, 6, 0, 0}}).ok());
  EXPECT_DOUBLE_EQ(m.layer_stats(0).imbalance, 2.0);
  ExpertPlacement swapped = m.placement(0);
  std::swap(swapped.slot_expert[1], swapped.slot_expert[2]);  // experts 1 and 2 trade ranks
  ASSERT_TRUE(m.set_placement(0, swapped).ok());
  EXPECT_DOUBLE_EQ(m.layer_stats(0).imbalance, 1.0);
  EXPECT_DOUBLE_EQ(m.layer_stats(0).mean_step_imbalance, 2.0);  // the recorded step kept its own placement
  ASSERT_TRUE(m.record_step({{6, 6, 0, 0}}).ok());
  EXPECT_DOUBLE_EQ(m.layer_stats(0).last_step_imbalance, 1.0);
}

TEST(LoadMonitorTest, SeveralLayersAreIndependent) {
  LoadMonitor m =
      LoadMonitor::create(
          {ExpertPlacement::contiguous(4, 2, 2, 2).value(), ExpertPlacement::contiguous(2, 2, 1, 2).value()}, 3)
          .value();
  ASSERT_TRUE(m.record_step({{1, 1, 1, 1}, {9, 1}}).ok());
  EXPECT_DOUBLE_EQ(m.layer_stats(0).imbalance, 1.0);
  EXPECT_DOUBLE_EQ(m.layer_stats(1).imbalance, 1.8);
  EXPECT_DOUBLE_EQ(m.max_imbalance(), 1.8);
}

TEST(LoadMonitorTest, PlanEveryLayerAndApply) {
  // Layer 0 balanced, layer 1 with its two hot experts on rank 0: only layer 1 moves, and applying its plan
  // balances the monitor's view at once.
  LoadMonitor m =
      LoadMonitor::create(
          {ExpertPlacement::contiguous(4, 2, 2, 2).value(), ExpertPlacement::contiguous(4, 2, 2, 2).value()}, 8)
          .value();
  MigrationCost cost;
  cost.bytes_per_expert = 1e6;
  cost.link_bw_bytes_per_s = 1e12;
  cost.steps_next_window = 100;
  cost.time_per_token_s = 1e-6;
  std::vector<MigrationPlan> none = plan_layers(m, cost).value();
  ASSERT_EQ(none.size(), 2u);
  EXPECT_EQ(none[1].reason, "no steps recorded");
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(m.record_step({{5, 5, 5, 5}, {10, 9, 1, 1}}).ok());
  std::vector<MigrationPlan> plans = plan_layers(m, cost).value();
  EXPECT_TRUE(plans[0].moves.empty());
  EXPECT_EQ(plans[0].reason, "balanced");
  ASSERT_EQ(plans[1].moves.size(), 2u);
  ASSERT_TRUE(m.set_placement(1, plans[1].placement).ok());
  EXPECT_DOUBLE_EQ(m.layer_stats(1).imbalance, 22.0 / 21.0);
  MigrationCost bad = cost;
  bad.link_bw_bytes_per_s = -1;
  EXPECT_NE(plan_layers(m, bad).status().message().find("layer 0"), std::string::npos);
}

TEST(LoadMonitorTest, BadInputsAreErrorsAndRecordNothing) {
  EXPECT_FALSE(LoadMonitor::create({}, 4).ok());
  EXPECT_FALSE(LoadMonitor::create({ExpertPlacement::contiguous(4, 2, 2, 2).value()}, 0).ok());
  LoadMonitor m = two_rank_monitor(4);
  EXPECT_NE(m.record_step({{1, 2, 3}}).message().find("layer 0"), std::string::npos);
  EXPECT_FALSE(m.record_step({{1, 2, 3, 4}, {1}}).ok());
  EXPECT_FALSE(m.record_step({{1, -2, 3, 4}}).ok());
  EXPECT_EQ(m.steps_recorded(), 0);
  EXPECT_FALSE(m.set_placement(1, m.placement(0)).ok());
  EXPECT_FALSE(m.set_placement(0, ExpertPlacement::contiguous(4, 4, 1, 4).value()).ok());
}

}  // namespace
}  // namespace piper::balance
