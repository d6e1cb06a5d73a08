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

}  // namespace
}  // namespace piper::cli
