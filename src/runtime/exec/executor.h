// Executor: runs one rank's compiled Program (src/compile/plan.h) on the CPU chunks of a Model.
//
// - Streams: each logical stream of the Program runs its instructions in order, on its own thread when the
//   Program has several streams, inline on the caller's thread when it has one (deterministic either way: the
//   kernels give the same bits for any thread count, and cross-stream order comes only from events).
// - compute: dispatched by the instruction's {layer, part, pass, mb} to the chunk (layer, part) and task
//   F, B, W or BW on microbatch mb. Inputs are the messages of the instructions the plan lists in its `inputs`
//   (forward: the producers' Activations; backward: the consumers' Gradients), so the executor wires exactly
//   what the compiler wrote; it reads only the Plan (no ir::Graph). A chunk's stash lives from its F until the
//   `free` of its activation buffer (after the last backward task, as lowered by compile::lower).
// - recompute: a recomputed chunk's F keeps only its inputs (the producers' tensors) once the plan frees its
//   stash right after F; the plan's second compute of the same F node re-runs it from those inputs before the
//   first backward (same bits: the kernels are deterministic), without publishing outputs or losses again.
// - record / wait: events between streams. alloc / free: the plan's activation buffers; the executor checks
//   them against the stashes it holds and accounts their planned bytes (planned_peak_bytes) next to the bytes
//   really allocated (MemoryTracker, every tensor, peak per category).
// - update: AdamW of the chunk's parameters. Global-norm clipping needs every gradient of the step, so the
//   first update waits until all weight-gradient tasks (W and BW) of the step have run, computes the norm once,
//   and every update uses that scale. Gradients accumulate over microbatches and are zeroed at the start of
//   each step.
// - send / recv / collectives (multi-rank programs, given a DistContext): pipeline messages (a hidden tensor
//   [mbs * seq, hidden] forward, its gradient backward) go over the context's p2p communicator to the peer's
//   world rank with the plan's tag; gradient all-reduces average a chunk's gradients over their mesh group.
//   Every wait polls with the context's timeout and names the ranks that did not arrive. The update computes
//   the global gradient norm over every rank (each parameter counted once) after all local gradient tasks and
//   reductions, and run_step() reports the loss averaged over the data-parallel ranks (docs/runtime.md).
//   Tensor-parallel collectives (all-gather / reduce-scatter / all-reduce over tp) move hidden states between
//   the chunks' slices and the rest of the model; gradients partial on each tensor rank are summed over tp before
//   the norm (executor_tp.cc, docs/runtime.md).
//   ZeRO (executor_dp.cc): a rank keeps the optimizer state (zero>=1), the accumulated gradient (zero>=2) and
//   the parameters between uses (zero=3) only for its flat shard of each replicated chunk; ZeRO-3's all-gather
//   before an F or B/BW materialises the whole parameters until the plan frees that buffer. ZeRO-1/2's all-gather
//   of the updated shards runs after the update or at the next step's start, as placed (complete_param_gathers).
//   Without a DistContext a Program with communication is rejected at create().
// Errors in a task abort the step with the instruction's label in the message; other streams stop at their
// next instruction. Thread-safety: one run_step() at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "piper/base/status.h"
#include "piper/compile/plan.h"
#include "piper/runtime/data/data_loader.h"
#include "piper/runtime/model/model.h"
#include "piper/runtime/model/optimizer.h"
#include "piper/tensor/memory.h"

namespace piper::runtime {

class DistContext;
class TraceRecorder;

struct StepResult {
  double loss = 0;       // mean over microbatches of the mean token cross-entropy
  double aux_loss = 0;   // routers' load-balance losses (weighted, averaged over microbatches)
  double grad_norm = 0;  // global gradient norm before clipping
  double seconds = 0;
  int64_t num_instructions = 0;
  // Wall seconds spent in compute tasks by "<part>.<pass>" ("experts.BW"), summed over layers, microbatches
  // and streams; in optimizer updates ("update"); and in the expert all-to-alls and af-pipe exchanges, which run
  // as tasks of their handlers ("a2a.<part>.F|B", "m2n.F|B": communication, waits included).
  std::map<std::string, double> task_seconds;
  // CPU seconds (user + system) of each stream's thread in this step, by the plan's stream name ("compute", "dp",
  // "pp_send", ...): its tasks, its waits (polling, sleeping) and its handoffs. What the process took beyond their
  // sum is its main thread's and the communication library's own threads'.
  std::map<std::string, double> stream_cpu_s;
  // Tokens (routed slots) each expert received in this step, by MoE layer: [num_experts] per layer, summed over
  // microbatches and, on several ranks, over the ranks (the same on every rank). The expert load that
  // balance::LoadMonitor::record_step takes.
  std::map<int, std::vector<int64_t>> expert_tokens;
};

// What Executor::migrate_experts did (docs/balance.md).
struct ExpertMigration {
  int moved_experts = 0;   // experts that changed ep rank, over every layer of the table (same on every rank)
  int64_t bytes_sent = 0;  // by this rank: parameters, gradients and AdamW moments of the experts it gave away
  double seconds = 0;      // this rank's wall time for the exchange
};

class Executor {
 public:
  // Checks that every compute/update instruction of `program` (one of `plan`'s) has a chunk in `model`, that alloc
  // buffers belong to a forward chunk, and resolves communication peers and groups. The plan, program, model and
  // optimizer must outlive the executor. `allocator` serves the step's temporary tensors (normally the one the
  // model uses). `dist` (may be null) must outlive the executor; with it, run_step() is collective over its world.
  static Result<std::unique_ptr<Executor>> create(const compile::Plan& plan, const compile::Program& program,
                                                  Model* model, Optimizer* optimizer, Allocator* allocator,
                                                  DistContext* dist = nullptr);
  ~Executor();

