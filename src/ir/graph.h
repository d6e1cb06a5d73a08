// Graph: the global training DAG of chunk, comm and update nodes joined by data and temporal edges.
//
// One Graph describes one training step for one pipeline rank *per node*: data/expert/tensor replication is an
// attribute of a node (its collectives carry a `group` axis), not extra copies, so the graph size depends on
// layers x microbatches x passes, never on dp or ep. Passes (src/ir/passes/) rewrite it in place; node ids are
// dense indices and stay valid across rewrites except `split`, which rebuilds the graph.
// Edges are never erased from storage: remove_edge() marks them dead and iteration helpers skip dead edges.
// Thread-safety: a Graph is a value; no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/ir/types.h"

namespace piper::ir {

enum class EdgeKind : uint8_t { kData, kTemporal };

struct Edge {
  NodeId src = kNoNode;
  NodeId dst = kNoNode;
  EdgeKind kind = EdgeKind::kData;
  int64_t bytes = 0;  // tensor bytes per microbatch for data edges (0 when unknown)
  bool alive = true;
};

struct Node {
  NodeId id = kNoNode;
  NodeKind kind = NodeKind::kChunk;
  Tags tags;
  std::string name;  // readable, unique enough for messages: "L3.attn.F" (+ ".mb2" after split)

  // Placement.
  int pp_rank = -1;                // set by place; -1 = not placed
  std::string stream = "compute";  // logical stream; comm nodes default to their group's stream

  // Per-node cost inputs (element counts / bytes; the cost model turns them into time and memory).
  int64_t param_count = 0;       // parameters this chunk owns (update nodes: the shard they step)
  // Chunks: of param_count, the parameters that stay whole on every tensor rank when the chunk is split over tp
  // and whose gradients are then partial sums over tp (the chunk's norm, a per-head-dim QK norm; build_graph.cc
  // tp_whole_params), summed by add_tp_grad_sums (ir/passes/passes.h).
  int64_t tp_whole_params = 0;
  int64_t flops = 0;             // per microbatch, filled by build_graph for chunk tasks
  int64_t activation_bytes = 0;  // activations kept from F until its backward
  // The part of activation_bytes every tensor-parallel rank keeps whole without sequence parallelism (a
  // projection's replicated input, the norm's input), and what a recomputed F keeps instead of its
  // activations: its input (spec/activation_counting.h has both).
  int64_t activation_whole_bytes = 0;
  int64_t checkpoint_bytes = 0;
  // What Megatron's module recomputation drops from activation_bytes (RecomputeDirective::modules): a MoE
  // router's pre-MLP norm output ("layernorm", part of activation_whole_bytes) and the routed experts' activation
  // output ("moe_act").
  int64_t norm_output_bytes = 0;
  int64_t act_output_bytes = 0;
  // A backward chunk's working set beside the stash (spec/activation_counting.h backward_working_set_per_token),
  // per microbatch: allocated right before its B (or BW) and freed after it (compile/memory_plan.cc).
  int64_t backward_scratch_bytes = 0;
  // With a split backward (B -> W), the gradients B leaves for W (spec/activation_counting.h
  // weight_grad_inputs_per_token), per microbatch: allocated right before B and freed after its W.
  int64_t weight_grad_bytes = 0;
  // Which of them this chunk drops (the directive matched it): executors recompute them before the backward.
  bool recompute_norm = false;
  bool recompute_act = false;

  // Communication (comm nodes).
  std::string group;        // mesh axis the op runs over: "dp", "edp", "ep", "tp", "pp", "a2f"
  std::string algorithm;    // "ring", "tree", "flat", "halo", "direct"
  int peer_pp_rank = -1;    // send/recv: the pipeline rank on the other side
  int64_t comm_bytes = 0;   // payload per rank
  bool m2n_sender = false;  // m2n: true on the sending side of the exchange, false on the receiving side
  std::string m2n_src_part;  // m2n: part of the chunk that produces the exchanged tensor (both sides)
  std::string m2n_dst_part;  // m2n: part of the chunk that consumes it (both sides)
  std::string shard_axis;   // chunk parameters sharded over this axis ("ep", "tp"); "" = not sharded

