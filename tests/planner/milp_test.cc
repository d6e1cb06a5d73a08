// The MILP problem type and the CBC backend on problems with known optima.
#include "piper/planner/milp.h"

#include <gtest/gtest.h>

namespace piper::planner {
namespace {

using Sense = MilpProblem::Sense;

// max 8a + 11b + 6c + 4d  s.t. 5a + 7b + 4c + 3d <= 14, binary: optimum 21 at (0,1,1,1); the LP bound is 22.
MilpProblem knapsack() {
  MilpProblem p;
  const double value[] = {8, 11, 6, 4}, weight[] = {5, 7, 4, 3};
  std::vector<int> cols;
  for (int j = 0; j < 4; ++j) cols.push_back(p.add_binary("x" + std::to_string(j), -value[j]));
  p.add_row("capacity", cols, {weight[0], weight[1], weight[2], weight[3]}, Sense::kLessEqual, 14);
  return p;
}

TEST(MilpTest, ProblemChecksAndEvaluates) {
  MilpProblem p = knapsack();
  EXPECT_TRUE(p.validate().ok());
  EXPECT_DOUBLE_EQ(p.objective_of({0, 1, 1, 1}), -21);
  EXPECT_DOUBLE_EQ(p.max_violation({0, 1, 1, 1}), 0);
  EXPECT_DOUBLE_EQ(p.max_violation({1, 1, 1, 1}), 5);      // weight 19 > 14
  EXPECT_DOUBLE_EQ(p.max_violation({0, 0.5, 0, 0}), 0.5);  // not integral
  MilpProblem bad = p;
  bad.add_row("dangling", {7}, {1.0}, Sense::kLessEqual, 1);
  EXPECT_FALSE(bad.validate().ok());
  bad = p;
  bad.lower[0] = 2;
  EXPECT_FALSE(bad.validate().ok());
}

TEST(MilpTest, CbcSolvesKnapsack) {
  if (!have_cbc()) GTEST_SKIP() << "built without COIN-OR CBC";
  auto solver = make_cbc_solver();
  ASSERT_TRUE(solver.ok()) << solver.status().message();
  auto s = (*solver)->solve(knapsack());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->proven_optimal);
  EXPECT_DOUBLE_EQ(s->objective, -21);
  EXPECT_EQ(s->values, (std::vector<double>{0, 1, 1, 1}));
}

TEST(MilpTest, CbcSolvesMixedProblem) {
  if (!have_cbc()) GTEST_SKIP() << "built without COIN-OR CBC";
  // min x + y, x + 2y >= 3, 3x + y >= 4: the LP optimum is (1, 1); with y integer and x continuous still 2.
  // Adding y <= 0 forces x >= 3: objective 3.
  MilpProblem p;
  int x = p.add_column("x", 1, 0, 10, false), y = p.add_column("y", 1, 0, 10, true);
  p.add_row("a", {x, y}, {1, 2}, Sense::kGreaterEqual, 3);
  p.add_row("b", {x, y}, {3, 1}, Sense::kGreaterEqual, 4);
  auto solver = make_cbc_solver();
  ASSERT_TRUE(solver.ok());
  auto s = (*solver)->solve(p);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(s->objective, 2, 1e-9);
  p.add_row("c", {y}, {1}, Sense::kLessEqual, 0);
  s = (*solver)->solve(p);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(s->objective, 3, 1e-9);
  EXPECT_LE(p.max_violation(s->values), 1e-9);
}

TEST(MilpTest, CbcReportsInfeasibleAndInvalidProblems) {
  if (!have_cbc()) GTEST_SKIP() << "built without COIN-OR CBC";
  auto solver = make_cbc_solver();
  ASSERT_TRUE(solver.ok());
  MilpProblem p;
  int x = p.add_binary("x", 1), y = p.add_binary("y", 1);
  p.add_row("both", {x, y}, {1, 1}, Sense::kEqual, 1);
  p.add_row("neither", {x, y}, {1, 1}, Sense::kLessEqual, 0);
  auto s = (*solver)->solve(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  MilpProblem empty;
  s = (*solver)->solve(empty);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(make_cbc_solver(0).ok());
}

}  // namespace
}  // namespace piper::planner
