// Pieces shared by the closed form's translation units (estimate.cc, estimate_af.cc, estimate_dp.cc); not part of
// the API.
#pragma once

#include <algorithm>

#include "piper/cost/copy_cost.h"
#include "piper/cost/device_model.h"
#include "piper/cost/estimate.h"
#include "piper/cost/layer_cost.h"
#include "piper/cost/task_profile.h"
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

// One microbatch's F, B and W of a part's priced tasks on `dev` (compute roofline plus pointwise memory traffic plus
// fixed costs per call), as the simulator prices each task (sim/task_time.cc).
inline Fbw part_fbw(const PartCost& c, const DeviceModel& dev) {
  return {task_time_s(c.f, dev), task_time_s(c.b, dev), task_time_s(c.w, dev)};
}

// Recomputation re-runs forward work inside the backward: every part under full recomputation, the attention chunk
// (projections and core) under the plan's selective recomputation (activations.h).
inline Fbw with_recompute(Fbw t, Part part, Recompute recompute) {
  if (recompute == Recompute::kFull) t.b += t.f;
  if (recompute == Recompute::kSelective && (part == Part::kAttention || part == Part::kAttentionCore)) t.b += t.f;
  return t;
}

// The strategy's pipeline as the closed form walks it (Strategy::schedule_kind and chunks_per_rank read the
// schedule's name, so they are read once per estimate).
struct PipelineShape {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int p = 1, v = 1, m = 1;  // pipeline ranks, chunks per rank, microbatches
  int stages() const { return p * v; }
};

// Communication groups of the mesh (estimate.cc's mesh_groups): ranks are numbered with the first axis of `order`
// innermost.
struct MeshGroups {
  GroupLayout tp, ep, dp, expert_dp;
  GroupLayout etp;  // the etp consecutive tensor ranks that slice the same experts (size 1 folded: etp = 1)
  bool pp_cross_node = false;
};

// Each part's F, B and W for one microbatch (layer_cost.h), alone and with the strategy's recomputation.
// A part's times at its task profile's scales (cost/task_profile.h).
inline Fbw scaled(const Fbw& t, const TaskScales& s, Part part) {
  return {t.f * s.of(part, 0), t.b * s.of(part, 1), t.w * s.of(part, 2)};
}

struct PartTimes {
  Fbw t[kNumParts];
  double update_scale = 1;  // the optimizer step's (TaskScales::update)
  Recompute recompute = Recompute::kNone;
  Fbw operator()(Part q) const { return t[static_cast<int>(q)]; }
  Fbw recomputed(Part q) const { return with_recompute((*this)(q), q, recompute); }
  // A layer's attention chunk: projections, core and norms.
  Fbw attention() const {
    Fbw a = recomputed(Part::kAttention);
    a += recomputed(Part::kAttentionCore);
    a += recomputed(Part::kNorms);
    return a;
  }
};

// The parameters a rank of the stage holds: the dense part (split over tp) and its local experts (over etp).
struct RankParams {
  double dense = 0, expert = 0;
};

// Routed experts per expert-parallel rank, and the ranks each expert's replicas are sharded over by ZeRO.
inline double local_experts(const CostModel& cm, const Strategy& s) { return cm.parts().num_experts / s.ep; }
inline int expert_shard(const Strategy& s) { return std::max(1, s.expert_replicas()); }

// What the data-parallel sync needs of the bottleneck rank.
struct DpSyncInputs {
  int rank = 0;  // pipeline rank
  RankParams params;
  double t_f = 0, t_b = 0;  // one microbatch's forward, and backward with W, stretched by exposed TP and EP time
  double ep_layer_s = 0;    // a MoE layer's EP all-to-alls, both passes
  double ep_exposed_s = 0;  // the rank's EP time per microbatch that compute does not hide
};

