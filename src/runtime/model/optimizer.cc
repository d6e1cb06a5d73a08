#include "piper/runtime/model/optimizer.h"

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
    : spec_(spec), warmup_steps_(warmup_steps), allocator_(allocator), model_(model) {
  for (Param* p : model.params()) {
    if (!p->trainable) continue;
    Moments mo;
    mo.m = Tensor::zeros_or_die(p->value.shape(), MemCategory::kOptimizer, allocator);
    mo.v = Tensor::zeros_or_die(p->value.shape(), MemCategory::kOptimizer, allocator);
    mo.numel = p->value.numel();
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

void Optimizer::shard(const Chunk& chunk, int64_t begin, int64_t end) {
  int64_t offset = 0;
  for (const Param& p : chunk.params()) {
    if (!p.trainable) continue;
    Moments& mo = moments_.at(&p);
    const int64_t n = mo.numel, lo = std::max(begin, offset), hi = std::min(end, offset + n);
    mo.m = Tensor();
    mo.v = Tensor();
    mo.begin = 0;
    if (lo < hi) {
      mo.m = Tensor::zeros_or_die({hi - lo}, MemCategory::kOptimizer, allocator_);
      mo.v = Tensor::zeros_or_die({hi - lo}, MemCategory::kOptimizer, allocator_);
      mo.begin = lo - offset;
    }
    offset += n;
  }
}

void Optimizer::update_range(Chunk& chunk, int64_t begin, int64_t end, const float* grad, std::vector<Tensor>* values) {
  PIPER_CHECK(step_ >= 1, "Optimizer::update_range before begin_step");
  kernels::AdamWConfig cfg;
  cfg.lr = learning_rate();
  cfg.beta1 = spec_.beta1;
  cfg.beta2 = spec_.beta2;
  cfg.eps = spec_.eps;
  cfg.weight_decay = spec_.weight_decay;
  int64_t offset = 0;
  size_t index = 0;
  for (Param& p : chunk.params()) {
    if (!p.trainable) continue;
    Moments& mo = moments_.at(&p);
    // The parameter's size is recorded: a ZeRO-3 parameter's value is not materialised outside its uses.
    const int64_t n = mo.numel, lo = std::max(begin, offset), hi = std::min(end, offset + n);
    if (lo < hi) {
      const int64_t a = lo - offset;
      PIPER_CHECK(a >= mo.begin && a + (hi - lo) <= mo.begin + mo.m.numel(), "Optimizer: the moments of ", p.name,
                  " do not cover the elements updated");
      PIPER_CHECK(values == nullptr || (*values)[index].numel() == hi - lo, "Optimizer: the shard of ", p.name,
                  " has the wrong size");
      float* value = values != nullptr ? (*values)[index].data() : p.value.data() + a;
      const float* g = grad != nullptr ? grad + (lo - begin) : p.grad.data() + a;
      kernels::adamw_step(value, g, mo.m.data() + (a - mo.begin), mo.v.data() + (a - mo.begin), hi - lo, cfg, step_,
                          clip_scale_, p.decay);
    }
    offset += n;
    ++index;
  }
}

void Optimizer::update(Chunk& chunk) {
  PIPER_CHECK(step_ >= 1, "Optimizer::update before begin_step");
  update_range(chunk, 0, kWholeChunk);
}

std::vector<Optimizer::StateTensor> Optimizer::state() {
  std::vector<StateTensor> out;
  for (const Param* p : model_.params()) {
    if (!p->trainable) continue;
    Moments& mo = moments_.at(p);
    out.push_back({p->name + ".m", &mo.m, mo.begin, mo.begin + mo.m.numel()});
    out.push_back({p->name + ".v", &mo.v, mo.begin, mo.begin + mo.v.numel()});
  }
  return out;
}

}  // namespace piper::runtime
