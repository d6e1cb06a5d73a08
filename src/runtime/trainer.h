// Trainer: single-rank training of a model through its compiled Plan.
//
// create(): resolves the strategy (default: 1f1b on one rank, mbs = min(4, global batch)), validates it for
// the model, batch and world size, compiles it with compile::compile_strategy, builds the Model from the seed,
// the Optimizer, the corpus and its DataLoader, and an Executor over the rank-0 Program. step() runs one
// optimizer step on the next batch. save()/resume() write and read a checkpoint (runtime/checkpoint/checkpoint.h:
// model, AdamW moments, optimizer step, data position, seed) so that a resumed run continues bit for bit.
// Every tensor is allocated through the trainer's own MemoryTracker, so memory() is this run's, by category.
// The resource model's prediction for the same configuration (src/cost on the local-cpu cluster preset, fp32
// everywhere) is predicted_memory().
// Multi-rank (options.world set): every rank compiles the same plan (DistContext checks its hash), builds only
// the chunks its Program runs (its pipeline stages), takes its data-parallel slice of each global batch
// (rank d of dp gets sequences [d * B / dp, (d + 1) * B / dp)) and runs its Program; step() reports the loss
// over all ranks. save()/resume() work on any number of ranks and across strategies (save() below).
// Errors: ranks > 1 without a world, an invalid strategy, a model the CPU chunks do not
// support, a missing data file, token ids outside the vocabulary, a corrupt or mismatched checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "piper/balance/expert_loads.h"
#include "piper/balance/load_monitor.h"
#include "piper/balance/planner.h"
#include "piper/base/status.h"
#include "piper/comm/communicator.h"
#include "piper/compile/compile.h"
#include "piper/compile/directive_strategy.h"
#include "piper/cost/estimate.h"
#include "piper/runtime/checkpoint/checkpoint.h"
#include "piper/runtime/data/data_loader.h"
#include "piper/runtime/exec/dist_context.h"
#include "piper/runtime/exec/executor.h"
#include "piper/runtime/exec/memory_pool.h"
#include "piper/runtime/model/model.h"
#include "piper/runtime/model/optimizer.h"
#include "piper/spec/model_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::runtime {

// Live expert migration (expert-parallel runs, docs/balance.md); defaults from balance/planner.h.
struct MigrationOptions {
  bool enabled = false;
  // The planner reads the expert loads of the last window_steps steps and runs every window_steps steps.
  int window_steps = balance::kDefaultWindowSteps;
  // A layer is planned when its window imbalance (max / mean ep-rank tokens) exceeds this (>= 1).
  double threshold = balance::kDefaultImbalanceThreshold;
  // Steps a new placement is expected to serve: the planner weighs a move's cost against its saving over them
  // (balance/planner.h steps_next_window). 0 = window_steps (the next plan may undo it).
  int horizon_steps = 0;
  Status validate() const;
};

struct TrainOptions {
  ModelSpec model;
  int ranks = 1;
  std::string strategy;       // compact form or JSON file; "" = 1f1b, microbatches = global_batch / mbs
  // Instead of `strategy` (`piper train --directives`): a directive list for `mesh`, compiled as it is. The run's
  // strategy() is what compile::strategy_of_directives resolves it to (zero, tp, ep, recompute; mbs from
  // global_batch, which 0 makes one sequence per microbatch). Every list the compiler verifies runs.
  std::vector<ir::Directive> directives;
  ir::MeshInfo mesh;
  int64_t global_batch = 16;  // sequences per step; 0 = from the strategy
  int64_t seq_len = 128;
  uint64_t seed = 1234;
  std::string data;           // corpus file or directory; "" = the default corpus
  OptimizerSpec optimizer;    // lr, betas, weight decay, grad_clip
  int64_t warmup_steps = 0;
  ModelOptions model_options;
  // Multi-rank runs (ranks > 1): the MPI world this process is one rank of (size == ranks). Not owned; must
  // outlive the trainer. Every rank calls create() and step() in the same order.
  comm::Communicator* world = nullptr;
  // Multi-rank runs: world ranks per (emulated) node for HALO exchanges; 0 = the MPI job's local size.
  int ranks_per_node = 0;
  // Expert-parallel runs: move experts between the ranks of each ep group when their loads are imbalanced.
  MigrationOptions migration;
  // Prices for the plan's cost annotations (compile::CompileOptions::cost), given the resolved strategy and
  // training spec. `piper train` passes the local machine's (sim::cost_annotations), so that the plan the ranks
  // run is the very plan its prediction simulates (same plan_hash). Empty: the graph's own estimates. The runtime
  // itself reads no annotation, so the prices change no computed value.
  std::function<Result<compile::CostFn>(const Strategy&, const TrainSpec&)> plan_prices;
};

