// The GPU trainer's orchestration on the CPU: GpuTrainer (runtime/gpu/gpu_trainer.cc) linked against the host
// emulation of the CUDA API (cuda_host_emulation.cc: the documented kernel contracts on host memory, bf16 GEMM
// operands as on the GPU) against the CPU trainer on the same options. Runs in every build, no GPU needed.
// Tolerance as in gpu_train_test.cc: 5 · 2^-8 relative per step (bf16 GEMM operands on one side only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "gpu_test_util.h"
#include "piper/kernels/cuda/host_plan.h"
#include "piper/runtime/gpu/gpu_trainer.h"
#include "piper/runtime/trainer.h"
#include "piper/spec/model_loader.h"

namespace piper::runtime {
namespace {

using testing::expect_gradients_close;

TEST(GpuTrainerEmulation, TinyMoeLossesFollowTheCpuTrainer) {
  TrainOptions o;
  o.model = load_model("tiny-moe").value();
  o.global_batch = 8;  // mbs 4: two microbatches, so gradient accumulation and the per-microbatch aux loss count
  o.seq_len = 16;
  o.seed = 1234;
  o.optimizer.lr = 3e-3;
  o.warmup_steps = 2;
  auto cpu = Trainer::create(o);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = GpuTrainer::create(o);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  EXPECT_EQ((*gpu)->microbatches(), 2);
  const double tol = 5 * kernels::cuda::kBf16Unit;
  double first = 0, last = 0;
  for (int i = 0; i < 4; ++i) {
    auto c = (*cpu)->step();
    auto g = (*gpu)->step();
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_TRUE(std::isfinite(g->loss)) << "step " << i + 1;
    EXPECT_NEAR(g->loss, c->loss, tol * c->loss) << "step " << i + 1;
    EXPECT_NEAR(g->aux_loss, c->aux_loss, tol * c->aux_loss + 1e-6) << "step " << i + 1;
    EXPECT_NEAR(g->grad_norm, c->grad_norm, 4 * tol * c->grad_norm) << "step " << i + 1;
    std::printf("step %d  cpu loss %.5f |g| %.4f aux %.5f   emulated gpu loss %.5f |g| %.4f aux %.5f\n", i + 1, c->loss,
                c->grad_norm, c->aux_loss, g->loss, g->grad_norm, g->aux_loss);
    if (i == 0) {
      first = g->loss;
      expect_gradients_close(**cpu, **gpu);
    }
    last = g->loss;
  }
  EXPECT_LT(last, first);
}

}  // namespace
}  // namespace piper::runtime
