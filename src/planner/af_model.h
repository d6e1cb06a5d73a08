// The roofline model of disaggregated attention/FFN training (DisagMoE-style AF-Pipe) that the allocator
// (disaggregate.h) optimises. docs/planner.md derives it; /work/shared/reference/disaggregation.md §5 sketches it.
//
// A-workers (attention group, `attn` GPUs) run embedding, attention, norms, router, shared experts, dense layers
// and the head, data-parallel over dp_a = attn / pp ranks per stage. F-workers (`ffn` GPUs) hold the routed
// experts of every MoE layer, ffn / pp per stage, expert-parallel over ep and replicated over the rest. Per
// microbatch (mbs sequences of seq_len tokens on every A rank) a stage costs, on its busiest GPU:
//   attention compute  t_a = T * FLOPs_A(stage) / (peak * eff(T))                        T = mbs * seq_len
//   expert compute     t_f = dp_a * T * FLOPs_F(stage) / (ffn/pp) / (peak * eff(tokens per expert))
//   A<->F traffic      every A rank sends each token to d distinct F ranks and gets one combined vector back,
//                      forward and (transposed) backward: X = T * h * act_bytes * (d + 1) per direction per MoE
//                      layer. All `attn` ranks exchange at once, through `ports_a` ports on the A side and
//                      `ports_f` on the F side: t_net,c = attn * X / (ports_c * port_bw).
// Ports are NICs (port_bw = NIC bandwidth), or device links on a one-node cluster (one per GPU). A group can
// use the ports of the nodes it occupies. Placement kNode gives each group whole nodes:
// ports_c <= nics_per_node * ceil(gpus_c / devices_per_node). Placement kSpread (default; DisagMoE splits GPUs
// and NICs separately) spreads each group over as many nodes as it has GPUs, so any NIC of those nodes may
// serve it: ports_c <= nics_per_node * min(nodes, gpus_c). Traffic between A and F GPUs of one node is still
// counted on the NICs (pessimistic for kSpread).
// Per step (m = global_batch / (dp_a * mbs) microbatches) every resource works m times per stage:
//   step = m * max(t_a, t_f, t_net,a, t_net,f) + fill,   fill = (2 pp - 1) * (t_a + t_f) / 2
// (AF-Pipe keeps A, F and the network busy at once; fill is the pipeline warm-up over 2 pp compute stages).
// Recomputation (full) applies to both groups: A re-runs its stage forward, A dispatches the tokens again in
// the backward and F re-runs the expert forward (F compute +1/3, A->F bytes (2d + 1) instead of (d + 1) per
// direction), so both sides hold only layer inputs (A) or one layer being recomputed (F).
// Gradient synchronisation and the optimizer step are not modelled (the same for every split to first order).
// A component is network-bound when its arithmetic intensity (FLOPs per byte of A<->F traffic) is below the
// machine balance of its allocation, gpus * peak * eff / (ports * port_bw): its turning point.
#pragma once

#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/cost/device_model.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::planner {

// One GPU split: everything that does not depend on the port split.
struct AfCandidate {
  int attn = 0, ffn = 0, pp = 1, ep = 1, dp_a = 1, microbatches = 1;
  Recompute recompute = Recompute::kNone;
  double step_attn_s = 0;  // m * t_a
  double step_ffn_s = 0;   // m * t_f
  double step_bytes = 0;   // m * attn * X: bytes through each side's ports per direction per step
  double fill_s = 0;
  int max_ports_attn = 0, max_ports_ffn = 0;
  double mem_attn_bytes = 0, mem_ffn_bytes = 0;
  double distinct_ffn_ranks = 1;  // d
  Strategy strategy() const;      // the af-pipe Strategy (disagg=1), which estimate() prices (cost/estimate_af.cc)
};

enum class AfPlacement { kSpread, kNode };
const char* to_string(AfPlacement p);
Result<AfPlacement> parse_af_placement(const std::string& text);

struct AfOptions {
  AfPlacement placement = AfPlacement::kSpread;
  std::vector<int> pp = {1, 2, 4, 8, 16};
  std::vector<Recompute> recompute = {Recompute::kNone, Recompute::kFull};
  int mbs = 1;
  double memory_fraction = 0.95;
  double busy_weight = 1e-4;  // objective weight on the less busy group's compute time (keep both busy)
};

class AfModel {
 public:
  static Result<AfModel> create(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                const AfOptions& options);

  // Every GPU split allowed by batch, pipeline, expert and memory rules; `rejected` counts the others by reason.
  std::vector<AfCandidate> candidates(std::vector<std::pair<std::string, int64_t>>* rejected) const;
  // Per-step times of a candidate with `ports_attn` ports on the A side (the rest on the F side).
  double net_attn_s(const AfCandidate& c, int ports_attn) const;
  double net_ffn_s(const AfCandidate& c, int ports_attn) const;
  double bottleneck_s(const AfCandidate& c, int ports_attn) const;  // max of the four per-step times
  double step_time_s(const AfCandidate& c, int ports_attn) const { return bottleneck_s(c, ports_attn) + c.fill_s; }
  // The allocator's objective: step time minus busy_weight * the smaller of the two compute times.
  double objective(const AfCandidate& c, int ports_attn) const;
  bool ports_feasible(const AfCandidate& c, int ports_attn) const;

  // Arithmetic intensity (FLOPs per byte of A<->F traffic, forward + backward) of each component.
  double attn_intensity() const { return attn_flops_per_token_ / bytes_per_token_; }
  double ffn_intensity() const { return ffn_flops_per_token_ / bytes_per_token_; }
  // Machine balance (FLOPs per byte) of `gpus` GPUs sharing `ports` ports.
  double balance(int gpus, int ports) const;
  // Sequence length at which attention's intensity reaches `balance` (attention core FLOPs grow with it).
  double attn_turning_seq(double balance_flops_per_byte) const;
  // Model FLOPs utilisation of a step (training FLOPs per token, no recomputation, over all GPUs).
  double mfu(double step_time_s) const;

  double busy_weight() const { return options_.busy_weight; }
  int total_ports() const { return total_ports_; }
  int ports_per_node() const { return ports_per_node_; }  // NICs of a node (GPUs on one node)
  // The attention group's ports when each group uses the NICs of the nodes its GPUs fill in rank order (attention
  // first; the simulator's placement without a split, cost/nic_split.h): attn x NICs per GPU.
  int natural_ports_attn(const AfCandidate& c) const {
    return ports_are_nics_ ? c.attn * ports_per_node_ / cluster_.node.devices_per_node : c.attn;
  }
  int world() const { return world_; }
  double port_bw() const { return port_bw_; }
  bool ports_are_nics() const { return ports_are_nics_; }

 private:
  AfModel() = default;
  ModelSpec model_;
  ClusterSpec cluster_;
  TrainSpec train_;
  AfOptions options_;
  int world_ = 1, total_ports_ = 1, ports_per_node_ = 1;
  bool ports_are_nics_ = false;
  double port_bw_ = 0, peak_ = 0, memory_limit_ = 0;
  // Per token, whole model, F + B + W: A side, F side; bytes per token per direction with d = top_k.
  double attn_flops_per_token_ = 0, ffn_flops_per_token_ = 0, bytes_per_token_ = 0;
  double attn_core_flops_per_token_per_seq_ = 0;  // d(attention FLOPs per token)/d(seq_len)
  double model_flops_per_token_ = 0;
  cost::Calibration calibration_;
};

}  // namespace piper::planner
