// Megatron-Core dense GPT on H100 (Megatron-LM README model table, core r0.8.0; rows and sources:
// tests/sim/fidelity_rows.cc; every row with its numbers: docs/fidelity.md, `make fidelity`).
//
// Regression rows within +-15 % of the published step time, simulated and in closed form; open gaps (1.7B, 7.1B,
// 16B: H100 compute beyond the GEMM and attention kernels, docs/simulator.md) asserted to stay outside.

#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>

#include "fidelity_rows.h"

namespace piper::sim {
namespace {

using fidelity::RowStatus;

void check_rows(bool slow) {
  int checked = 0;
  for (const fidelity::Row& row : fidelity::mcore_h100_rows()) {
    if (row.slow != slow) continue;
    auto r = fidelity::evaluate(row);
    ASSERT_TRUE(r.ok()) << row.name << ": " << r.status().message();
    std::printf("%-5s published %6.3f s  simulated %6.3f s (%.3f)  closed form %6.3f s (%.3f)  %s\n",
                row.name.c_str(), row.published_step_s, r->simulated_step_s, r->simulated_ratio,
                r->closed_form_step_s, r->closed_form_ratio, fidelity::row_status_name(row.status));
    if (row.status == RowStatus::kRegression) {
      EXPECT_TRUE(r->in_band()) << row.name << ": simulated / published = " << r->simulated_ratio
                                << ", closed form / published = " << r->closed_form_ratio << ", band [" << row.lo
                                << ", " << row.hi << "] (" << row.source << ")";
    } else if (row.status == RowStatus::kOpenGap) {
      EXPECT_FALSE(r->in_band()) << row.name << " is listed as an open gap but is now within [" << row.lo << ", "
                                 << row.hi << "] by both models: make it a regression row and update docs/fidelity.md";
    }
    EXPECT_TRUE(r->fits) << row.name << ": the published run fitted in 80 GB";
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(McoreFidelityTest, PublishedH100DenseRowsWithinTheirBands) { check_rows(false); }
TEST(McoreFidelityTest, PublishedH100DenseLargeRowsWithinTheirBands) { check_rows(true); }

TEST(McoreFidelityTest, OpenGapsAreListed) {
  std::set<std::string> gaps;
  for (const fidelity::Row& row : fidelity::mcore_h100_rows()) {
    if (row.status == RowStatus::kOpenGap) gaps.insert(row.name);
  }
  EXPECT_EQ(gaps, (std::set<std::string>{"1.7B", "7.1B", "16B"}));
}

}  // namespace
}  // namespace piper::sim
