#include "piper/runtime/optimizer.h"

#include <algorithm>
#include <limits>

#include "piper/base/check.h"
#include "piper/kernels/cpu/optimizer.h"

namespace piper::runtime {
namespace {
// The range [0, kWholeChunk) covers every trainable element of a chunk (update/grad_sq are the whole-chunk case).
constexpr int64_t kWholeChunk = std::numeric_limits<int64_t>::max();
}  // namespace

Optimizer::Optimizer(const OptimizerSpec& spec, int64_t warmup_steps, const Model& model, Allocator* allocator)
    : spec_(spec), warmup_steps_(warmup_steps), model_(model) {
  for (Param* p : model.params()) {
    if (!p->trainable) continue;
    Moments mo;
    mo.m = Tensor::zeros_or_die(p->value.shape(), MemCategory::kOptimizer, allocator);
    mo.v = Tensor::zeros_or_die(p->value.shape(), MemCategory::kOptimizer, allocator);
    moments_.emplace(p, std::move(mo));
  }
}

double Optimizer::learning_rate() const {
  if (warmup_steps_ <= 0) return spec_.lr;
  return spec_.lr * std::min(1.0, static_cast<double>(std::max<int64_t>(step_, 1)) / static_cast<double>(warmup_steps_));
}

double Optimizer::begin_step() {
  std::vector<std::pair<const float*, int64_t>> grads;
  for (const Param* p : model_.params()) {
    if (p->trainable) grads.emplace_back(p->grad.data(), p->grad.numel());
  }
  const double norm = kernels::grad_global_norm(grads);
  clip_scale_ = kernels::clip_scale(norm, spec_.grad_clip);
  ++step_;
  return norm;
}

void Optimizer::begin_step_with_norm(double global_norm) {
  clip_scale_ = kernels::clip_scale(global_norm, spec_.grad_clip);
  ++step_;
}

double Optimizer::grad_sq(const Chunk& chunk) { return grad_sq_range(chunk, 0, kWholeChunk); }

double Optimizer::grad_sq_range(const Chunk& chunk, int64_t begin, int64_t end) {
  std::vector<std::pair<const float*, int64_t>> grads;
  int64_t offset = 0;
  for (const Param& p : chunk.params()) {
    if (!p.trainable) continue;
    const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + p.grad.numel());
    if (lo < hi) grads.emplace_back(p.grad.data() + (lo - offset), hi - lo);
    offset += p.grad.numel();
  }
  const double norm = kernels::grad_global_norm(grads);
  return norm * norm;
}

void Optimizer::update_range(Chunk& chunk, int64_t begin, int64_t end) {
  PIPER_CHECK(step_ >= 1, "Optimizer::update_range before begin_step");
  kernels::AdamWConfig cfg;
  cfg.lr = learning_rate();
  cfg.beta1 = spec_.beta1;
  cfg.beta2 = spec_.beta2;
  cfg.eps = spec_.eps;
  cfg.weight_decay = spec_.weight_decay;
  int64_t offset = 0;
  for (Param& p : chunk.params()) {
    if (!p.trainable) continue;
    const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + p.value.numel());
    if (lo < hi) {
      Moments& mo = moments_.at(&p);
      const int64_t a = lo - offset;
      kernels::adamw_step(p.value.data() + a, p.grad.data() + a, mo.m.data() + a, mo.v.data() + a, hi - lo, cfg,
                          step_, clip_scale_, p.decay);
    }
    offset += p.value.numel();
  }
}

void Optimizer::update(Chunk& chunk) {
  PIPER_CHECK(step_ >= 1, "Optimizer::update before begin_step");
  update_range(chunk, 0, kWholeChunk);
}

std::vector<std::pair<std::string, Tensor*>> Optimizer::state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (const Param* p : model_.params()) {
    if (!p->trainable) continue;
    Moments& mo = moments_.at(p);
    out.emplace_back(p->name + ".m", &mo.m);
    out.emplace_back(p->name + ".v", &mo.v);
  }
  return out;
}

}  // namespace piper::runtime
