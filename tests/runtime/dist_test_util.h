// Shared by the multi-rank runtime tests (dist_*_mpi_test.cc, ckpt_mpi_test.cc, migrate_mpi_test.cc): the tiny-moe
// run they compare (seed 1234, sequences of 16 tokens, 2 warm-up steps, one kernel thread per rank) and a loop
// that trains a Trainer for some steps, failing the test on an error.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/trainer.h"
#include "piper/spec/model_loader.h"

namespace piper::runtime::testing {

// tiny-moe under `strategy`; global batch = the strategy's dp * microbatches * mbs.
inline TrainOptions tiny_moe_options(const std::string& strategy, double lr) {
  kernels::set_kernel_threads(1);  // ranks share the cores
  TrainOptions o;
  o.model = load_model("tiny-moe").value();
  o.strategy = strategy;
  o.global_batch = 0;
  o.seq_len = 16;
  o.seed = 1234;
  o.optimizer.lr = lr;
  o.warmup_steps = 2;
  return o;
}

// `steps` steps of `trainer` (every one must succeed); the steps done until the first failure.
inline std::vector<TrainStepStats> train_steps(Trainer& trainer, int steps) {
  std::vector<TrainStepStats> out;
  for (int i = 0; i < steps; ++i) {
    auto s = trainer.step();
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) break;
    out.push_back(std::move(s).value());
  }
  return out;
}

}  // namespace piper::runtime::testing
