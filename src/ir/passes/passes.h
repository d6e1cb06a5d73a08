// The graph rewrites behind the directives, one per file, registered by directive name.
//
// apply_directives() runs each directive's pass in list order; with `verify_each` the graph verifier runs after
// every pass (tests turn it on; the compile driver turns it on in debug builds). Every error is prefixed with
// the directive's label: "directive 4 (order): ...".
#pragma once

#include <vector>

#include "piper/base/status.h"
#include "piper/ir/directive.h"
#include "piper/ir/graph.h"

namespace piper::ir {

struct ApplyOptions {
#ifdef NDEBUG
  bool verify_each = false;
#else
  bool verify_each = true;
#endif
  // Check a run of consecutive order directives for cycles once, after its last directive, instead of after each.
  // Order directives only add temporal edges and subdivide edges (split_backward moves a BW's weight-gradient
  // edges behind B -> W), so a graph that has a cycle after one of them still has one at the end of the run: an
  // acyclic end means every directive of the run would have passed its own check, and the graph is the same. When
  // the end has a cycle (or anything fails) the error names no directive ("order directives ... make a cycle"):
  // the caller re-applies every directive with this off for the exact message (compile::compile_directives does).
  bool defer_order_cycle_checks = false;
};

Status apply_directive(Graph& graph, const Directive& directive);
Status apply_directives(Graph& graph, const std::vector<Directive>& directives, const ApplyOptions& options = {});

// One function per pass (src/ir/passes/<name>.cc).
Status apply_split(Graph& graph, const SplitDirective& d);
Status apply_place(Graph& graph, const PlaceDirective& d);
Status apply_replicate(Graph& graph, const ReplicateDirective& d);
Status apply_shard(Graph& graph, const ShardDirective& d);
// After every directive: with sequence parallelism (tp > 1), a MoE layer whose experts are not sharded over ep
// still routes a token slice per tensor rank (the hidden states between tp chunks are 1/tp of the rows), so its
// router's and experts' per-token bytes (stash, checkpoint, backward working set, B -> W gradients) are divided by
// tp, as shard ep divides them when it shards the experts and as the closed form counts every MoE term.
void split_unsharded_moe_tokens(Graph& graph);
// After every directive (tp_grad_sum.cc): with tp > 1, an all_reduce over tp (group "tp", the chunk's part tag,
// stream "tp_grad", is_tp_grad_sum) of each chunk's gradients that are partial sums over tp, between its gradient
// (after its data-parallel reduction, if any) and its update: the tensors a split chunk keeps whole
// (Node::tp_whole_params) and, under sequence parallelism, every tensor of an unsplit chunk except experts reduced
// over edp. Under ZeRO the shard's share (ceil(partial / degree) elements).
void add_tp_grad_sums(Graph& graph);
// check_cycles = false: the caller checks for cycles later (ApplyOptions::defer_order_cycle_checks).
Status apply_order(Graph& graph, const OrderDirective& d, bool check_cycles = true);
Status apply_stream(Graph& graph, const StreamDirective& d);
Status apply_recompute(Graph& graph, const RecomputeDirective& d);
Status apply_disaggregate(Graph& graph, const DisaggregateDirective& d);

// Not a directive: rewrites fused BW chunks into B (input grad) -> W (weight grad). `order` runs it on the
// chunks its B/W filters name, so a schedule can split some backwards (zero-bubble steps) and keep others
// fused (a fused backward's input gradient is available only when its weight gradient is done, too).
// Nodes that are not BW chunks are skipped.
void split_backward(Graph& graph, const std::vector<NodeId>& nodes);
void split_backward(Graph& graph);  // all BW chunks

}  // namespace piper::ir