  // Rewrites' annotations.
  int zero = 0;            // ZeRO stage of this chunk's parameters (replicate)
  bool recompute = false;  // F activations are dropped and recomputed before the backward
  int bucket = -1;         // parameter bucket (replicate with bucketing)
  int order_slot = -1;     // position in its (pp_rank, stream) total order, set by order
  int order_filter = 0;    // index of the filter inside a multi-filter ("may overlap") slot
};

// A tp gradient sum (add_tp_grad_sums): the all-reduce over tp of one chunk's partial gradients, tagged with
// that chunk's part; the tp collectives of hidden states are tagged "<part>.tp_*" (shard pass).
bool is_tp_grad_sum(const Node& n);

class Graph {
 public:
  MeshInfo mesh;
  int num_layers = 0;
  int num_microbatches = 1;     // 1 until split
  bool backward_split = false;  // some BW nodes were rewritten into B -> W
  int param_bytes = 2;          // bytes per parameter element (compute copy)
  int grad_bytes = 4;           // bytes per gradient element
  int optimizer_bytes = 12;     // per parameter: the optimizer's moments and its fp32 master copy (when not the params)
  int moe_top_k = 1;            // tokens are sent to top_k experts by dispatch
  // Sequence parallelism, decided once by the tp shard directives (ShardDirective::sequence_parallel; they must
  // agree): the hidden states between tp chunks are token slices, 1/tp of a microbatch's rows per tensor rank, so
  // pipeline and m2n messages carry a slice. nullopt until a tp shard runs (then as false).
  std::optional<bool> tp_sequence_parallel;
  bool sequence_parallel() const { return tp_sequence_parallel.value_or(false) && mesh.tp > 1; }
  // The forward dispatch's bytes per element over the edges' (TrainSpec::dispatch_bytes / comm_bytes): 0.516
  // when DeepSeek-V3's recipe dispatches fp8 (with scales) and combines bf16; 1 otherwise.
  double moe_dispatch_ratio = 1.0;

  NodeId add_node(Node node);
  int add_edge(NodeId src, NodeId dst, EdgeKind kind, int64_t bytes = 0);
  void remove_edge(int edge_id);
  // Replaces edge u -> v by u -> node -> v (same kind and bytes); returns the new node.
  NodeId insert_on_edge(int edge_id, Node node);
  bool has_edge(NodeId src, NodeId dst, EdgeKind kind) const;

  size_t num_nodes() const { return nodes_.size(); }
  const Node& node(NodeId id) const { return nodes_[static_cast<size_t>(id)]; }
  Node& node(NodeId id) { return nodes_[static_cast<size_t>(id)]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  const Edge& edge(int id) const { return edges_[static_cast<size_t>(id)]; }
  // Edge ids (alive and dead; check Edge::alive).
  const std::vector<int>& out_edges(NodeId id) const { return out_[static_cast<size_t>(id)]; }
  const std::vector<int>& in_edges(NodeId id) const { return in_[static_cast<size_t>(id)]; }
  // Alive predecessors/successors over both edge kinds (may repeat when two edges join the same pair).
  std::vector<NodeId> preds(NodeId id) const;
  std::vector<NodeId> succs(NodeId id) const;

  // Node ids matching a filter, in id order.
  std::vector<NodeId> select(const TagFilter& filter) const;

  // A topological order over alive edges (Kahn, smallest id first, so it is deterministic). On a cycle the
  // error names up to three nodes on it.
  Result<std::vector<NodeId>> topo_order() const;
  // True when the alive edges form no cycle; cheaper than topo_order() (no ordering), for checks after rewrites.
  bool is_acyclic() const;

 private:
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<std::vector<int>> out_;
  std::vector<std::vector<int>> in_;
};

// "L3.attn.F.mb2" style label with the stage/rank when known; used in error messages.
std::string describe(const Node& node);

}  // namespace piper::ir
