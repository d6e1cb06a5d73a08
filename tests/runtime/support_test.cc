// runtime_support() / check_runnable(): what the runtime declares it runs, it runs (one step on one rank for each
// schedule and recompute mode; the multi-rank values, ZeRO-1/2 and pipelines, are the parity tests'), and what it
// does not run is rejected naming the dimension.
#include "piper/runtime/support.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/trainer.h"
#include "piper/spec/model_loader.h"

namespace piper::runtime::testing {
namespace {

Strategy parse(const std::string& s) {
  auto r = Strategy::parse(s);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : Strategy{};
}

TEST(RuntimeSupport, ParityStrategiesAreRunnable) {
  for (const char* s :
       {"dp=2,microbatches=2", "pp=2,schedule=1f1b,microbatches=4", "pp=2,schedule=zb-h1,microbatches=4",
        "pp=2,schedule=dualpipev,microbatches=4", "dp=2,zero=1,microbatches=2", "dp=2,zero=2,microbatches=2",
        "dp=2,zero=3,microbatches=2", "dp=2,zero=3,recompute=full,microbatches=2", "dp=2,pp=2,microbatches=2",
        "pp=2,vpp=2,schedule=interleaved,microbatches=4", "pp=2,schedule=gpipe,recompute=full,microbatches=4",
        // tensor parallelism (dist_parity_mpi_test.cc)
        "tp=2,sp=1,microbatches=4", "dp=2,tp=2,sp=1,microbatches=2", "pp=2,tp=2,sp=1,schedule=1f1b,microbatches=4",
        "dp=2,tp=2,sp=1,zero=1,microbatches=2", "dp=2,tp=2,sp=1,zero=3,microbatches=2",
        // expert parallelism (dist_ep_mpi_test.cc, dist_parity_mpi_test.cc)
        "dp=2,ep=2,a2a=flat,microbatches=2", "dp=2,ep=2,a2a=halo,microbatches=2", "dp=4,ep=4,microbatches=1",
        "dp=4,ep=2,microbatches=1", "pp=2,dp=2,ep=2,schedule=1f1b,microbatches=2",
        "pp=2,dp=2,ep=2,zero=3,schedule=1f1b,microbatches=2",
        // recomputation with tp and ep (dist_parity_mpi_test.cc)
        "tp=2,sp=1,recompute=full,microbatches=4", "tp=2,sp=1,recompute=selective,microbatches=4",
        "dp=2,ep=2,recompute=full,microbatches=2", "dp=2,ep=2,recompute=selective,microbatches=2",
        // combined 1F1B (dist_parity_mpi_test.cc)
        "dp=2,ep=2,ep_overlap=1,microbatches=3",
        // every schedule with ep and tp, tp x pp x ZeRO, tp=4, ep=8 (dist_parity_mpi_test.cc, issue 26)
        "dp=2,pp=2,ep=2,zero=1,schedule=dualpipev,microbatches=4",
        "dp=2,pp=2,ep=2,zero=3,schedule=dualpipev,microbatches=4",
        "dp=2,pp=2,ep=2,schedule=zb-h1,microbatches=2", "dp=2,pp=2,ep=2,schedule=gpipe,microbatches=2",
        "dp=2,pp=2,ep=2,vpp=2,schedule=interleaved,microbatches=2", "pp=2,tp=2,sp=1,schedule=zb-h1,microbatches=4",
        "pp=2,tp=2,sp=1,schedule=dualpipev,microbatches=4", "pp=2,tp=2,sp=1,vpp=2,schedule=interleaved,microbatches=4",
        "dp=2,pp=2,tp=2,sp=1,zero=1,schedule=1f1b,microbatches=2", "tp=4,sp=1,microbatches=4",
        "dp=8,ep=8,microbatches=1", "dp=2,tp=2,ep=2,sp=1,microbatches=2", "dp=2,tp=2,sp=0,zero=3,microbatches=2",
        "dp=2,pp=2,tp=2,ep=2,sp=1,zero=1,schedule=dualpipev,microbatches=4",
        // MoE parallel folding with tp x ep (Parity.*Fold*)
        "tp=2,sp=1,ep=2,fold=1,microbatches=4", "dp=2,tp=2,sp=1,ep=2,fold=1,microbatches=2",
        "dp=2,tp=2,sp=1,ep=4,fold=1,zero=3,microbatches=2", "dp=4,tp=2,sp=1,ep=4,fold=1,zero=2,microbatches=1",
        "dp=2,pp=2,tp=2,ep=2,sp=1,fold=1,zero=1,schedule=dualpipev,microbatches=4",
        // Expert tensor parallelism (Parity.*Etp2*).
        "dp=2,tp=2,sp=1,ep=2,etp=2,microbatches=2", "dp=2,tp=2,sp=1,ep=2,etp=2,zero=3,microbatches=2",
        "dp=4,tp=2,sp=1,ep=2,etp=2,zero=1,microbatches=1",
        "dp=2,pp=2,tp=2,ep=2,sp=1,etp=2,zero=3,schedule=dualpipev,microbatches=4",
        // ... and without expert parallelism (ep = 1; Parity.*Etp2Ep1*)
        "tp=2,sp=1,etp=2,microbatches=2", "dp=2,tp=2,sp=1,etp=2,zero=3,microbatches=2",
        "tp=2,sp=1,etp=2,recompute=full,microbatches=2", "pp=2,tp=2,sp=1,etp=2,schedule=dualpipev,microbatches=4"}) {
    EXPECT_TRUE(check_runnable(parse(s)).ok()) << s << ": " << check_runnable(parse(s)).to_string();
  }
}

TEST(RuntimeSupport, UnsupportedDimensionsAreNamed) {
  const RuntimeSupport rs = runtime_support();
  EXPECT_EQ(rs.max_tp, 0);  // no runtime bound
  EXPECT_EQ(rs.max_ep, 0);
  // tp_overlap, the last refusal, runs since session 23 (exec/executor_tp_overlap.cc; Parity.Tp2Overlap*), with
  // pipelines, data parallelism, ZeRO and recomputation.
  for (const char* s :
       {"tp=2,sp=1,tp_overlap=1,microbatches=2", "pp=2,tp=2,sp=1,tp_overlap=1,schedule=zb-h1,microbatches=4",
        "dp=2,tp=2,sp=1,tp_overlap=1,zero=3,recompute=full,microbatches=2"}) {
    EXPECT_TRUE(check_runnable(parse(s)).ok()) << s << ": " << check_runnable(parse(s)).to_string();
  }
}

// af-pipe runs (tests/runtime/dist_m2n_mpi_test.cc: 2 attention + 2 FFN ranks, ep=2) with every ZeRO stage and
// recomputation, and with tp (AfPipeParity.Tp2*, Dp2Tp2Ep2Zero3).
TEST(RuntimeSupport, AfPipeIsRunnableAsTested) {
  ASSERT_TRUE(runtime_support().disaggregate);
  const std::string af = "dp=2,ep=2,pp=1,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=2,microbatches=2";
  EXPECT_TRUE(check_runnable(parse(af)).ok()) << check_runnable(parse(af)).to_string();
  for (const std::string& other : {af + ",zero=1,recompute=full", af + ",zero=3,recompute=selective"}) {
    EXPECT_TRUE(check_runnable(parse(other)).ok()) << other << ": " << check_runnable(parse(other)).to_string();
  }
  for (const std::string& with_tp :
       {std::string("dp=2,tp=2,sp=1,ep=2,schedule=af-pipe,disagg=1,attn_ranks=4,ffn_ranks=4,zero=3,microbatches=2"),
        std::string("dp=1,tp=2,sp=1,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=2,zero=1,recompute=full,"
                    "microbatches=4"),
        std::string("dp=1,tp=2,sp=1,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=4,recompute=selective,"
                    "microbatches=4")}) {
    EXPECT_TRUE(check_runnable(parse(with_tp)).ok()) << with_tp << ": " << check_runnable(parse(with_tp)).to_string();
  }
  // Several attention / FFN pipeline ranks (the FFN group combines, executor_m2n.cc).
  EXPECT_TRUE(check_runnable(parse("dp=2,ep=2,pp=2,schedule=af-pipe,disagg=1,attn_ranks=4,ffn_ranks=4,"
                                   "microbatches=4"))
                  .ok());
}

// tiny-moe, 16 tokens, the batch the strategy implies.
TrainOptions tiny_options(const std::string& strategy) {
  TrainOptions o;
  o.model = load_model("tiny-moe").value();
  o.global_batch = 0;
  o.seq_len = 16;
  o.strategy = strategy;
  return o;
}

void expect_one_step(const std::string& strategy) {
  kernels::set_kernel_threads(1);
  auto t = Trainer::create(tiny_options(strategy));
  ASSERT_TRUE(t.ok()) << strategy << ": " << t.status().to_string();
  auto step = (*t)->step();
  ASSERT_TRUE(step.ok()) << strategy << ": " << step.status().to_string();
  EXPECT_GT(step->loss, 0) << strategy;
}

// Every schedule and recompute mode listed runs a step on one rank (tiny-moe, seq 16).
TEST(RuntimeSupport, ListedSchedulesRun) {
  const RuntimeSupport rs = runtime_support();
  ASSERT_FALSE(rs.schedules.empty());
  for (const std::string& sched : rs.schedules) {
    expect_one_step("schedule=" + sched + ",microbatches=2,mbs=1" + (sched == "interleaved" ? ",vpp=2" : ""));
  }
}

TEST(RuntimeSupport, ListedRecomputeModesRun) {
  for (Recompute rc : runtime_support().recompute) {
    expect_one_step(std::string("schedule=1f1b,microbatches=2,mbs=1,recompute=") + to_string(rc));
  }
}

// Megatron's module recomputation runs (model/chunks/router.cc, experts.cc): the router's norm output and the experts'
// activation output are dropped after F and recomputed by the same kernels, so the losses are those of the run
// that keeps them, bit for bit; the measured activation peak falls, by what the plan no longer counts.
TEST(RuntimeSupport, RecomputeModulesRunWithTheSameLossesAndLessMemory) {
  kernels::set_kernel_threads(1);
  struct Run {
    std::vector<double> losses;
    double activations_peak = 0, activations_model = 0;
  };
  auto run = [](const std::string& strategy) {
    Run out;
    auto t = Trainer::create(tiny_options(strategy));
    EXPECT_TRUE(t.ok()) << strategy << ": " << t.status().to_string();
    if (!t.ok()) return out;
    for (int i = 0; i < 3; ++i) {
      auto step = (*t)->step();
      EXPECT_TRUE(step.ok()) << strategy << ": " << step.status().to_string();
      if (!step.ok()) return out;
      out.losses.push_back(step->loss);
    }
    out.activations_peak =
        static_cast<double>((*t)->memory().peak_bytes[static_cast<size_t>(MemCategory::kActivations)]);
    out.activations_model = (*t)->predicted_rank_memory().activations;
    return out;
  };
  const std::string base = "schedule=1f1b,microbatches=4,mbs=2";
  const Run keep = run(base);
  ASSERT_EQ(keep.losses.size(), 3u);
  for (const char* modules : {"layernorm", "moe_act", "layernorm+moe_act"}) {
    const std::string s = base + ",recompute_modules=" + modules;
    EXPECT_TRUE(check_runnable(parse(s)).ok()) << s << ": " << check_runnable(parse(s)).to_string();
    const Run r = run(s);
    ASSERT_EQ(r.losses.size(), 3u) << s;
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r.losses[i], keep.losses[i]) << s << " step " << i + 1;
    const double saved = keep.activations_peak - r.activations_peak;
    const double modelled = keep.activations_model - r.activations_model;
    std::printf("%s: activation peak %.1f KiB (kept: %.1f KiB), saved %.1f KiB, modelled %.1f KiB\n", s.c_str(),
                r.activations_peak / 1024, keep.activations_peak / 1024, saved / 1024, modelled / 1024);
    EXPECT_GT(modelled, 0) << s;
    EXPECT_NEAR(saved, modelled, 0.10 * modelled) << s << ": the measured saving differs from the plan's";
  }
}

}  // namespace
}  // namespace piper::runtime::testing