struct TrainStepStats {
  int64_t step = 0;  // optimizer steps completed after this one
  double loss = 0, aux_loss = 0, grad_norm = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  double flops_per_s = 0;  // model FLOPs (docs/counting.md) per second
  std::map<std::string, double> task_seconds;  // see StepResult
  std::map<std::string, double> stream_cpu_s;  // see StepResult
  std::map<int, std::vector<int64_t>> expert_tokens;  // see StepResult: per MoE layer, tokens per expert
  // Expert-parallel runs: the largest over MoE layers of this step's max / mean tokens per ep rank under the
  // placement in force during the step (1 without expert parallelism).
  double imbalance = 1.0;
  // Live migration after this step (TrainOptions::migration): experts that changed rank (over all layers),
  // this rank's seconds for it, and the planner's window imbalance before and after (the largest over the
  // migrated layers). Zero when nothing moved.
  int migrated_experts = 0;
  double migration_seconds = 0;
  double window_imbalance_before = 0, window_imbalance_after = 0;
};

class Trainer {
 public:
  static Result<std::unique_ptr<Trainer>> create(const TrainOptions& options);
  ~Trainer();

  Result<TrainStepStats> step();
  // Collective: completes the ZeRO-1/2 parameter all-gathers that the plan places before the next step's forward
  // (Executor::complete_param_gathers), so that every rank's model() holds the whole updated parameters. save(),
  // expert migration and run_training's end call it; call it before reading parameters after step() otherwise.
  Status complete_param_gathers() { return executor_->complete_param_gathers(); }
  // Collective over the run's ranks (runtime/checkpoint/checkpoint.h): every rank writes the parameters it holds and
  // the AdamW moments of the elements it updates; rank 0 commits the checkpoint ROOT/step-N and ROOT/latest.
  // Parameters gathered by the next step's forward (ZeRO-1/2 before_forward) are gathered first.
  Status save(const std::string& dir);
  // Every strategy's checkpoints load under every other (af-pipe's FFN ranks too, ep > 1 included: ckpt_mpi_test).
  // Expert-parallel runs save every expert under its logical index with the placement table; a resume under
  // ep > 1 adopts the table. Tensor-parallel slices record their boxes (w_qkv: row blocks).
  // Collective, before the first step of a `--save ROOT` run: every rank creates ROOT if needed and creates and
  // removes a probe file in it (InvalidArgument naming ROOT and errno), so a --save run fails at once, not after
  // its last step.
  Status prepare_save(const std::string& root);
  // Collective: loads a checkpoint written under any strategy and world size (dir: a --save ROOT or one of its
  // step-N directories) after checking that it was written for this model's architecture, --seed and --seq.
  // The same error on every rank: naming the rank, the file and the fix.
  Status resume(const std::string& dir);
  // What the last resume() loaded (step, the writer's strategy and world size), and its step directory.
  const CheckpointMeta& resumed() const { return resumed_; }
  const std::string& resumed_dir() const { return resumed_dir_; }

