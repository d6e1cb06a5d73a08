// lower: distributed Graph -> Plan. The steps live in their own files (lower_steps.h: p2p.cc, stream_order.cc,
// memory_plan.cc); lower.cc emits the instructions.
//
// 1. Every data edge between two pipeline ranks becomes a send (producer's rank, stream p2p_to_<peer>) and a
//    recv (consumer's rank, stream p2p_from_<peer>), not linked: one pair of streams per channel (ordered rank
//    pair), as for the m2n exchanges of disaggregate (m2n_to_<peer> / m2n_from_<peer>). Pairs get small tags
//    numbered in send-node id order.
// 2. Each (rank, stream) gets a total order: compute streams follow the order rows (slot, filter, topological
//    position; a rank without rows runs in topological order; updates last); every comm node sits right
//    after the chunk that feeds it or, when it has none on the rank (recv, ZeRO-3 all-gather), right before
//    the chunk it feeds.
//    A receive stream then posts its receives in its sender's send order (FIFO per channel, as NCCL matches a
//    rank pair's point-to-point calls), so a message may arrive early but a channel never deadlocks on its own
//    order; only a schedule whose compute orders are inconsistent across ranks can, and verify_plan finds it.
// 3. Cross-stream dependencies become record/wait event pairs; a same-stream dependency that the order
//    contradicts is an error naming the rank, stream and instruction.
// 4. Activations: alloc before a chunk's F, free after its last backward (recomputed chunks free right after F
//    and re-run F before the backward). ZeRO-3: the gathered parameters are allocated before the all-gather
//    and freed right after the chunk that used them, i.e. re-sharded between microbatches; the all-gather for
//    a rank's k-th compute instruction waits for its (k-2)-th (a temporal edge added here: prefetch one
//    chunk ahead, at most two gathered copies live). Buffers are numbered in node-id order.
#pragma once

#include "piper/base/status.h"
#include "piper/compile/plan.h"
#include "piper/ir/graph.h"

namespace piper::compile {

struct LowerOptions {
  CostFn cost;  // optional; the default keeps the graph's estimates
  // Interleave the chunks of "may overlap" order slots (DualPipeV's and AF-Pipe's F&B pairs): the slot's filters
  // take turns (stream_order.cc), so one microbatch's dispatch/combine runs behind the other's compute. On by
  // default (DualPipe's point; docs/simulator.md measures it); false runs each slot filter after filter, which
  // on one in-order compute stream overlaps nothing.
  bool interleave_overlap = true;
  // Model another system's recomputation (cost::Calibration::recompute_reruns_tp_collectives): the re-run of a
  // recomputed tensor-parallel forward also runs that chunk's tp collectives again, on the compute stream (an
  // all-gather of its input before it under sequence parallelism, the all-reduce or reduce-scatter of its output
  // after it). For the simulator only: the runtime never executes such a plan (it needs no reduced output twice).
  bool recompute_reruns_tp_collectives = false;
  // Tensor-parallel communication overlap (Strategy::tp_overlap; Megatron-LM's --tp-comm-overlap with Transformer
  // Engine's default userbuffers methods). For each tp chunk (attn, mlp, shared; F, B, BW) whose input comes
  // through a tp all-gather and whose output leaves through a tp reduce-scatter, both on another stream:
  //  - all-gather + first GEMM, TE's "ring exchange": tp pieces; GEMM piece 0 works on the local shard at once,
  //    piece i waits for all-gather piece i, one ring step (algorithm "ring_step": each rank passes 1/tp of the
  //    gathered bytes to its ring successor);
  //  - last GEMM + reduce-scatter, TE's "pipeline" split: kTpOverlapRsPieces (strategy.h); reduce-scatter piece i
  //    starts when GEMM piece i ends (a reduce-scatter of 1/pieces of the bytes).
  // The chunk's instructions become kIn pieces, one kRest, kOut pieces (plan.h: Segment); the recomputed
  // forward's re-run collectives (recompute_reruns_tp_collectives) stay whole. The CPU runtime runs these
  // pieces as they are (runtime/exec/executor_tp_overlap.cc).
  bool tp_overlap = false;
  // 2021 Megatron-LM's pipeline (cost::Calibration: p2p_blocking, p2p_scatter_gather, dp_reduce_after_backward;
  // lower_steps.h add_legacy_pipeline_edges). p2p_blocking: the stream that produced a pipeline send waits
  // until the send completes. p2p_scatter_gather: sends and receives carry 1/tp of their bytes, and each receive
  // is followed on its stream by an all-gather of the whole tensor over tp. dp_reduce_after_backward: the
  // data-parallel all-reduces wait for the rank's last chunk. For the simulator only.
  bool p2p_blocking = false;
  bool p2p_scatter_gather = false;
  bool dp_reduce_after_backward = false;
  // Fill Instruction::inputs and outputs (annotate_dataflow): what the runtime's executors read. The plan verifier
  // and the simulator read neither, so the planner's compiles turn them off (the rest of the plan is the same;
  // tests/compile/data_edges_test.cc); true keeps them (every plan a runtime or a plan file may execute).
  bool data_edges = true;
};

// Mutates `graph` (inserts send/recv). Errors name the unplaced or mis-ordered node.
Result<Plan> lower(ir::Graph& graph, const LowerOptions& options = {});

// Inserts send/recv pairs on cross-rank data edges (step 1 of lower; exposed for tests). Returns their count.
Result<int> insert_p2p(ir::Graph& graph);

}  // namespace piper::compile
