// Whole-model gradient check: the chunks composed in order (reference_step) against central finite differences
// of the objective (mean LM loss + weighted router aux loss) in fp32, on the entries with the largest gradient
// of every parameter tensor and on a random entry of each.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "piper/tensor/rng.h"
#include "reference_step.h"

namespace piper::runtime::testing {
namespace {

double objective(Model& model, const Batch& batch, int m, Allocator* alloc) {
  ReferenceResult r = reference_step(model, batch, m, alloc, /*backward=*/false);
  return r.loss + r.aux_loss;
}

TEST(ModelGradTest, ChunkCompositionMatchesFiniteDifferences) {
  MemoryTracker tracker;
  TrackingAllocator alloc(&tracker);
  ModelOptions options;
  options.aux_loss_coef = 0.05;
  auto model = Model::create(small_moe_spec(true), options, 11, &alloc).value();
  // Larger weights than the 0.02 init make every path contribute measurably to the loss.
  for (Param* p : model->params()) {
    if (p->trainable && p->value.ndim() >= 2) {
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value[i] *= 8.0f;
    }
  }
  const Batch batch = random_batch(4, 8, 32, 3);
  const int m = 2;
  reference_step(*model, batch, m, &alloc);
  std::vector<Tensor> grads;  // the finite differences below zero the model's gradients
  for (Param* p : model->params()) grads.push_back(p->trainable ? p->grad.clone(MemCategory::kBuffers) : Tensor());
  Rng rng(99);
  int checked = 0;
  size_t k = 0;
  for (Param* p : model->params()) {
    const Tensor& analytic = grads[k++];
    if (!p->trainable) continue;
    int64_t best = 0;
    for (int64_t i = 1; i < analytic.numel(); ++i) {
      if (std::fabs(analytic[i]) > std::fabs(analytic[best])) best = i;
    }
    for (int64_t idx : {best, static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(analytic.numel())))}) {
      const float orig = p->value[idx];
      const float eps = 2e-3f;  // larger steps can flip a top-k choice (the objective is piecewise smooth)
      p->value[idx] = orig + eps;
      const double up = objective(*model, batch, m, &alloc);
      p->value[idx] = orig - eps;
      const double down = objective(*model, batch, m, &alloc);
      p->value[idx] = orig;
      const double fd = (up - down) / (2.0 * static_cast<double>(eps));
      const double g = analytic[idx];
      EXPECT_NEAR(fd, g, 0.03 * std::fabs(g) + 2e-4) << p->name << "[" << idx << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

}  // namespace
}  // namespace piper::runtime::testing
