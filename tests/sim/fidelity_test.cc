// Fidelity against published measurements: one row per configuration, the source on every row.
//
// Megatron-LM weak scaling (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
// Using Megatron-LM", SC'21, arXiv:2104.04473, Table 1): GPT models, vocabulary 51,200, sequence 2,048, on DGX
// A100 80 GB nodes (Selene), tensor parallelism inside a node, pipeline parallelism across nodes, data
// parallelism for the rest, full activation recomputation, mixed precision. "Achieved teraFLOP/s per GPU"
// counts the paper's FLOPs per iteration (their Eq. 3, recomputation included):
//   F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))
// divided by the measured step time and the GPU count. All ten rows, every column checked against public
// transcriptions of the table (docs/simulator.md, "Fidelity", names them) and against the parameter counts
// the columns imply.
//
// Software of 2021, in the calibration (src/cost/device_model.h documents both):
//   attention_score_bytes = 13            the attention materialised its s x s scores (no FlashAttention);
//   recompute_reruns_tp_collectives       full recomputation re-ran whole layers, tp all-reduces included.
//   p2p_blocking, p2p_scatter_gather      every pipeline send/recv waited for, 1/tp per rank + tp all-gather;
//   dp_reduce_after_backward              --DDP-impl local on the pipelined rows (torch DDP on pp = 1).
// The cluster is the dgx-a100 preset, with NVLink at NCCL's effective 240 GB/s (configs/clusters/dgx-a100.json).
// The rows (tests/sim/fidelity_rows.cc, shared with `make fidelity`) run as the published script ran them:
// Megatron-LM examples/sc21/run_table_1.sh (micro batch sizes, the interleaved schedule on four rows).

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <set>
#include <string>

