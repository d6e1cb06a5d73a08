// Fidelity against published Blackwell-class measurements (issue 32): the rows and their sources are in
// tests/sim/fidelity_rows_blackwell.cc (shared with `make fidelity`, docs/fidelity.md "Blackwell"). Covered rows
// must lie within 15 % of the published step time by both models; open gaps are asserted to stay outside that
// band (a model change that brings one in is noticed and the row promoted) and inside [0.2, 3] (a model that
// breaks).

#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>

#include "fidelity_rows.h"

namespace piper::sim {
namespace {

constexpr double kGapLo = 0.2, kGapHi = 3.0;

void check_rows(bool large) {
  int checked = 0;
  for (const fidelity::Row& row : fidelity::blackwell_rows()) {
    if (row.slow != large) continue;
    auto r = fidelity::evaluate(row);
    ASSERT_TRUE(r.ok()) << row.name << ": " << r.status().message();
    const bool gap = row.status == fidelity::RowStatus::kOpenGap;
    std::printf("%-28s published %6.2f s  simulated %6.2f s (%.2f)  closed form %6.2f s (%.2f)  %s%s\n",
                row.name.c_str(), row.published_step_s, r->simulated_step_s, r->simulated_ratio, r->closed_form_step_s,
                r->closed_form_ratio, gap ? "OPEN GAP: " : "covered", row.note.c_str());
    if (gap) {
      EXPECT_FALSE(r->in_band()) << row.name << " is an open gap but now within 15 % by both models: make it a "
                                 << "covered row and update docs/fidelity.md";
    }
    for (const auto& [what, ratio] :
         {std::pair{"simulated", r->simulated_ratio}, std::pair{"closed form", r->closed_form_ratio}}) {
      const double lo = gap ? kGapLo : row.lo, hi = gap ? kGapHi : row.hi;
      EXPECT_GE(ratio, lo) << row.name << ": " << what << " / published = " << ratio << " (" << row.source << ")";
      EXPECT_LE(ratio, hi) << row.name << ": " << what << " / published = " << ratio << " (" << row.source << ")";
    }
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

TEST(BlackwellFidelityTest, PublishedRowsUpTo64Gpus) { check_rows(false); }
TEST(BlackwellFidelityTest, Published256GpuRows) { check_rows(true); }

// The open gaps, by row: every Blackwell row but GB300 Qwen3-235B (docs/fidelity.md lists each with its reason).
TEST(BlackwellFidelityTest, OpenGapsAreListed) {
  std::set<std::string> gaps, covered;
  for (const fidelity::Row& row : fidelity::blackwell_rows()) {
    (row.status == fidelity::RowStatus::kOpenGap ? gaps : covered).insert(row.name);
    EXPECT_EQ(row.status == fidelity::RowStatus::kOpenGap, !row.note.empty()) << row.name;
  }
  EXPECT_EQ(covered, (std::set<std::string>{"GB300 Qwen3-235B BF16"}));
  EXPECT_EQ(gaps.size(), 11u);
}

}  // namespace
}  // namespace piper::sim
