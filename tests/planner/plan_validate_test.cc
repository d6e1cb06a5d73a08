// `piper plan --validate`'s statistics (src/cli/plan_validate.h): Kendall's tau and which plans are trained.
#include "piper/cli/plan_validate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace piper::cli {
namespace {

TEST(PlanValidateTest, KendallTauOfAgreeingReversedAndMixedOrders) {
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(kendall_tau({1, 2, 3, 4}, {40, 30, 20, 10}), -1.0);
  // Pairs (1,2) (1,3) (2,3): concordant, concordant, discordant -> (2 - 1) / 3.
  EXPECT_NEAR(kendall_tau({1, 2, 3}, {1, 3, 2}), 1.0 / 3.0, 1e-15);
  // tau-b: one tie in the first sample; 2 concordant pairs, 0 discordant, 1 tie -> 2 / sqrt(2 * 3).
  EXPECT_NEAR(kendall_tau({1, 1, 2}, {1, 2, 3}), 2.0 / std::sqrt(6.0), 1e-15);
  EXPECT_DOUBLE_EQ(kendall_tau({1}, {1}), 0.0);
  EXPECT_DOUBLE_EQ(kendall_tau({}, {}), 0.0);
}

TEST(PlanValidateTest, PicksTheTopAndAsManyFromTheRestSeeded) {
  const std::vector<int> a = pick_validation_plans(30, 3, 1);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a[0], 0);
  EXPECT_EQ(a[1], 1);
  EXPECT_EQ(a[2], 2);
  for (size_t i = 3; i < a.size(); ++i) {
    EXPECT_GE(a[i], 3);
    EXPECT_LT(a[i], 30);
    EXPECT_LT(a[i - 1], a[i]);  // sorted, no repeats
  }
  EXPECT_EQ(pick_validation_plans(30, 3, 1), a);  // same seed, same draw
  EXPECT_EQ(pick_validation_plans(4, 3, 1), (std::vector<int>{0, 1, 2, 3}));  // fewer than 2k: all
  EXPECT_EQ(pick_validation_plans(2, 3, 1), (std::vector<int>{0, 1}));
}

// One rank of a `piper train --json` prediction report.
Json rank_json(double measured_step, double measured_peak, double simulated_peak) {
  return Json{{"measured", {{"step_time_s", measured_step}, {"peak_memory_bytes", measured_peak}}},
              {"simulated", {{"step_time_s", 0.1}, {"peak_memory_bytes", simulated_peak}}}};
}

TEST(PlanValidateTest, ARunsOwnLoadsSimulationIsPreferredAndItsWorstRankNamed) {
  Json report;
  report["predicted_vs_measured"] = {{"simulated_step_time_s", 0.080},
                                     {"ranks", {rank_json(0.1, 100, 100), rank_json(0.12, 140, 100)}}};
  ValidatedPlan balanced;
  ASSERT_TRUE(read_train_report(report, &balanced).ok());
  EXPECT_FALSE(balanced.run_own_loads);
  EXPECT_DOUBLE_EQ(balanced.run_sim_step_s, 0.080);
  EXPECT_DOUBLE_EQ(balanced.measured_step_s, 0.12);  // the slowest rank
  EXPECT_DOUBLE_EQ(balanced.measured_peak_bytes, 140);
  EXPECT_DOUBLE_EQ(balanced.run_sim_peak_bytes, 100);
  EXPECT_DOUBLE_EQ(balanced.worst_memory_ratio, 1.4);

  // With the run's own loads the busy rank is simulated at its own peak; the rank furthest from 1 is now the one
  // simulated 25 % high (|log 0.8| > |log 1.05|).
  report["predicted_vs_measured_own_expert_loads"] = {{"simulated_step_time_s", 0.095},
                                                      {"ranks", {rank_json(0.1, 100, 125), rank_json(0.12, 140, 133)}}};
  ValidatedPlan own;
  ASSERT_TRUE(read_train_report(report, &own).ok());
  EXPECT_TRUE(own.run_own_loads);
  EXPECT_DOUBLE_EQ(own.run_sim_step_s, 0.095);
  EXPECT_DOUBLE_EQ(own.run_sim_peak_bytes, 133);
  EXPECT_DOUBLE_EQ(own.worst_memory_ratio, 0.8);
  EXPECT_DOUBLE_EQ(own.measured_peak_bytes, 140);

  ValidatedPlan none;
  const Status missing = read_train_report(Json{{"predicted_vs_measured", {{"ranks", Json::array()}}}}, &none);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("no predicted_vs_measured ranks"), std::string::npos) << missing.message();
}

}  // namespace
}  // namespace piper::cli