#include "fidelity_rows.h"
#include "piper/cost/estimate.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::sim {
namespace {

struct Loaded {
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
  Strategy strategy;
};

Loaded load(const fidelity::Row& row) {
  Loaded l;
  auto m = load_model(row.model);
  EXPECT_TRUE(m.ok()) << m.status().message();
  l.model = *m;
  auto c = load_cluster(row.cluster, row.nodes);
  EXPECT_TRUE(c.ok()) << c.status().message();
  l.cluster = *c;
  auto s = Strategy::parse(row.strategy);
  EXPECT_TRUE(s.ok()) << s.status().message();
  l.strategy = *s;
  l.train.seq_len = row.seq_len;
  l.train.global_batch = row.global_batch;
  l.train.micro_batch_size = l.strategy.mbs;
  return l;
}

// SC'21 rows run as published (docs/fidelity.md). Regression rows: simulated and closed form within +-10 % of the
// published TFLOP/s (the band on the step time is [1/1.1, 1/0.9]). Open gaps (the interleaved rows): asserted to
// be still outside, so a model change that brings one in is noticed.
void expect_rows_within_band(bool slow) {
  int checked = 0;
  for (const fidelity::Row& row : fidelity::sc21_rows()) {
    if (row.slow != slow) continue;
    auto r = fidelity::evaluate(row);
    ASSERT_TRUE(r.ok()) << row.name << ": " << r.status().message();
    std::printf("%-9s simulated %.3f (TFLOP/s x%.3f), closed form %.3f (x%.3f), %s\n", row.name.c_str(),
                r->simulated_ratio, 1 / r->simulated_ratio, r->closed_form_ratio, 1 / r->closed_form_ratio,
                fidelity::row_status_name(row.status));
    EXPECT_TRUE(r->fits) << row.name;
    ++checked;
    if (row.status == fidelity::RowStatus::kOpenGap) {
      EXPECT_FALSE(r->in_band()) << row.name << " is an open gap but now within +-10 % by both models: make it a "
                                 << "regression row and update docs/fidelity.md";
      continue;
    }
    for (const auto& [what, ratio] : {std::pair{"simulated", r->simulated_ratio},
                                      std::pair{"closed form", r->closed_form_ratio}}) {
      EXPECT_GE(ratio, row.lo) << row.name << ": " << what << " TFLOP/s " << 1 / ratio << "x published ("
                               << row.published << ", " << row.source << ")";
      EXPECT_LE(ratio, row.hi) << row.name << ": " << what << " TFLOP/s " << 1 / ratio << "x published ("
                               << row.published << ", " << row.source << ")";
    }
  }
  EXPECT_GE(checked, 2);
}

TEST(FidelityTest, MegatronTable1AsPublishedWithinTenPercentOrListedAsGap) { expect_rows_within_band(false); }

TEST(FidelityTest, MegatronTable1LargestRowsAsPublishedWithinTenPercentOrListedAsGap) { expect_rows_within_band(true); }

// The rows run what the published script ran (examples/sc21/run_table_1.sh): the interleaved schedule exactly on
// the four rows that set --num-layers-per-virtual-pipeline-stage, with vpp = layers / pp / that number.
TEST(FidelityTest, MegatronTable1RowsRunThePublishedSchedule) {
  int interleaved = 0;
  for (const fidelity::Row& row : fidelity::sc21_rows()) {
    auto s = Strategy::parse(row.strategy);
    ASSERT_TRUE(s.ok()) << s.status().message();
    if (s->schedule_kind() == ScheduleKind::kInterleaved) ++interleaved;
    const int want_vpp = row.name == "gpt-76b" || row.name == "gpt-530b"    ? 3
                         : row.name == "gpt-145b" || row.name == "gpt-310b" ? 2
                                                                             : 1;
    EXPECT_EQ(s->vpp, want_vpp) << row.name;
    if (row.name == "gpt-1.7b") {
      EXPECT_EQ(s->mbs, 16);
    }
  }
  EXPECT_EQ(interleaved, 4);
}

// The open gaps of Table 1 are three of its four interleaved rows (145B entered its band when 2021 Megatron-LM's
// pipeline was modelled, session 15); closing one is a decision the docs record.
TEST(FidelityTest, MegatronTable1OpenGapsAreTheInterleavedRows) {
  std::set<std::string> gaps;
  for (const fidelity::Row& row : fidelity::sc21_rows()) {
    if (row.status == fidelity::RowStatus::kOpenGap) gaps.insert(row.name);
  }
  EXPECT_EQ(gaps, (std::set<std::string>{"gpt-76b", "gpt-310b", "gpt-530b"}));
}

// 2021 Megatron-LM's pipeline terms (cost/device_model.h), each checked alone on the 310B row (tp 8, pp 16, vpp 2,
// m 144) in the closed form and the simulator: blocking sends expose every one of the 2 m v transfers; the
// scatter/gather split makes each cheaper (1/8 over the NIC plus an NVLink all-gather); the local DDP exposes
// the whole gradient all-reduce. The row's calibration turns all three on; the pp = 1 rows keep torch DDP.
TEST(FidelityTest, Megatron2021PipelineTermsMoveTheInterleavedRow) {
  const auto rows = fidelity::sc21_rows();
  const fidelity::Row& row = rows[7];
  ASSERT_EQ(row.name, "gpt-310b");
  EXPECT_TRUE(row.calibration.p2p_blocking && row.calibration.p2p_scatter_gather);
  EXPECT_TRUE(row.calibration.dp_reduce_after_backward);
  EXPECT_FALSE(rows[0].calibration.dp_reduce_after_backward);  // 1.7B: DDP=torch in run_table_1.sh
  Loaded l = load(row);
  cost::Calibration base = row.calibration;
  base.p2p_blocking = base.p2p_scatter_gather = base.dp_reduce_after_backward = false;
  auto run = [&](const cost::Calibration& c) {
    auto cm = cost::CostModel::create(l.model, l.cluster, l.train, c);
    EXPECT_TRUE(cm.ok());
    cost::Estimate est;
    const Status st = cm->estimate(l.strategy, &est);
    EXPECT_TRUE(st.ok()) << st.message();
    auto sim = simulate(l.model, l.cluster, l.train, l.strategy, c);
    EXPECT_TRUE(sim.ok()) << sim.status().message();
    return std::make_pair(est.step_time_s, sim.ok() ? sim->step_time_s : 0.0);
  };
  const auto [est0, sim0] = run(base);
  cost::Calibration blocking = base;
  blocking.p2p_blocking = true;
  const auto [est_b, sim_b] = run(blocking);
  // 576 exposed transfers of 67 MB at 25 GB/s: about 1.5 s more.
  EXPECT_GT(est_b - est0, 1.0);
  EXPECT_GT(sim_b - sim0, 1.0);
  cost::Calibration split = blocking;
  split.p2p_scatter_gather = true;
  const auto [est_s, sim_s] = run(split);
  EXPECT_LT(est_s, est_b - 0.5);
  EXPECT_LT(sim_s, sim_b - 0.5);
  const auto [est_all, sim_all] = run(row.calibration);
  EXPECT_GT(est_all, est_s + 0.1);  // the last microbatch's backward no longer hides part of the all-reduce
  EXPECT_GT(sim_all, sim_s + 0.1);
  auto j = parse_json(R"({"p2p_blocking": 1})", "cal.json");
  ASSERT_TRUE(j.ok());
  auto bad = cost::Calibration::from_json(*j, "cal.json");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("p2p_blocking"), std::string::npos) << bad.status().message();
}

