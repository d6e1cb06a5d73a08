// The steps of lower() (lower.h), one file each, exposed for lower.cc and tests. Not part of the Plan API.
//
//   insert_p2p (p2p.cc)            cross-rank data edges -> send/recv node pairs on per-channel streams
//   order_streams (stream_order.cc) each (rank, stream) -> a total order of node ids, plus p2p matching tags
//   plan_buffers (memory_plan.cc)   each rank's activation / gathered-parameter buffers: where they are
//                                   allocated and freed
//   model_state_bytes (memory_plan.cc) resident parameters, gradients and optimizer state of a rank
//   annotate_dataflow (exec_info.cc) what executors read instead of the graph: each instruction's data flow,
//                                   chunk facts and m2n decisions
// lower.cc turns the ordered streams into instructions (events for cross-stream dependencies, buffers around
// the nodes that own them) and fills the rank layout.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "piper/base/status.h"
#include "piper/compile/plan.h"
#include "piper/ir/graph.h"

namespace piper::compile {

// Nodes a lowering ignores: dispatch/combine all-to-alls that disaggregate replaced by m2n exchanges.
inline bool skipped(const ir::Node& n) { return n.tags.part == "dissolved"; }
// Point-to-point nodes (pipeline send/recv and both sides of an m2n exchange) and which side receives.
inline bool is_p2p(const ir::Node& n) {
  return n.kind == ir::NodeKind::kSend || n.kind == ir::NodeKind::kRecv || n.kind == ir::NodeKind::kM2N;
}
inline bool receives(const ir::Node& n) {
  return n.kind == ir::NodeKind::kRecv || (n.kind == ir::NodeKind::kM2N && !n.m2n_sender);
}
// Both sides of a pair are named "<producer>-><consumer>[.m2n].send" / ".recv"; this is the shared prefix.
inline std::string pair_name(const ir::Node& n) { return n.name.substr(0, n.name.rfind('.')); }

// Position of a node inside its rank: (anchor = index of a compute node in the rank's compute order,
// 0 right before / 1 the anchor itself / 2 right after, topological index).
using OrderKey = std::tuple<int64_t, int, int64_t>;

struct StreamOrder {
  std::vector<std::map<std::string, std::vector<ir::NodeId>>> streams;  // per rank: stream -> ordered nodes
  std::vector<OrderKey> keys;                                           // per node id
  std::vector<int64_t> tag;                                             // per node id; -1 if not p2p
};

// Orders every stream of every rank. Compute nodes follow the order rows (slot, filter, topological position;
// a rank without rows runs in topological order; updates last); a comm node sits right after its latest
// same-rank producer or, when it has none (recv, ZeRO-3 all-gather), right before its first consumer.
// Receive streams list their receives in the order the sender sends them. Adds the ZeRO-3 prefetch-window
// temporal edges to `g` (see lower.h). Errors name a chunk missing from its rank's order rows.
// interleave_overlap: LowerOptions::interleave_overlap.
Result<StreamOrder> order_streams(ir::Graph& g, bool interleave_overlap = false);

// 2021 Megatron-LM's pipeline, for the simulator (LowerOptions::p2p_blocking, dp_reduce_after_backward): temporal
// edges on the ordered streams. p2p_blocking: each pipeline send -> the instruction after its producer on the
// producer's stream (the stream waits until the send completes). dp_reduce_after_backward: the rank's last chunk
// on the stream of a data-parallel all-reduce's gradients -> that all-reduce (no overlap with the backward).
// Returns the number of edges added.
int add_legacy_pipeline_edges(ir::Graph& g, const StreamOrder& order, bool p2p_blocking, bool dp_reduce_after_backward);

struct Buffer {
  int id = -1;
  int64_t bytes = 0;
  std::string what;  // "act L0.attn.F.mb1", "params L0.attn.ag.F.mb1"
};

struct BufferPlan {
  std::map<ir::NodeId, Buffer> alloc_before;             // node -> buffer allocated right before it
  std::map<ir::NodeId, Buffer> checkpoint_before;        // recomputed F -> its input, kept to its last backward
  std::map<ir::NodeId, Buffer> recompute_before;         // backward chunk -> buffer of the F it re-runs first
  std::map<ir::NodeId, Buffer> scratch_before;           // backward chunk -> its working set, right before it
  std::map<ir::NodeId, Buffer> grads_before;        // ZeRO-2/3: W or BW -> its full gradients, to the reduce-scatter
  std::map<ir::NodeId, Buffer> weight_grad_before;  // split backward: B -> the gradients it leaves for its W
  std::map<ir::NodeId, ir::NodeId> recompute_of;         // backward chunk -> that recomputed F chunk
  std::map<ir::NodeId, std::vector<Buffer>> free_after;  // node -> buffers freed right after it
};

// Buffers of pipeline rank `rank`, numbered from `next_buffer` (advanced) in node-id order.
BufferPlan plan_buffers(const ir::Graph& g, int rank, const std::vector<OrderKey>& keys, int& next_buffer);

// Parameters (sharded over the data-parallel group with ZeRO-3), gradients (ZeRO >= 2) and the optimizer state
// (Graph::optimizer_bytes per parameter; ZeRO >= 1) resident on one rank of pipeline rank `rank` for the whole step.
int64_t model_state_bytes(const ir::Graph& g, int rank);

// Fills, for every instruction of `plan` that lowers a node of `g`, what executors read instead of the graph
// (plan.h: Instruction::inputs, outputs, recompute, shard_axis, src_part, dst_part, experts_layer, combine_on_ffn),
// and Plan::num_microbatches and num_layers. Inputs and outputs keep only neighbours lowered on the same pipeline
// rank (every data edge between ranks went through a send/recv or m2n pair); data_edges = false leaves them empty
// (LowerOptions::data_edges).
void annotate_dataflow(const ir::Graph& g, Plan& plan, bool data_edges = true);

}  // namespace piper::compile