  const Strategy& strategy() const { return strategy_; }
  const compile::CompileResult& compiled() const { return compiled_; }
  // This rank's chunks. Under ZeRO-1/2 with before_forward gathers, whole parameters are current after
  // complete_param_gathers() (save() and run_training call it); between steps otherwise only this rank's shard is.
  Model& model() { return *model_; }
  // Trainable elements of this rank's model (whole parameters, also under ZeRO-3, which keeps only shards).
  int64_t num_params() const { return num_params_; }
  Executor& executor() { return *executor_; }
  // Whether experts are sharded over ep ranks (an expert placement table exists): what the loop's step lines and
  // the run summary report the expert imbalance for.
  bool expert_parallel() const { return !executor_->expert_placement().empty(); }
  MemoryStats memory() const { return tracker_.stats(); }
  // The tracker every tensor of this rank is counted in (e.g. for a TraceRecorder's memory track).
  const MemoryTracker& memory_tracker() const { return tracker_; }
  // The training setup the plan was compiled for (fp32 everywhere, the strategy's mbs).
  const TrainSpec& train_spec() const { return train_; }
  // Bytes the memory pool holds from the system at most (in use + cached for reuse).
  int64_t reserved_peak_bytes() const { return allocator_->peak_reserved_bytes(); }
  const cost::MemoryBreakdown& predicted_memory() const { return predicted_; }
  // The resource model's memory for this rank's pipeline stage (what `piper train` reports beside the measured
  // peak; predicted_memory() is the worst stage's).
  const cost::MemoryBreakdown& predicted_rank_memory() const { return predicted_rank_; }
  double flops_per_token() const { return flops_per_token_; }
  int64_t tokens_per_step() const { return options_.global_batch * options_.seq_len; }
  int64_t steps_done() const { return optimizer_->step(); }
  // Null on one rank.
  const DistContext* dist() const { return dist_.get(); }
  const TrainOptions& options() const { return options_; }
  // Expert-parallel runs (ep >= 2, the ep executor's or af-pipe's FFN ranks): the tokens every routed expert
  // received over the steps run so far, the same on every rank (what `piper train --record-expert-loads` writes);
  // no layers without expert parallelism.
  const balance::ExpertLoads& expert_loads() const { return expert_loads_; }

 private:
  Trainer() = default;
  int data_parallel() const { return compiled_.plan.mesh.dp; }
  double comm_timeout_s() const;
  Status restore_local(CheckpointReader& reader);
  // After a step: feeds the expert loads to the monitor, sets stats->imbalance and, with migration on and a
  // full window, plans and migrates (every rank the same plan from the same all-gathered loads).
  Status balance_experts(TrainStepStats* stats);
  // After a step of an expert-parallel plan (mesh ep >= 2): adds its all-gathered tokens per expert to expert_loads_.
  Status record_expert_loads(const TrainStepStats& stats);
  // Resolves strategy_ and train_ from the options' strategy or directives and compiles the run's plan.
  Status resolve_and_compile();
  Status resolve_directives();
  // Parts of create(), after the plan is compiled and dist_ is set up: the model of rank `rank`, then the
  // resource model's prediction and the migration cost.
  Status build_model(int rank);
  Status predict_resources();
  bool directives_recognised_ = false;
  TrainOptions options_;
  Strategy strategy_;
  MemoryTracker tracker_;
  std::unique_ptr<MemoryPool> allocator_;
  compile::CompileResult compiled_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<DistContext> dist_;
  std::unique_ptr<Executor> executor_;
  cost::MemoryBreakdown predicted_;
  cost::MemoryBreakdown predicted_rank_;
  int64_t num_params_ = 0;
  TrainSpec train_;
  double flops_per_token_ = 0;
  Batch batch_;
  Batch local_batch_;                              // multi-rank: this rank's data-parallel slice of batch_
  std::unique_ptr<balance::LoadMonitor> monitor_;  // expert-parallel runs; built at the first step
  std::vector<int> monitor_layers_;                // MoE layer of each monitor layer
  int64_t last_plan_step_ = 0;
  balance::MigrationCost migration_cost_;
  balance::ExpertLoads expert_loads_;
  CheckpointMeta resumed_;
  std::string resumed_dir_;
};

// The strategy a run uses: `text` parsed, or the default for the batch (see TrainOptions::strategy).
Result<Strategy> train_strategy(const std::string& text, int64_t global_batch);

// A diverged step (non-finite loss or gradient norm) stops training at once instead of printing NaN losses: an
// error naming the step, the values and the fix (lower `lr`). Both trainers (CPU ranks, --device cuda) call it.
Status check_step_finite(double loss, double grad_norm, int64_t step, double lr);

}  // namespace piper::runtime
