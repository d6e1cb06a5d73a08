// Small value types of the IR: node ids, mesh degrees, passes (tasks), node kinds, integer ranges and tag filters.
// They are also the compiled Plan's vocabulary (compile/plan.h includes this header, not graph.h).
//
// Every node carries tags {layer, part, mb, pass} plus `stage` once a place directive assigned one. A TagFilter
// selects nodes by those tags: an unset field matches anything. JSON form (all keys optional):
//   {"layer": "0-7" | 3, "stage": "0-1" | 0, "mb": "0-3" | 2, "part": "experts", "pass": "F"|"B"|"W"|"BW"|"U"}
// Ranges are inclusive ("0-7" is 8 values). A filter on `stage`/`layer`/`mb` never matches a node without that
// tag (e.g. an update node has no mb), so {"mb": 0} selects only microbatch-0 work.
#pragma once

#include <cstdint>
#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/spec/part.h"

namespace piper::ir {

using NodeId = int32_t;
inline constexpr NodeId kNoNode = -1;

// Mesh degrees the graph is distributed over (set by whoever builds it; directives are checked against them).
struct MeshInfo {
  int pp = 1;
  int vpp = 1;  // stages per pipeline rank
  int dp = 1;
  int ep = 1;
  int tp = 1;
  // MoE parallel folding (Strategy::fold): expert groups are ep consecutive ranks of a stage's tp*dp ranks (tp
  // innermost) instead of ep dp-ranks at stride tp.
  bool fold = false;
  // Expert tensor parallelism (Strategy::etp, Megatron's --expert-tensor-parallel-size; divides tp, unfolded only):
  // each expert's FFN is sliced over the etp consecutive tensor ranks of an "etp" group (fc1 column-, fc2 row-
  // parallel); the rows those ranks received from their dispatches (with ep = 1: routed themselves) are
  // all-gathered over the group before the expert GEMMs and the partial outputs reduce-scattered (summed) back
  // after, so each rank keeps its own rows. A rank's expert slice is tp_c % etp.
  int etp = 1;
  // Stages when they are not pp*vpp (0: pp*vpp). af-pipe with unequal attention and FFN groups cuts the model
  // into 2 * num_layers stages over attn_groups + ffn_groups pipeline ranks, which need not divide it.
  int stages = 0;
  int num_stages() const { return stages > 0 ? stages : pp * vpp; }
  // Ranks of a pipeline stage holding the same ep-sharded expert slice (group "edp"): tp*dp / (ep*etp). Unfolded,
  // the dp / ep expert-data-parallel ranks times the tp / etp ranks with the same expert slice, which route
  // different tokens (T / tp). With etp = 1 (Megatron's --expert-tensor-parallel-size 1) every tensor rank keeps
  // whole experts.
  int expert_replicas() const { return dp * tp / (ep * etp); }
  // The one rule for where the experts' gradients are reduced, read by the compiler (ir replicate pass), the plan
  // check (compile/verify_plan.cc), the runtime (DistContext, executor_dp/ep/tp) and, through the plan's edp groups,
  // the simulator and memory plan. True: the compiler reduces the experts' gradients in the backward over the plan's
  // edp group (expert_replicas() ranks of a stage, tensor ranks included; Megatron's expert-data-parallel group),
  // and nothing else sums them over tp. That is when each tensor rank's experts saw a different slice of the
  // tokens: folded tp x ep, expert tensor parallelism, or sequence parallelism with tp > 1 (any ep, etp = 1: every
  // tensor rank keeps whole experts and routes T / tp tokens, so its expert gradients are partial sums over tp).
  // The reduction then averages over dp * tp / ep ranks; the executors scale it by tp / (ep * etp) into the mean
  // over the data-parallel replicas of the sum over the tensor ranks' token slices (ExpertParallel::prepare_norm).
  // `sequence_parallel` is the graph's / plan's (ir::Graph::sequence_parallel, compile::Plan::sequence_parallel).
  bool experts_reduce_over_edp(bool sequence_parallel) const {
    return etp > 1 || (tp > 1 && ((fold && ep > 1) || sequence_parallel));
  }
  // Whether some of a chunk's gradients are partial sums over tp, to be summed over the tensor ranks before its
  // update: a chunk split over tp (the tensors it keeps whole), or under sequence parallelism any chunk (each tensor
  // rank saw a token slice) but the experts when they reduce over edp, which sums those slices. One rule for the
  // compiler (ir add_tp_grad_sums), the plan check and the runtime (compile::Plan::grads_partial_over_tp).
  bool grads_partial_over_tp(bool split_over_tp, bool experts, bool sequence_parallel) const {
    if (tp <= 1) return false;
    if (split_over_tp) return true;
    return sequence_parallel && !(experts && experts_reduce_over_edp(sequence_parallel));
  }
  // A rank's expert coordinate and expert group (ranks sharing `ep_block`) from its dp and tp coordinates.
  int ep_coord(int dp_c, int tp_c) const { return fold ? (dp_c * tp + tp_c) % ep : dp_c % ep; }
  int ep_block(int dp_c, int tp_c) const { return fold ? (dp_c * tp + tp_c) / ep : dp_c / ep * tp + tp_c; }
  bool operator==(const MeshInfo&) const = default;
};

// The task a node performs. BW is a fused backward (input and weight gradients in one go, its outputs available
// when both are done); the split-backward rewrite turns a BW into B (input grad) -> W (weight grad).
// U is the optimizer update. kNone is used by comm nodes that belong to no single pass.
enum class Pass : uint8_t { kNone, kF, kB, kW, kBW, kU };
const char* to_string(Pass p);
// The key a chunk's task of `pass` is timed and profiled under: "<chunk>.<pass>" ("attn.F", "experts.BW"; spec/part.h
// chunk_name), as the runtime's per-task seconds, `piper calibrate --model`'s task profile and the cost model's
// reading of it (cost/task_profile.h) name it.
std::string task_key(Part part, Pass pass);
Result<Pass> parse_pass(const std::string& text, const std::string& what);
// True for the passes that run in the backward direction (B, W, BW).
inline bool is_backward(Pass p) { return p == Pass::kB || p == Pass::kW || p == Pass::kBW; }

enum class NodeKind : uint8_t {
  kChunk,  // computation: tasks F, B, W, BW
  kSend,
  kRecv,
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kAllToAll,
  kM2N,     // unidirectional many-to-many exchange between an attention group and an expert group
  kUpdate,  // optimizer step of one parameter shard
};
const char* to_string(NodeKind k);
bool is_collective(NodeKind k);  // all_reduce, reduce_scatter, all_gather, all_to_all, m2n
bool is_comm(NodeKind k);        // collectives plus send/recv

// Inclusive range [lo, hi]; empty() when unset (lo > hi).
struct IntRange {
  int lo = 1;
  int hi = 0;
  bool empty() const { return lo > hi; }
  bool contains(int v) const { return v >= lo && v <= hi; }
  static IntRange single(int v) { return {v, v}; }
  bool operator==(const IntRange&) const = default;
};
// "3" or "0-7" or a JSON integer. Errors name `what`.
Result<IntRange> parse_range(const Json& value, const std::string& what);
Json range_to_json(const IntRange& r);

struct Tags {
  int layer = -1;      // model layer; -1 for embedding-less nodes such as the loss head (uses num_layers)
  std::string part;    // "embed", "attn", "router", "dispatch", "experts", "shared", "combine", "mlp", "head", ...
  int mb = -1;         // microbatch; -1 until split
  Pass pass = Pass::kNone;
  int stage = -1;      // pipeline stage; -1 until placed
};

struct TagFilter {
  IntRange layer;
  IntRange stage;
  IntRange mb;
  std::string part;  // "" = any
  Pass pass = Pass::kNone;  // kNone = any

  bool matches(const Tags& t) const;
  Json to_json() const;
  // `what` names the filter in errors ("directive 3 (order).slots[2][0]").
  static Result<TagFilter> from_json(const Json& j, const std::string& what);
  // Short text form for messages: "{stage=0,mb=3,pass=F}".
  std::string to_string() const;
  bool operator==(const TagFilter&) const = default;
};

// Convenience constructor used by schedule generators: stage s, microbatch mb, pass p.
TagFilter stage_filter(int stage, int mb, Pass pass);

}  // namespace piper::ir
