// The closed form's data-parallel sync (CostModel::estimate, estimate.cc): what the bottleneck rank's gradient and
// parameter collectives add to the step beyond the compute they overlap. ZeRO-0 and ZeRO-1 sync once per step;
// ZeRO-2/3 run per-microbatch collectives of each FSDP unit on the NIC stream, priced as a cycle of the rank's units.
#include <algorithm>

#include "piper/cost/estimate_internal.h"
#include "piper/cost/pipeline_model.h"

namespace piper::cost {
namespace {

// ZeRO-2/3's exposed time per microbatch on rank r (ZeRO-2: reduce-scatters only). Items are FSDP units (a
// layer's chunks of one pass; the embedding; the head), F in layer order, then B (+ W) in reverse; on the
// cyclic sequence (steady state: a microbatch's backward is followed by another's forward) the gathers of unit
// j+1 start when unit j's compute starts (the compiler's window of two gathered units, stream_order.cc), so
// unit j+1 starts max(c_j, d_{j+1}) after unit j: exposed = sum_j max(0, d_{j+1} - c_j), where d is the NIC
// stream's work before unit j+1 may run: its gathers, plus in the backward the reduce-scatters of unit j, plus
// the EP dispatches and combines of unit j.
struct FsdpItem {
  double f = 0, bw = 0;            // compute: forward; backward + weight gradient (with recomputation)
  double ag = 0, rs = 0, a2a = 0;  // NIC: all-gather, reduce-scatter, EP all-to-all per pass
  bool moe = false;                // a MoE layer's unit: its compute also waits for the EP all-to-alls
  FsdpItem& operator+=(const FsdpItem& o) {
    f += o.f;
    bw += o.bw;
    ag += o.ag;
    rs += o.rs;
    a2a += o.a2a;
    return *this;
  }
};

FsdpItem fsdp_item(const CostModel& cm, const Strategy& s, Fbw t, double params, const GroupLayout& ring) {
  FsdpItem it;
  it.f = t.f;
  it.bw = t.b + t.w;
  it.ag = s.zero >= 3 ? cm.network().all_gather_s(params * cm.bytes().param, ring) : 0.0;  // ZeRO-2: no gathers
  it.rs = cm.network().reduce_scatter_s(params * cm.bytes().grad, ring);
  return it;
}

// Rank r's FSDP units: a dense layer, a MoE layer, the embedding, the head, and an attention chunk alone (the
// cycle's start on a rank without the embedding).
struct FsdpUnits {
  FsdpItem dense, moe, emb, head, attn;
};

bool rank_has_first_stage(const PipelineShape& pl, int r) {
  bool has = false;
  for (int c = 0; c < pl.v; ++c) has = has || stage_of_chunk(pl.kind, pl.p, pl.v, r, c) == 0;
  return has;
}

FsdpUnits fsdp_units(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const PartTimes& pt,
                     const MeshGroups& g, double ep_layer_s, int r) {
  const PartTable& table = cm.parts();
  FsdpUnits u;
  // From the parts' own times: LayerTimes::attn also carries tp_overlap's slower GEMMs, these units do not.
  u.attn = fsdp_item(cm, s, pt.attention(), table.attention_params / s.tp + table.norm_params_per_layer, g.dp);
  const FsdpItem router = fsdp_item(cm, s, pt.recomputed(Part::kRouter), table.router_params, g.dp);
  FsdpItem experts =
      fsdp_item(cm, s, pt.recomputed(Part::kExperts),
                expert_shard(s) > 1 ? local_experts(cm, s) * table.expert_params / s.etp : 0, g.expert_dp);
  // Dispatch + combine in each pass, on the NIC only when the expert group spans nodes (folded EP 8 inside a node
  // runs over NVLink beside the gathers).
  experts.a2a = g.ep.nodes > 1 ? ep_layer_s / 2 : 0.0;
  const FsdpItem shared = fsdp_item(cm, s, pt.recomputed(Part::kSharedExperts), table.shared_params / s.tp, g.dp);
  const FsdpItem mlp = fsdp_item(cm, s, pt.recomputed(Part::kDenseMlp), table.dense_mlp_params / s.tp, g.dp);
  // The order of the chunks inside a unit does not change its sums.
  u.dense = u.attn;
  u.dense += mlp;
  u.moe = u.attn;
  u.moe += router;
  u.moe += experts;
  if (table.shared_params > 0) u.moe += shared;
  u.moe.moe = true;
  const bool tied_here = cm.model().tie_embeddings && rank_has_first_stage(pl, r);
  u.emb = fsdp_item(cm, s, pt(Part::kEmbedding), table.embedding_params / s.tp, g.dp);
  u.head = fsdp_item(cm, s, pt(Part::kHead), !tied_here ? table.head_params / s.tp : 0.0, g.dp);
  return u;
}

// Calls fn(unit) for rank r's tasks of one pass in execution order: F in layer order, B in reverse.
template <typename Fn>
void visit_fsdp_units(const CostModel& cm, const PipelineShape& pl, const FsdpUnits& u, int r, bool backward, Fn&& fn) {
  const ScheduleKind kind = pl.kind;
  const int p = pl.p, v = pl.v, stages = pl.stages();
  for (int i = 0; i < v; ++i) {
    const int c = backward ? v - 1 - i : i;
    const int st = stage_of_chunk(kind, p, v, r, c);
    const auto [lo, hi] = stage_layers(cm.model().num_layers, stages, st);  // the compiler's partition
    if (backward && st == stages - 1) fn(u.head);
    if (!backward && st == 0) fn(u.emb);
    for (int k = lo; k < hi; ++k) {
      const int l = backward ? hi - 1 - (k - lo) : k;
      fn(cm.moe_layers_before(l + 1) > cm.moe_layers_before(l) ? u.moe : u.dense);
    }
    if (backward && st == 0) fn(u.emb);
    if (!backward && st == stages - 1) fn(u.head);
  }
}

// The cycle: F tasks, then B tasks; the first F task follows the last B task (the first F task, backward). A MoE
// unit lasts its compute plus the time it waits for its all-to-alls (the closed form's exposed EP time per
// microbatch, spread over the rank's MoE units of both passes): the gathers run beside that wait too.
double fsdp_exposed_per_microbatch(const CostModel& cm, const PipelineShape& pl, const FsdpUnits& u, double ep_exposed,
                                   int r) {
  int moe_units = 0;
  visit_fsdp_units(cm, pl, u, r, false, [&](const FsdpItem& x) { moe_units += x.moe ? 2 : 0; });
  const double ep_wait = moe_units > 0 ? ep_exposed / moe_units : 0.0;
  FsdpItem prev = stage_of_chunk(pl.kind, pl.p, pl.v, r, 0) == 0 ? u.emb : u.attn;
  bool prev_fwd = false;
  double exposed = 0;
  for (bool backward : {false, true}) {
    visit_fsdp_units(cm, pl, u, r, backward, [&](const FsdpItem& cur) {
      const double c_prev = (prev_fwd ? prev.f : prev.bw) + (prev.moe ? ep_wait : 0.0);
      const double d = cur.ag + prev.a2a + (prev_fwd ? 0.0 : prev.rs);
      exposed += std::max(0.0, d - c_prev);
      prev = cur;
      prev_fwd = !backward;
    });
  }
  return exposed;
}

}  // namespace

// DP: the gradient sync of the dense part over dp and of the experts over their replicas.
double dp_exposed_s(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const PartTimes& pt,
                    const MeshGroups& g, const DpSyncInputs& in) {
  const RankParams& params = in.params;
  const double t_f = in.t_f, t_b = in.t_b;
  const Network& net = cm.network();
  const double dense_grad_b = params.dense * cm.bytes().grad;
  const double expert_grad_b = params.expert * cm.bytes().grad;
  const double dense_param_b = params.dense * cm.bytes().param;
  const double expert_param_b = params.expert * cm.bytes().param;
  const int m = pl.m;
  if (s.zero == 0) {
    double ar = net.all_reduce_s(dense_grad_b, g.dp) + net.all_reduce_s(expert_grad_b, g.expert_dp);
    // Overlapped with the last microbatch's backward, unless the all-reduce runs after the whole backward
    // (Calibration::dp_reduce_after_backward: 2021 Megatron-LM's --DDP-impl local).
    return cm.calibration().dp_reduce_after_backward ? ar : std::max(0.0, ar - t_b);
  }
  // ZeRO-1 and ZeRO-2 gather the updated parameters once per step, overlapped with the next first forward.
  auto param_gather_s = [&] {
    return net.all_gather_s(dense_param_b, g.dp) + net.all_gather_s(expert_param_b, g.expert_dp);
  };
  if (s.zero == 1) {
    double rs = net.reduce_scatter_s(dense_grad_b, g.dp) + net.reduce_scatter_s(expert_grad_b, g.expert_dp);
    return std::max(0.0, rs - t_b) + std::max(0.0, param_gather_s() - t_f);
  }
  const FsdpUnits units = fsdp_units(cm, s, pl, pt, g, in.ep_layer_s, in.rank);
  const double fsdp_exposed = fsdp_exposed_per_microbatch(cm, pl, units, in.ep_exposed_s, in.rank);
  // ZeRO-2 reduce-scatters each chunk's gradients per microbatch (the compiler's replicate pass), on the NIC
  // stream with the EP all-to-alls: the same cycle without gathers; the updated parameters are gathered once.
  if (s.zero == 2) return m * fsdp_exposed + std::max(0.0, param_gather_s() - t_f);
  // ZeRO-3: per microbatch and parameter chunk (embedding, attention, router, experts, shared experts or dense MLP,
  // head -- the compiler's replicate pass): an all-gather before its F, another before its B, a reduce-scatter
  // after its W, each a separate ring paying (n-1) alpha. The prefetch window (two gathered chunks) lets chunk
  // j+1's gather overlap only chunk j's compute, and one NIC stream carries the gathers, the reduce-scatters and
  // the EP all-to-alls; see docs/resource_model.md "ZeRO-3".
  return m * fsdp_exposed;
}

}  // namespace piper::cost
