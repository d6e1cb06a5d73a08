// The GPU trainer's orchestration on the CPU: GpuTrainer (runtime/gpu/gpu_trainer.cc) linked against the host
// emulation of the CUDA API (cuda_host_emulation.cc: the documented kernel contracts on host memory, bf16 GEMM
// operands as on the GPU) against the CPU trainer on the same options. Runs in every build, no GPU needed.
// Tolerance as in gpu_train_test.cc: 5 · 2^-8 relative per step (bf16 GEMM operands on one side only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "piper/kernels/cuda/host_plan.h"
#include "piper/runtime/gpu/gpu_trainer.h"
#include "piper/runtime/trainer.h"
#include "piper/spec/model_loader.h"

namespace piper::runtime {
namespace {

double worst_ = 0, worst_deep_ = 0;

// Step 1's gradients (same weights on both sides): each tensor's relative error norm |g_gpu - g_cpu| / |g_cpu|
// within 4 · 2^-8 (~1.6%): bf16 operands perturb each GEMM by ~2^-8 relative, a few GEMMs deep. Exception: the
// routers and experts of MoE layers after the first (tiny-moe: L2, L3) get 25%. There the bf16 perturbation
// accumulated over the layers below flips near-tied top-k choices of a few tokens, and each flipped token moves
// a whole row between two experts of ~16 rows (measured: ~10% on L2, 1.8% on L3, while L1, the same code, is
// within 1.6%). 25% still catches a wrong transpose, index or sign (O(1) errors).
void expect_gradients_close(Trainer& cpu, GpuTrainer& gpu) {
  auto grads = gpu.gradients();
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  std::map<std::string, const Tensor*> want;
  for (const Param* p : cpu.model().params()) {
    if (p->trainable) want[p->name] = &p->grad;
  }
  ASSERT_EQ(grads->size(), want.size());
  for (const auto& [name, g] : *grads) {
    ASSERT_EQ(want.count(name), 1u) << name;
    const Tensor& c = *want[name];
    ASSERT_EQ(static_cast<int64_t>(g.size()), c.numel()) << name;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      diff += (static_cast<double>(g[i]) - c.data()[i]) * (static_cast<double>(g[i]) - c.data()[i]);
      norm += static_cast<double>(c.data()[i]) * c.data()[i];
    }
    const double rel = std::sqrt(diff / std::max(norm, 1e-30));
    const bool deep_moe = (name.find(".router.") != std::string::npos || name.find(".experts.") != std::string::npos) &&
                          name.rfind("L1.", 0) != 0;
    EXPECT_LE(rel, deep_moe ? 0.25 : 4 * kernels::cuda::kBf16Unit) << name << " gradient relative error " << rel;
    (deep_moe ? worst_deep_ : worst_) = std::max(deep_moe ? worst_deep_ : worst_, rel);
  }
  std::printf("step 1 gradients: worst relative error %.2e (deeper MoE routers/experts: %.2e) over %zu tensors\n",
              worst_, worst_deep_, grads->size());
}

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