// The calibration is what moves the 1.7B row: without it (fused attention) the model is far too fast there,
// and the knob changes nothing else (a model check that the term is wired into both the estimate and the
// simulator, and that it scales with heads x sequence / tp).
TEST(FidelityTest, MaterialisedAttentionScoresCostMemoryTime) {
  const fidelity::Row row = fidelity::sc21_rows()[0];
  Loaded l = load(row);
  auto fused = simulate(l.model, l.cluster, l.train, l.strategy, cost::Calibration{});
  auto mat = simulate(l.model, l.cluster, l.train, l.strategy, row.calibration);
  ASSERT_TRUE(fused.ok() && mat.ok());
  EXPECT_GT(row.published_step_s / fused->step_time_s, 1.3);
  EXPECT_GT(mat->step_time_s, fused->step_time_s * 1.2);
  auto j = parse_json(R"({"attention_score_bytes": -1})", "cal.json");
  ASSERT_TRUE(j.ok());
  auto bad = cost::Calibration::from_json(*j, "cal.json");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("attention_score_bytes"), std::string::npos) << bad.status().message();
}

// Megatron-LM's full recomputation re-runs each layer's two tensor-parallel all-reduces (6 per layer and
// microbatch instead of 4): the knob adds exactly those to the simulated plan (on the compute stream, labelled
// "(recompute)") and to the closed form, and nothing without tp or without full recomputation.
TEST(FidelityTest, RecomputeRerunningTpCollectivesAddsTwoAllReducesPerLayer) {
  const fidelity::Row row = fidelity::sc21_rows()[3];  // gpt-18b, tp=8, 40 layers
  Loaded l = load(row);
  l.strategy = *Strategy::parse("dp=2,tp=8,pp=1,mbs=1,microbatches=2,recompute=full,schedule=1f1b");
  l.train.global_batch = 4;
  l.train.micro_batch_size = 1;
  auto count_reruns = [](const SimReport& r) {
    int n = 0;
    for (const auto& st : r.compiled.plan.templates[0].streams)
      for (const auto& in : st.instrs)
        if (in.op == compile::OpKind::kCollective && in.label.find("(recompute)") != std::string::npos) ++n;
    return n;
  };
  ClusterSpec two_nodes = *load_cluster(row.cluster, 2);
  auto ours = simulate(l.model, two_nodes, l.train, l.strategy, row.calibration);
  cost::Calibration piper_cal = row.calibration;
  piper_cal.recompute_reruns_tp_collectives = false;
  auto piper_style = simulate(l.model, two_nodes, l.train, l.strategy, piper_cal);
  ASSERT_TRUE(ours.ok() && piper_style.ok());
  // 2 per layer and 1 for the vocabulary-parallel embedding (Piper's full recomputation re-runs it too), times
  // 2 microbatches.
  EXPECT_EQ(count_reruns(*ours), (2 * l.model.num_layers + 1) * 2);
  EXPECT_EQ(count_reruns(*piper_style), 0);
  EXPECT_GT(ours->step_time_s, piper_style->step_time_s);
  auto none = *Strategy::parse("dp=2,tp=8,pp=1,mbs=1,microbatches=2,recompute=none,schedule=1f1b");
  auto no_recompute = simulate(l.model, two_nodes, l.train, none, row.calibration);
  ASSERT_TRUE(no_recompute.ok());
  EXPECT_EQ(count_reruns(*no_recompute), 0);

  // Closed form: the difference is 2 ring all-reduces of one microbatch's hidden states per layer.
  auto cm_on = cost::CostModel::create(l.model, two_nodes, l.train, row.calibration);
  auto cm_off = cost::CostModel::create(l.model, two_nodes, l.train, piper_cal);
  ASSERT_TRUE(cm_on.ok() && cm_off.ok());
  auto on = cm_on->estimate(l.strategy), off = cm_off->estimate(l.strategy);
  ASSERT_TRUE(on.ok() && off.ok()) << (on.ok() ? off.status().message() : on.status().message());
  EXPECT_NEAR(on->comm.tp_s / off->comm.tp_s, 1.5, 1e-9);

  auto j = parse_json(R"({"recompute_reruns_tp_collectives": 1})", "cal.json");
  ASSERT_TRUE(j.ok());
  auto bad = cost::Calibration::from_json(*j, "cal.json");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("recompute_reruns_tp_collectives"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace piper::sim