  // One optimizer step on `batch` ([batch_size, seq]); batch_size must be num_microbatches * mbs.
  Result<StepResult> run_step(const Batch& batch);

  int num_microbatches() const;
  int num_streams() const;
  // Largest sum of live activation-buffer bytes the plan's alloc/free instructions describe (its estimate).
  int64_t planned_peak_bytes() const;
  // Records every executed instruction's span into `recorder` (runtime/exec/trace.h) from now on; null stops.
  // The recorder must outlive the executor or be unset first. Not while a step runs.
  void set_trace(TraceRecorder* recorder);
  // The flat range [begin, end) of `chunk`'s trainable elements (its trainable parameters in order, as one
  // vector) whose optimizer state this rank updates: its ZeRO shard, or the whole chunk. For checkpoints.
  std::pair<int64_t, int64_t> update_range(const Chunk& chunk) const;
  // ZeRO-3: the chunk's trainable parameters are sharded; between uses their `value` is empty and this rank keeps
  // flat elements [begin, end) of each (begin == end: none) in `values`. One entry per trainable parameter, in
  // order; empty for a chunk whose parameters are whole. For checkpoints.
  struct ParamShard {
    const Param* param = nullptr;
    Shape shape;  // the parameter's (its box's) shape
    Tensor* values = nullptr;
    int64_t begin = 0, end = 0;
  };
  std::vector<ParamShard> param_shards(const Chunk& chunk);
  // ZeRO-1/2 with the parameter all-gather placed before the next step's forward (ReplicateDirective::
  // param_gather "before_forward": the plan's all-gather has no update before it): after a step each rank's whole
  // parameters hold the update only in its own shard until the next step's first instruction gathers them. This
  // runs now every such all-gather whose chunk was updated since its last gather, so that every rank holds the
  // whole updated parameters; the next step's gathers then find nothing to move and skip. Call between steps
  // before reading whole parameters (checkpoints, the end of a run; migrate_experts calls it). Collective over
  // the world (every rank calls it at the same point; a rank without such chunks returns at once). A no-op for
  // plans that gather right after the update, and on one rank.
  Status complete_param_gathers();

  // Expert parallelism (ep > 1): per MoE layer, the logical expert held in each physical slot; slot s lives on
  // ep rank s / experts_per_rank() as its local expert s % experts_per_rank(). The same on every rank; the
  // identity until set_expert_placement or migrate_experts changes it. Dispatch and combine route by it and the
  // expert loads (StepResult::expert_tokens) are reported per logical expert. Empty without expert parallelism.
  const std::map<int, std::vector<int>>& expert_placement() const;
  int experts_per_rank() const;
  // Replaces the tables of the given layers (each a permutation of the experts) without moving any data: the
  // caller then loads every slot's expert (a resume). InvalidArgument naming the layer for a bad table.
  // Not while a step runs.
  Status set_expert_placement(const std::map<int, std::vector<int>>& placement);
  // Live migration between steps, collective over the world (every rank passes the same tables): the experts
  // whose slot changes travel with their gradients and AdamW moments point-to-point inside each ep group
  // (pairwise exchanges over the ep communicator, bounded by the communication timeout), then every rank
  // switches to the new tables. Layers missing from `placement` keep theirs. ZeRO-sharded experts move whole:
  // their shard group's moments (and ZeRO-3 values) are gathered first, and deferred parameter all-gathers are
  // completed (complete_param_gathers). Not while a step runs.
  Result<ExpertMigration> migrate_experts(const std::map<int, std::vector<int>>& placement);

 private:
  struct Impl;
  explicit Executor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace piper::runtime
