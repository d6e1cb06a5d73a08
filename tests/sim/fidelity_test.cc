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
// The cluster is the dgx-a100 preset, with NVLink at NCCL's effective 240 GB/s (configs/clusters/dgx-a100.json).

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "piper/cost/estimate.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::sim {
namespace {

struct FidelityRow {
  const char* source;
  const char* model;
  const char* cluster;
  int gpus;
  const char* strategy;  // t/p/d, batch split; schedule details are our assumption (see source note)
  int64_t global_batch;
  int64_t seq_len;
  double tflops_per_gpu;  // measured
  bool small;             // simulated in MegatronTable1SimulatedWithinTenPercent (else in ...LargestRows...)
};

constexpr const char* kTable1 =
    "Narayanan et al. SC'21 (arXiv:2104.04473) Table 1 (heads/hidden/layers/t/p/GPUs/batch/achieved TFLOP/s)";

// Microbatch size 1 and the schedule (1F1B, PipeDream-Flush, the paper's default) are not in Table 1: our
// assumption. d = GPUs / (t p), microbatches = batch / d.
const FidelityRow kRows[] = {
    {kTable1, "gpt-1.7b", "dgx-a100", 32, "dp=32,tp=1,pp=1,mbs=1,microbatches=16,recompute=full,schedule=1f1b", 512,
     2048, 137, true},
    {kTable1, "gpt-3.6b", "dgx-a100", 64, "dp=32,tp=2,pp=1,mbs=1,microbatches=16,recompute=full,schedule=1f1b", 512,
     2048, 138, true},
    {kTable1, "gpt-7.5b", "dgx-a100", 128, "dp=32,tp=4,pp=1,mbs=1,microbatches=16,recompute=full,schedule=1f1b", 512,
     2048, 142, true},
    {kTable1, "gpt-18b", "dgx-a100", 256, "dp=32,tp=8,pp=1,mbs=1,microbatches=32,recompute=full,schedule=1f1b", 1024,
     2048, 135, true},
    {kTable1, "gpt-39b", "dgx-a100", 512, "dp=32,tp=8,pp=2,mbs=1,microbatches=48,recompute=full,schedule=1f1b", 1536,
     2048, 138, true},
    {kTable1, "gpt-76b", "dgx-a100", 1024, "dp=32,tp=8,pp=4,mbs=1,microbatches=56,recompute=full,schedule=1f1b", 1792,
     2048, 140, true},
    {kTable1, "gpt-145b", "dgx-a100", 1536, "dp=24,tp=8,pp=8,mbs=1,microbatches=96,recompute=full,schedule=1f1b", 2304,
     2048, 148, true},
    {kTable1, "gpt-310b", "dgx-a100", 1920, "dp=15,tp=8,pp=16,mbs=1,microbatches=144,recompute=full,schedule=1f1b",
     2160, 2048, 155, true},
    // The two largest take 10 s and 40 s to compile and simulate: their own test below.
    {kTable1, "gpt-530b", "dgx-a100", 2520, "dp=9,tp=8,pp=35,mbs=1,microbatches=280,recompute=full,schedule=1f1b", 2520,
     2048, 163, false},
    {kTable1, "gpt-1t", "dgx-a100", 3072, "dp=6,tp=8,pp=64,mbs=1,microbatches=512,recompute=full,schedule=1f1b", 3072,
     2048, 163, false},
};

double megatron_flops_per_iteration(const ModelSpec& m, int64_t batch, int64_t seq) {
  const double B = static_cast<double>(batch), s = static_cast<double>(seq), l = m.num_layers,
               h = static_cast<double>(m.hidden_size), V = static_cast<double>(m.vocab_size);
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

cost::Calibration megatron_2021() {
  cost::Calibration c;
  c.attention_score_bytes = 13;
  c.recompute_reruns_tp_collectives = true;
  return c;
}

struct Loaded {
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
  Strategy strategy;
};

Loaded load(const FidelityRow& row) {
  Loaded l;
  auto m = load_model(row.model);
  EXPECT_TRUE(m.ok()) << m.status().message();
  l.model = *m;
  auto c = load_cluster(row.cluster, row.gpus / 8);
  EXPECT_TRUE(c.ok()) << c.status().message();
  l.cluster = *c;
  auto s = Strategy::parse(row.strategy);
  EXPECT_TRUE(s.ok()) << s.status().message();
  l.strategy = *s;
  EXPECT_EQ(l.strategy.world_size(), row.gpus) << row.model;
  EXPECT_EQ(l.strategy.global_batch(), row.global_batch) << row.model;
  l.train.seq_len = row.seq_len;
  l.train.global_batch = row.global_batch;
  return l;
}

double tflops(const FidelityRow& row, const ModelSpec& m, double step_time_s) {
  return megatron_flops_per_iteration(m, row.global_batch, row.seq_len) / step_time_s / row.gpus / 1e12;
}

void expect_simulated_within_ten_percent(bool small) {
  int simulated = 0;
  for (const FidelityRow& row : kRows) {
    if (row.small != small) continue;
    Loaded l = load(row);
    auto r = simulate(l.model, l.cluster, l.train, l.strategy, megatron_2021());
    ASSERT_TRUE(r.ok()) << row.model << ": " << r.status().message();
    const double got = tflops(row, l.model, r->step_time_s);
    EXPECT_NEAR(got / row.tflops_per_gpu, 1.0, 0.10)
        << row.model << " on " << row.gpus << " GPUs: simulated " << got << " TFLOP/s per GPU, measured "
        << row.tflops_per_gpu << " (" << row.source << ")";
    ++simulated;
  }
  EXPECT_GE(simulated, 2);
}

TEST(FidelityTest, MegatronTable1SimulatedWithinTenPercent) { expect_simulated_within_ten_percent(true); }

TEST(FidelityTest, MegatronTable1LargestRowsSimulatedWithinTenPercent) { expect_simulated_within_ten_percent(false); }

TEST(FidelityTest, MegatronTable1ClosedFormWithinTenPercent) {
  for (const FidelityRow& row : kRows) {
    Loaded l = load(row);
    auto cm = cost::CostModel::create(l.model, l.cluster, l.train, megatron_2021());
    ASSERT_TRUE(cm.ok()) << cm.status().message();
    auto e = cm->estimate(l.strategy);
    ASSERT_TRUE(e.ok()) << row.model << ": " << e.status().message();
    EXPECT_TRUE(e->fits) << row.model;
    const double got = tflops(row, l.model, e->step_time_s);
    EXPECT_NEAR(got / row.tflops_per_gpu, 1.0, 0.10)
        << row.model << " on " << row.gpus << " GPUs: closed form " << got << " TFLOP/s per GPU, measured "
        << row.tflops_per_gpu << " (" << row.source << ")";
  }
}

// The calibration is what moves the 1.7B row: without it (fused attention) the model is far too fast there,
// and the knob changes nothing else (a model check that the term is wired into both the estimate and the
// simulator, and that it scales with heads x sequence / tp).
TEST(FidelityTest, MaterialisedAttentionScoresCostMemoryTime) {
  const FidelityRow& row = kRows[0];
  Loaded l = load(row);
  auto fused = simulate(l.model, l.cluster, l.train, l.strategy, cost::Calibration{});
  auto mat = simulate(l.model, l.cluster, l.train, l.strategy, megatron_2021());
  ASSERT_TRUE(fused.ok() && mat.ok());
  EXPECT_GT(tflops(row, l.model, fused->step_time_s) / row.tflops_per_gpu, 1.3);
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
  const FidelityRow& row = kRows[3];  // gpt-18b, tp=8, 40 layers
  Loaded l = load(row);
  l.strategy = *Strategy::parse("dp=2,tp=8,pp=1,mbs=1,microbatches=2,recompute=full,schedule=1f1b");
  l.train.global_batch = 4;
  auto count_reruns = [](const SimReport& r) {
    int n = 0;
    for (const auto& st : r.compiled.plan.templates[0].streams)
      for (const auto& in : st.instrs)
        if (in.op == compile::OpKind::kCollective && in.label.find("(recompute)") != std::string::npos) ++n;
    return n;
  };
  ClusterSpec two_nodes = *load_cluster(row.cluster, 2);
  auto ours = simulate(l.model, two_nodes, l.train, l.strategy, megatron_2021());
  cost::Calibration piper_cal = megatron_2021();
  piper_cal.recompute_reruns_tp_collectives = false;
  auto piper_style = simulate(l.model, two_nodes, l.train, l.strategy, piper_cal);
  ASSERT_TRUE(ours.ok() && piper_style.ok());
  // 2 per layer and 1 for the vocabulary-parallel embedding (Piper's full recomputation re-runs it too), times
  // 2 microbatches.
  EXPECT_EQ(count_reruns(*ours), (2 * l.model.num_layers + 1) * 2);
  EXPECT_EQ(count_reruns(*piper_style), 0);
  EXPECT_GT(ours->step_time_s, piper_style->step_time_s);
  auto none = *Strategy::parse("dp=2,tp=8,pp=1,mbs=1,microbatches=2,recompute=none,schedule=1f1b");
  auto no_recompute = simulate(l.model, two_nodes, l.train, none, megatron_2021());
  ASSERT_TRUE(no_recompute.ok());
  EXPECT_EQ(count_reruns(*no_recompute), 0);

  // Closed form: the difference is 2 ring all-reduces of one microbatch's hidden states per layer.
  auto cm_on = cost::CostModel::create(l.model, two_nodes, l.train, megatron_2021());
  auto cm_off = cost::CostModel::create(l.model, two_nodes, l.train, piper_cal);
  ASSERT_TRUE(cm_on.ok() && cm_off.ok());
  auto on = cm_on->estimate(l.strategy), off = cm_off->estimate(l.strategy);
  ASSERT_TRUE(on.ok() && off.ok());
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