// The data-parallel sync per step left exposed on that rank (estimate_dp.cc): the gradient all-reduce (ZeRO-0), the
// reduce-scatter and parameter all-gather (ZeRO-1), or ZeRO-2/3's per-microbatch collectives of each FSDP unit.
double dp_exposed_s(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const PartTimes& pt,
                    const MeshGroups& g, const DpSyncInputs& in);

// One rank's seconds per byte that its node's cores copy for its transfers of `kind`, at its static share of the cores
// of a node whose ranks share them (copy_cost.h; one core at most); 0 elsewhere. Each kind of a rank's communication
// costs at least its bytes at this rate (add_copies in estimate.cc, the af-pipe closed form in estimate_af.cc).
double copy_seconds_per_byte_at_share(const CostModel& cm, CopyKind kind);
// The same for the copies that stage a data-parallel collective (copy_cost.h staging_seconds_per_byte).
double staging_seconds_per_byte_at_share(const CostModel& cm);

// The bytes one rank's data-parallel synchronisation copies in a step: (n - 1)/n of each ring collective's tensor
// per reduce-scatter or all-gather, twice per all-reduce (ZeRO-0); ZeRO-2 reduce-scatters per microbatch, ZeRO-3
// also gathers before each F and B. fd / fe: (n - 1)/n of the dense and the experts' data-parallel groups.
inline double dp_copy_bytes(int zero, double m, double fd, double fe, double grad_d, double grad_e, double par_d,
                            double par_e) {
  if (zero == 0) return 2 * (fd * grad_d + fe * grad_e);
  if (zero == 1) return fd * (grad_d + par_d) + fe * (grad_e + par_e);
  if (zero == 2) return m * (fd * grad_d + fe * grad_e) + fd * par_d + fe * par_e;
  return m * (fd * (grad_d + 2 * par_d) + fe * (grad_e + 2 * par_e));
}

// dp_copy_bytes priced: the gradients' bytes are summed (reduce-scatters, all-reduces), the parameters' gathered.
inline double dp_copy_seconds(const CostModel& cm, int zero, double m, double fd, double fe, double grad_d,
                              double grad_e, double par_d, double par_e) {
  return copy_seconds_per_byte_at_share(cm, CopyKind::kSummed) * dp_copy_bytes(zero, m, fd, fe, grad_d, grad_e, 0, 0) +
         copy_seconds_per_byte_at_share(cm, CopyKind::kGathered) * dp_copy_bytes(zero, m, fd, fe, 0, 0, par_d, par_e);
}

// The bytes a rank's own copies move per step to stage its data-parallel collectives over p ranks of a chunk's `grad`
// and `param` bytes (copy_cost.h dp_staged_bytes): zero=0 one all-reduce; ZeRO-1 a reduce-scatter and an all-gather;
// ZeRO-2 m accumulating reduce-scatters and an all-gather; ZeRO-3 those and 2 m gathers before each F and B.
inline double dp_staging_bytes(int zero, double m, int p, double grad, double param) {
  if (p < 2) return 0;
  if (zero == 0) return dp_staged_bytes(DpStaging::kAllReduce, grad, p);
  if (zero == 1) {
    return dp_staged_bytes(DpStaging::kReduceScatter, grad, p) +
           dp_staged_bytes(DpStaging::kGatherAfterUpdate, param, p);
  }
  const double rs = m * dp_staged_bytes(DpStaging::kAccumulatingReduceScatter, grad, p);
  if (zero == 2) return rs + dp_staged_bytes(DpStaging::kGatherAfterUpdate, param, p);
  return rs + 2 * m * dp_staged_bytes(DpStaging::kGatherForCompute, param, p);
}

// The same for a rank's dense chunks over dp (pd ranks) and its experts over edp (pe ranks), as dp_copy_bytes
// takes them.
inline double dp_staging_bytes(int zero, double m, int pd, int pe, double grad_d, double grad_e, double par_d,
                               double par_e) {
  return dp_staging_bytes(zero, m, pd, grad_d, par_d) + dp_staging_bytes(zero, m, pe, grad_e, par_e);
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
