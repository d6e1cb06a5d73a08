// Pipeline bubbles and in-flight activations per schedule (reference: /work/shared/reference/schedules.md).
#include "piper/cost/pipeline_model.h"

#include <gtest/gtest.h>

namespace piper::cost {
namespace {

// Unit-time makespans of p = 4, m = 8 with T_F = 1, T_I = T_W = 1 (schedules.md §3.9, from a dependency-only
// simulation of the worked orders): ideal 24; GPipe 33, 1F1B 33, ZB-H1 27, interleaved v=2 28.5, DualPipeV 27.
TEST(PipelineModelTest, UnitMakespans) {
  struct Row {
    ScheduleKind kind;
    int v;
    double makespan;
  };
  const Row rows[] = {{ScheduleKind::kGPipe, 1, 33},       {ScheduleKind::k1F1B, 1, 33},
                      {ScheduleKind::kZBH1, 1, 27},        {ScheduleKind::kInterleaved, 2, 28.5},
                      {ScheduleKind::kDualPipeV, 2, 27}};
  for (const auto& row : rows) {
    double busy = 8 * (1.0 + 2.0);
    EXPECT_DOUBLE_EQ(busy + bubble_time_s(row.kind, 4, row.v, 1.0, 2.0, 1.0), row.makespan) << to_string(row.kind);
  }
}

// Bubble fractions: GPipe/1F1B (p-1)/(m+p-1) (Narayanan et al., SC'21); interleaved divides the bubble by v;
// ZB-H1 is a third of 1F1B's when T_F = T_I = T_W (Qi et al., arXiv:2401.10241).
TEST(PipelineModelTest, BubbleFractions) {
  struct Row {
    int p, m;
    double expected;
  };
  const Row rows[] = {{4, 8, 3.0 / 11}, {8, 32, 7.0 / 39}, {16, 64, 15.0 / 79}, {2, 2, 1.0 / 3}};
  for (const auto& row : rows) {
    EXPECT_NEAR(bubble_fraction(ScheduleKind::k1F1B, row.p, row.m, 1, 1, 2, 1), row.expected, 1e-12);
    EXPECT_NEAR(bubble_fraction(ScheduleKind::kGPipe, row.p, row.m, 1, 1, 2, 1), row.expected, 1e-12);
  }
  EXPECT_NEAR(bubble_time_s(ScheduleKind::kInterleaved, 8, 4, 1, 2, 1), 7.0 * 3 / 4, 1e-12);
  EXPECT_NEAR(bubble_time_s(ScheduleKind::kZBH1, 8, 1, 1, 2, 1), bubble_time_s(ScheduleKind::k1F1B, 8, 1, 1, 2, 1) / 3,
              1e-12);
  // W larger than F + I: the zero-bubble formula would go negative; it clamps to no bubble.
  EXPECT_DOUBLE_EQ(bubble_time_s(ScheduleKind::kZBH1, 4, 1, 0.1, 2.0, 1.5), 0.0);
  EXPECT_DOUBLE_EQ(bubble_time_s(ScheduleKind::k1F1B, 1, 1, 1, 2, 1), 0.0);
}

// In-flight microbatches: 1F1B rank r holds p - r (Narayanan et al.); interleaved rank 0 holds
// (1 + (p-1)/(p v)) x the 1F1B peak (Korthikanti et al. §4.2.3 / Megatron's memory model); GPipe holds all m;
// DualPipeV holds PP + 1 = 2p + 1 half-stage units (DualPipe README).
TEST(PipelineModelTest, InFlight) {
  for (int r = 0; r < 4; ++r) EXPECT_EQ(in_flight_units(ScheduleKind::k1F1B, 4, 8, 1, r), 4 - r);
  EXPECT_EQ(in_flight_units(ScheduleKind::k1F1B, 4, 2, 1, 0), 2);  // capped by m
  EXPECT_EQ(in_flight_units(ScheduleKind::kGPipe, 4, 8, 1, 3), 8);
  const int p = 8, v = 4;
  double units = in_flight_units(ScheduleKind::kInterleaved, p, 64, v, 0);
  EXPECT_DOUBLE_EQ(units / v, p * (1.0 + (p - 1.0) / (p * v)));  // layers-worth relative to one chunk per rank
  EXPECT_EQ(in_flight_units(ScheduleKind::kDualPipeV, 16, 64, 2, 5), 33);
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(chunk_in_flight_units(ScheduleKind::kDualPipeV, 16, 64, 2, r, 0) +
                  chunk_in_flight_units(ScheduleKind::kDualPipeV, 16, 64, 2, r, 1),
              33);
  }
  EXPECT_EQ(chunk_in_flight_units(ScheduleKind::kDualPipeV, 16, 64, 2, 0, 1), 1);  // rank 0's head chunk
  EXPECT_EQ(chunk_in_flight_units(ScheduleKind::kInterleaved, 4, 8, 2, 0, 1), in_flight_units(ScheduleKind::kInterleaved, 4, 8, 2, 0) / 2);
  // ZB-H1 keeps a stash until its W: rank 1 has run 4 forwards and no W when its first W comes (schedules.md
  // 3.4: 1F0 1F1 1F2 1I0 1F3 1I1 1W0), with 2 microbatches' B -> W gradients alive.
  EXPECT_EQ(in_flight_units(ScheduleKind::kZBH1, 4, 8, 1, 1), 4);
  EXPECT_EQ(deferred_w_units(ScheduleKind::kZBH1, 4, 8, 1), 2);
  EXPECT_EQ(deferred_w_units(ScheduleKind::kZBH1, 4, 2, 3), 2);
  EXPECT_EQ(deferred_w_units(ScheduleKind::k1F1B, 4, 8, 1), 0);
  EXPECT_EQ(stage_of_chunk(ScheduleKind::kDualPipeV, 4, 2, 1, 1), 6);
  EXPECT_EQ(stage_of_chunk(ScheduleKind::kInterleaved, 4, 2, 1, 1), 5);
}

}  // namespace
}  // namespace piper::cost
