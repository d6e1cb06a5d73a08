// Pieces shared by the closed form's translation units (estimate.cc, estimate_af.cc); not part of the API.
#pragma once

#include "piper/cost/device_model.h"
#include "piper/cost/estimate.h"
#include "piper/cost/layer_cost.h"
#include "piper/spec/part.h"
#include "piper/strategy/strategy.h"

namespace piper::cost {

// F, B, W times of one thing (a layer part, a layer, a rank's microbatch).
struct Fbw {
  double f = 0, b = 0, w = 0;
  Fbw& operator+=(const Fbw& o) {
    f += o.f;
    b += o.b;
    w += o.w;
    return *this;
  }
  Fbw operator*(double k) const { return {f * k, b * k, w * k}; }
  Fbw operator+(const Fbw& o) const { return {f + o.f, b + o.b, w + o.w}; }
  double total() const { return f + b + w; }
};

// One microbatch's F, B and W of a part's priced tasks on `dev` (compute roofline plus pointwise memory traffic).
inline Fbw part_fbw(const PartCost& c, const DeviceModel& dev) {
  auto time = [&](const TaskCost& k) {
    return dev.time_s(k.flops, k.bytes, k.gemm_dim, k.attention_kernel) + dev.memory_time_s(k.pointwise_bytes);
  };
  return {time(c.f), time(c.b), time(c.w)};
}

// Recomputation re-runs forward work inside the backward: every part under full recomputation, the attention chunk
// (projections and core) under the plan's selective recomputation (activations.h).
inline Fbw with_recompute(Fbw t, Part part, Recompute recompute) {
  if (recompute == Recompute::kFull) t.b += t.f;
  if (recompute == Recompute::kSelective && (part == Part::kAttention || part == Part::kAttentionCore)) t.b += t.f;
  return t;
}

// The step time from its four parts, then tokens per step and per second and MFU (estimate.h's formulas), for a
// strategy whose out->time is filled; both closed forms (estimate.cc, estimate_af.cc) end with it.
inline void finish_step(const Strategy& s, double seq_len, double flops_per_token, double peak_flops, Estimate* out) {
  out->step_time_s = out->time.compute_s + out->time.exposed_comm_s + out->time.bubble_s + out->time.optimizer_s;
  out->tokens_per_step = static_cast<double>(s.global_batch()) * seq_len;
  out->tokens_per_s = out->tokens_per_step / out->step_time_s;
  out->mfu = flops_per_token * out->tokens_per_s / (static_cast<double>(s.world_size()) * peak_flops);
}

}  // namespace piper::cost
