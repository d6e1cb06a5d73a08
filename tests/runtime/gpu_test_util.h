// Shared by the GPU trainer's tests (gpu_train_test.cc on a GPU, gpu_trainer_emulation_test.cc against the host
// emulation of the CUDA API): step 1's gradients of GpuTrainer against the CPU trainer's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "piper/kernels/cuda/host_plan.h"
#include "piper/runtime/gpu/gpu_trainer.h"
#include "piper/runtime/trainer.h"

namespace piper::runtime::testing {

// Step 1's gradients (same weights on both sides): each tensor's relative error norm |g_gpu - g_cpu| / |g_cpu|
// within 4 · 2^-8 (~1.6%): bf16 operands perturb each GEMM by ~2^-8 relative, a few GEMMs deep. Exception: the
// routers and experts of MoE layers after the first (tiny-moe: L2, L3) get 25%. There the bf16 perturbation
// accumulated over the layers below flips near-tied top-k choices of a few tokens, and each flipped token moves
// a whole row between two experts of ~16 rows (measured: ~10% on L2, 1.8% on L3, while L1, the same code, is
// within 1.6%). 25% still catches a wrong transpose, index or sign (O(1) errors).
inline void expect_gradients_close(Trainer& cpu, GpuTrainer& gpu) {
  double worst = 0, worst_deep = 0;
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
    (deep_moe ? worst_deep : worst) = std::max(deep_moe ? worst_deep : worst, rel);
  }
  std::printf("step 1 gradients: worst relative error %.2e (deeper MoE routers/experts: %.2e) over %zu tensors\n",
              worst, worst_deep, grads->size());
}

}  // namespace piper::runtime::testing
