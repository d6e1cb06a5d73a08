// Calibration::expert_call_*_s (the routed experts' fixed cost per expert call, cli/calibrate_experts.h): the
// simulator and the closed form charge it once per local expert with rows, per microbatch and task, so at a fixed
// global batch the experts' time grows with the microbatch count when the figure is set and does not when it is 0;
// expert_row_*_s once per row, the same at any microbatch count.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "piper/base/check.h"
#include "piper/cost/estimate.h"
#include "piper/cost/layer_cost.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::sim {
namespace {

TrainSpec fp32_train(int mbs) {
  TrainSpec t;
  t.seq_len = 128;
  t.global_batch = 16;
  t.micro_batch_size = mbs;
  t.param_dtype = t.grad_dtype = t.master_dtype = DType::kFP32;
  t.optimizer_dtype = t.activation_dtype = DType::kFP32;
  return t;
}

TEST(ExpertCallTest, ExpectedExpertsWithRows) {
  EXPECT_EQ(cost::experts_with_rows(8, 0), 0);
  EXPECT_EQ(cost::experts_with_rows(1, 3), 1);
  EXPECT_DOUBLE_EQ(cost::experts_with_rows(8, 1), 1);              // one row: one expert
  EXPECT_NEAR(cost::experts_with_rows(8, 2), 1 + 7.0 / 8, 1e-12);  // the second row hits another 7 times in 8
  EXPECT_NEAR(cost::experts_with_rows(8, 256), 8, 1e-9);           // tiny-moe, one sequence: every expert
}

// tiny-moe on one rank of local-cpu, global batch 16 of 128 tokens, in 1 microbatch of 16 and 16 of 1: 3 MoE layers
// of 8 experts, every expert receiving rows (32 or 512 each), so the figure adds M x 24 x (F + B + W) a step.
TEST(ExpertCallTest, ExpertsTimeGrowsWithMicrobatchesOnlyWithTheFigure) {
  const ModelSpec m = load_model("tiny-moe").value();
  ClusterSpec c = load_cluster("local-cpu", 1).value();
  c.node.devices_per_node = 1;  // `piper train --ranks 1`
  // One core of the build machine as `piper calibrate` measured it (16:41 UTC, session 31), without the figure:
  // 114 GFLOP/s on a curve flat down to 8 rows (d / (d + 0.45)), 18.3 GB/s.
  cost::Calibration none;
  none.workspace_bytes = 0;
  none.peak_flops_fp32 = 1.137e11;
  none.gemm_efficiency = 1;
  none.gemm_half_dim = 0.45;
  none.gemm_table = false;
  none.memory_bw_bytes_per_s = 1.83e10;
  none.memory_bw_efficiency = 1;
  cost::Calibration set = none;
  set.expert_call_forward_s = 20e-6;
  set.expert_call_backward_input_s = 25e-6;
  set.expert_call_backward_weight_s = 15e-6;
  const double per_microbatch = m.num_moe_layers() * m.moe.num_experts * 60e-6;  // 24 calls of each task
  ASSERT_EQ(m.num_moe_layers(), 3);
  struct Step {
    double sim = 0, closed = 0;
  };
  auto step = [&](int microbatches, const cost::Calibration& cal) {
    const int mbs = 16 / microbatches;
    const Strategy s =
        Strategy::parse("microbatches=" + std::to_string(microbatches) + ",mbs=" + std::to_string(mbs)).value();
    const TrainSpec t = fp32_train(mbs);
    auto r = simulate(m, c, t, s, cal);
    PIPER_CHECK_OK(r.status());
    auto e = cost::CostModel::create(m, c, t, cal).value().estimate(s);
    PIPER_CHECK_OK(e.status());
    return Step{r->step_time_s, e->step_time_s};
  };
  const Step one0 = step(1, none), many0 = step(16, none), one1 = step(1, set), many1 = step(16, set);
  // Without the figure the 16 small microbatches cost within a few per cent of the one large one (the flat GEMM
  // curve; the weights read once per microbatch), as the simulation said before session 31 (161-162 ms for 1-16).
  EXPECT_LT(std::abs(many0.sim / one0.sim - 1), 0.03) << one0.sim << " " << many0.sim;
  // With it: one rank computes alone (rate share 1), so each microbatch adds exactly its calls.
  EXPECT_NEAR(one1.sim - one0.sim, per_microbatch, 1e-3 * per_microbatch);
  EXPECT_NEAR(many1.sim - many0.sim, 16 * per_microbatch, 1e-3 * 16 * per_microbatch);
  EXPECT_GT(many1.sim - one1.sim, many0.sim - one0.sim + 14 * per_microbatch);
  // The closed form prices the experts through the same part cost: the same terms.
  EXPECT_NEAR(one1.closed - one0.closed, per_microbatch, 1e-3 * per_microbatch);
  EXPECT_NEAR(many1.closed - many0.closed, 16 * per_microbatch, 1e-3 * 16 * per_microbatch);
  // The per-row figures add the same at any microbatch count: 3 layers x 16 x 128 tokens x 2 rows a step.
  cost::Calibration rows = none;
  rows.expert_row_forward_s = 1e-7;
  rows.expert_row_backward_input_s = 2e-7;
  rows.expert_row_backward_weight_s = 3e-7;
  const double per_step = 3 * 16 * 128 * 2 * 6e-7;
  const Step one2 = step(1, rows), many2 = step(16, rows);
  EXPECT_NEAR(one2.sim - one0.sim, per_step, 1e-3 * per_step);
  EXPECT_NEAR(many2.sim - many0.sim, per_step, 1e-3 * per_step);
  EXPECT_NEAR(many2.closed - many0.closed, per_step, 1e-3 * per_step);
}

// Two experts' worth of rows per microbatch on 8 experts: only the experts expected to receive rows are charged.
TEST(ExpertCallTest, OnlyExpertsWithRowsAreCharged) {
  cost::PartTable t;
  t.hidden = 128;
  t.top_k = 2;
  t.num_experts = 8;
  t.expert_width = 256;
  t.expert_params = 3 * 128 * 256;
  cost::PartShape s;
  s.tokens = 1;  // 2 rows
  s.expert_call_s[0] = 1e-5;
  s.expert_call_s[1] = 2e-5;
  s.expert_call_s[2] = 3e-5;
  const cost::PartCost c = cost::part_cost(t, cost::Part::kExperts, s);
  EXPECT_NEAR(c.f.fixed_s, (1 + 7.0 / 8) * 1e-5, 1e-15);
  EXPECT_NEAR(c.w.fixed_s, (1 + 7.0 / 8) * 3e-5, 1e-15);
  s.ep = 8;  // one local expert: charged once whatever its rows
  EXPECT_NEAR(cost::part_cost(t, cost::Part::kExperts, s).b.fixed_s, 2e-5, 1e-15);
  // Every other part carries no fixed cost.
  EXPECT_EQ(cost::part_cost(t, cost::Part::kRouter, s).f.fixed_s, 0);
}

// The figures are measured at one expert shape (H, F) and scaled to the model's: per call by the expert slice's
// weights (h f / etp over H F), per row by its width ((h + f / etp) / (H + F)).
TEST(ExpertCallTest, FiguresScaleByTheExpertShape) {
  cost::PartTable t;
  t.hidden = 512;
  t.top_k = 2;
  t.num_experts = 8;
  t.expert_width = 512;
  t.expert_params = 3 * 512 * 512;
  cost::PartShape s;
  s.tokens = 1;  // 2 rows, 1 + 7/8 experts with rows
  s.expert_call_s[0] = 1e-5;
  s.expert_row_s[0] = 1e-7;
  const double unscaled = cost::part_cost(t, cost::Part::kExperts, s).f.fixed_s;
  EXPECT_NEAR(unscaled, (1 + 7.0 / 8) * 1e-5 + 2 * 1e-7, 1e-15);  // no shape: as they are
  s.expert_shape_hidden = 128;
  s.expert_shape_ffn = 256;
  EXPECT_NEAR(cost::part_cost(t, cost::Part::kExperts, s).f.fixed_s,
              (1 + 7.0 / 8) * 1e-5 * 8 + 2 * 1e-7 * (512.0 + 512) / (128 + 256), 1e-15);
  // Two slices of each expert: each reads half the weights and computes half the width of all the rows.
  s.etp = 2;
  const double rows = 4;  // the etp group's rows, gathered
  const double calls = 8 * (1 - std::pow(7.0 / 8, rows));
  EXPECT_NEAR(cost::part_cost(t, cost::Part::kExperts, s).f.fixed_s,
              calls * 1e-5 * 4 + rows * 1e-7 * (512.0 + 256) / (128 + 256), 1e-15);
}

// A fixed cost is measured on one thread of a whole core: a rank runs it at its share of one core,
// min(1, device_cores x rate_share), as its copies are.
TEST(ExpertCallTest, FixedCostsStretchByTheRanksCoreShare) {
  const cost::Calibration cal;
  EXPECT_DOUBLE_EQ(cost::DeviceModel(DeviceSpec{}, DType::kFP32, cal, 1.0).fixed_time_s(1e-5), 1e-5);
  EXPECT_DOUBLE_EQ(cost::DeviceModel(DeviceSpec{}, DType::kFP32, cal, 0.25, 2.0).fixed_time_s(1e-5), 2e-5);
  EXPECT_DOUBLE_EQ(cost::DeviceModel(DeviceSpec{}, DType::kFP32, cal, 0.5, 4.0).fixed_time_s(1e-5), 1e-5);
}

}  // namespace
}  // namespace piper::sim
