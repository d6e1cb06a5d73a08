// Fidelity against published MoE measurements on H100: one row per configuration, the source on every row.
//
// Every row is a Megatron-Core run on DGX H100 nodes (dgx-h100 preset, default calibration: fused attention,
// Piper's recomputation), BF16, laid out as Megatron lays it out (fold=1: the expert mesh over each stage's
// tp x dp ranks). The published step time is either quoted (Step time column) or derived from the quoted
// TFLOP/s per GPU with Megatron's own FLOP count, which reproduces the Qwen3 table's step-time / TFLOP/s pairs
// within 1 % (docs/simulator.md, "MoE rows").
//
// Bands. The six rows whose costs the model covers must lie within [0.75, 1.30] of the published step time,
// simulated and in closed form. Two rows are known gaps, pinned to [0.40, 0.70] so that a change is noticed and
// the docs are updated with it: C (Qwen3-235B TP4 EP8, dropless) and E (gpt-oss-120b at 16 % MFU) ran 1.7-2x
// slower than the model predicts; Megatron's per-layer MoE overheads there (dropless token counts synchronised
// to the host for the all-to-all split sizes, permutation and router kernels at small token counts, kernel
// launches without CUDA graphs, load imbalance) are not modelled (docs/simulator.md, "Why the rows are still
// off"). No constant is fitted to these rows.

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "piper/cost/estimate.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::sim {
namespace {

struct MoeRow {
  const char* name;
  const char* source;
  const char* model;
  int nodes;  // DGX H100, 8 GPUs each
  int64_t global_batch;
  int64_t seq_len;
  const char* strategy;
  double published_step_s;
  double lo, hi;  // accepted simulated / published and closed form / published
  // The closed form's memory fits in 80 GB, as the published run did. Not for D: Megatron recomputed the
  // layernorm and MoE modules (--recompute-modules layernorm moe); Piper models layernorm and moe_act
  // (Strategy::recompute_modules), not the whole MoE layer, so D keeps selective recomputation (the attention
  // chunk) and 16k tokens of MoE activations. E and F run with layernorm+moe_act, as published.
  bool check_fits = true;
};

constexpr const char* kZoo = "NVIDIA Megatron MoE model zoo, github.com/yanring/Megatron-MoE-ModelZoo";
constexpr double kLo = 0.75, kHi = 1.30;        // rows the model covers
constexpr double kGapLo = 0.40, kGapHi = 0.70;  // known gaps (see above)

const MoeRow kMoeRows[] = {
    {"A Mixtral-8x22B", "model zoo best_practice/mixtral/run_mixtral_8x22B.sh: 465 TFLOP/s, forced balance",
     "mixtral-8x22b", 16, 256, 4096,
     "dp=8,tp=2,sp=1,pp=8,vpp=7,ep=8,fold=1,zero=1,mbs=1,microbatches=32,recompute=none,schedule=interleaved", 4.266,
     kLo, kHi},
    {"B Qwen3-235B Megatron-FSDP", "model zoo best_practice/qwen3/readme.md H100 table: TP2 EP8 DP128 FSDP, 17.6 s",
     "qwen3-235b-a22b", 32, 2048, 4096, "dp=128,tp=2,sp=1,pp=1,ep=8,fold=1,zero=3,mbs=4,microbatches=4,recompute=full",
     17.6, kLo, kHi},
    {"C Qwen3-235B TP4 EP8 dropless", "model zoo best_practice/qwen3/readme.md H100 table: TP4 PP8 VPP4 EP8, 29.0 s",
     "qwen3-235b-a22b", 32, 2048, 4096,
     "dp=8,tp=4,sp=1,pp=8,vpp=4,ep=8,fold=1,zero=1,mbs=1,microbatches=256,recompute=none,schedule=interleaved", 29.0,
     kGapLo, kGapHi},
    {"D Qwen3-235B 16k", "model zoo best_practice/qwen3/readme.md long-context table: 16384, TP4, 295 TFLOP/s forced",
     "qwen3-235b-a22b", 32, 256, 16384,
     "dp=8,tp=4,sp=1,pp=8,vpp=4,ep=8,fold=1,zero=1,mbs=1,microbatches=32,recompute=selective,schedule=interleaved",
     11.37, kLo, kHi, false},
    {"E gpt-oss-120b", "NeMo Megatron-Bridge docs/performance-summary-archive.md: 64 H100, 5,993 tokens/s/GPU",
     "gpt-oss-120b", 8, 1280, 4096,
     "dp=16,tp=1,pp=4,ep=8,zero=1,mbs=1,microbatches=80,recompute=none,recompute_modules=layernorm+moe_act,"
     "schedule=1f1b",
     13.67, kGapLo, kGapHi},
    {"F Qwen3-235B EP32", "model zoo best_practice/qwen3/readme.md H100 table: TP2 PP8 VPP4 EP32, DeepEP, 19.7 s",
     "qwen3-235b-a22b", 32, 2048, 4096,
     "dp=16,tp=2,sp=1,pp=8,vpp=4,ep=32,fold=1,zero=1,mbs=1,microbatches=128,recompute=none,"
     "recompute_modules=layernorm+moe_act,"
     "schedule=interleaved",
     19.7, kLo, kHi},
    {"F' + 1F1B all-to-all overlap", "model zoo best_practice/qwen3/readme.md H100 table: same, +1f1b overlap, 17.6 s",
     "qwen3-235b-a22b", 32, 2048, 4096,
     "dp=16,tp=2,sp=1,pp=8,vpp=4,ep=32,fold=1,zero=1,mbs=1,microbatches=128,recompute=none,"
     "recompute_modules=layernorm+moe_act,"
     "schedule=interleaved,ep_overlap=1",
     17.6, kLo, kHi},
    {"F'' + forced balance, CUDA graphs", "model zoo best_practice/qwen3/run_h100_235b.sh: A2A_OVERLAP=1, 320 TFLOP/s",
     "qwen3-235b-a22b", 32, 2048, 4096,
     "dp=16,tp=2,sp=1,pp=8,vpp=4,ep=32,fold=1,zero=1,mbs=1,microbatches=128,recompute=none,"
     "recompute_modules=layernorm+moe_act,"
     "schedule=interleaved,ep_overlap=1",
     15.16, kLo, kHi},
};

void check_rows(bool large) {
  int checked = 0;
  for (const MoeRow& row : kMoeRows) {
    // The 256-GPU rows with 128 or more microbatches take seconds each: their own test, run beside this one.
    auto s = Strategy::parse(row.strategy);
    ASSERT_TRUE(s.ok()) << row.name << ": " << s.status().message();
    if ((s->microbatches >= 128) != large) continue;
    auto m = load_model(row.model);
    ASSERT_TRUE(m.ok()) << m.status().message();
    auto c = load_cluster("dgx-h100", row.nodes);
    ASSERT_TRUE(c.ok()) << c.status().message();
    TrainSpec t;
    t.seq_len = row.seq_len;
    t.global_batch = row.global_batch;
    t.micro_batch_size = s->mbs;
    ASSERT_EQ(s->world_size(), row.nodes * 8) << row.name;
    ASSERT_EQ(s->global_batch(), row.global_batch) << row.name;
    auto cm = cost::CostModel::create(*m, *c, t);
    ASSERT_TRUE(cm.ok()) << cm.status().message();
    auto est = cm->estimate(*s);
    ASSERT_TRUE(est.ok()) << row.name << ": " << est.status().message();
    auto sim = simulate(*m, *c, t, *s);
    ASSERT_TRUE(sim.ok()) << row.name << ": " << sim.status().message();
    const double rs = sim->step_time_s / row.published_step_s, re = est->step_time_s / row.published_step_s;
    std::printf("%-34s published %6.2f s  simulated %6.2f s (%.2f)  closed form %6.2f s (%.2f)  band [%.2f, %.2f]\n",
                row.name, row.published_step_s, sim->step_time_s, rs, est->step_time_s, re, row.lo, row.hi);
    for (const auto& [what, ratio] : {std::pair{"simulated", rs}, std::pair{"closed form", re}}) {
      EXPECT_GE(ratio, row.lo) << row.name << ": " << what << " / published = " << ratio << " (" << row.source << ")";
      EXPECT_LE(ratio, row.hi) << row.name << ": " << what << " / published = " << ratio << " (" << row.source << ")";
    }
    if (row.check_fits) {
      EXPECT_TRUE(est->fits) << row.name << ": the published run fitted in 80 GB";
    }
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(MoeFidelityTest, PublishedH100RowsWithinTheirBands) { check_rows(false); }
TEST(MoeFidelityTest, PublishedH100LargeRowsWithinTheirBands) { check_rows(true); }

}  // namespace
}  // namespace piper::sim
