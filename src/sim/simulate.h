// simulate(): compile a Strategy for a model and cluster, execute the Plan (plan_exec.h) and summarise one step:
// step time, tokens/s, MFU, bubble and exposed-communication fractions, peak memory per rank.
//
// The Plan's cost annotations come from the resource model (task_time.h cost_annotations), and the simulator's
// compute times from the same tables, so `piper estimate` and `piper simulate` price every task identically; they
// differ only where the closed form approximates what the simulator executes (the schedule, overlap, contention).
//   tokens/s = global_batch * seq_len / step_time_s
//   MFU      = model FLOPs per token (docs/counting.md, no recomputation) * tokens/s / (world * peak FLOP/s)
//   bubble_fraction, exposed_comm_fraction: summed over the simulated ranks, divided by ranks * step_time_s
//   peak memory per simulated rank: Program::static_bytes (parameters, gradients, optimizer state) + the largest
//   live activation / gathered-parameter bytes from the plan's alloc/free (no allocator workspace).
// Thread-safety: a pure function of its inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/compile/compile.h"
#include "piper/cost/device_model.h"
#include "piper/sim/plan_exec.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::sim {

struct SimReport {
  compile::CompileResult compiled;  // graph + plan (for traces)
  SimResult sim;
  int world_size = 0;
  double step_time_s = 0;
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double bubble_fraction = 0;
  double exposed_comm_fraction = 0;
  int64_t peak_memory_max_bytes = 0;
  double device_memory_bytes = 0;
  uint64_t plan_hash = 0;  // compile::plan_hash of the simulated plan (0 unless SimOptions::plan_hash)
  double compile_wall_s = 0;
  double simulate_wall_s = 0;

  // step_time_s, tokens_per_s, mfu, bubble_fraction, exposed_comm_fraction, peak_memory_bytes {per_rank, max},
  // ranks (per simulated rank: rank, pp_rank, busy/exposed_comm/bubble seconds, peak bytes), counters;
  // load_step_times_s with per-step expert loads (SimResult::load_step_times_s).
  Json to_json() const;
};

// The routing behind a2a=halo flows (SimOptions::halo): the model's experts, top-k and group-limited routing, and
// the wire bytes per token of the forward dispatch and of the other ep all-to-alls.
HaloSimModel halo_sim_model(const ModelSpec& model, const TrainSpec& train);

// The core pool of a cluster whose nodes share CPU cores (NodeSpec::shared_cores): every simulation of such a
// cluster with options.full shares them dynamically (plan_exec.h SimOptions::core_pool), the cost model's task
// prices being at the static share; without full (representative ranks) the pool stays off and every rank computes
// at the static share all the time, as the closed form prices it. Off for every other cluster.
// The pool's sharing efficiency is the calibration's measured core_sharing (1 without one). The hosts of one machine
// (NodeSpec::nodes_per_machine) share one pool of all their cores.
// simulate_compiled() sets SimOptions::core_pool from it, whatever the caller put there.
CorePool core_pool_of(const ClusterSpec& cluster, const SimOptions& options, const cost::Calibration& calibration);

// OK when the simulator can execute the strategy's mesh order: the compiler lays global ranks out tp innermost,
// then ep inside dp, then pp, and an order that differs from that only in where size-1 axes sit is the same layout;
// otherwise the error simulate() returns (such an order is priced by the closed form only). No compile: callers
// (planner/rescore.cc) use it to skip such plans before they take a simulation slot.
Status check_simulated_order(const Strategy& strategy);

// The measured cost of a synchronisation of a cluster whose nodes share CPU cores (NodeSpec::sync_excess_*,
// plan_exec.h SyncCost), with the data-parallel collectives' staging copies at the calibration's measured copy rate
// (cost/copy_cost.h staging_seconds_per_byte); none for every other cluster. simulate_compiled() sets
// SimOptions::sync_cost from it.
SyncCost sync_cost_of(const ClusterSpec& cluster, const cost::Calibration& calibration = {});

// `train.micro_batch_size` is taken from the strategy (mbs); train.global_batch 0 means dp * microbatches * mbs.
// Compiles the strategy for compile::megatron_target() with this cluster's cost annotations, then
// simulate_compiled().
Result<SimReport> simulate(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                           const Strategy& strategy, const cost::Calibration& calibration = {},
                           const SimOptions& options = {});

// The compile simulate() runs (megatron_target(), this cluster's cost annotations, options' overlap settings),
// with the plan verifier's memory check at capacity_bytes (0: none). planner::verify_strategy uses it so that a
// verified plan can be simulated without compiling it again (simulate_compiled()).
Result<compile::CompileResult> compile_for_simulation(const ModelSpec& model, const ClusterSpec& cluster,
                                                      const TrainSpec& train, const Strategy& strategy,
                                                      const cost::Calibration& calibration, const SimOptions& options,
                                                      int64_t capacity_bytes);

// Executes a plan compiled elsewhere, without recompiling it: the plan `piper train` ran (runtime::Trainer::
// compiled()), so its prediction is of that very plan (the report's plan_hash is the plan's). Its cost
// annotations should be this cluster's (cost_annotations() as CompileOptions::cost); `strategy` is the one the
// plan was compiled from (task prices). compile_wall_s stays 0.
Result<SimReport> simulate_compiled(compile::CompileResult compiled, const ModelSpec& model,
                                    const ClusterSpec& cluster, const TrainSpec& train, const Strategy& strategy,
                                    const cost::Calibration& calibration = {}, const SimOptions& options = {});

// Compiles a directive list (a user's file, `piper simulate --directives`) on `mesh` for this cluster's prices and
// executes it. `pricing` prices the tasks (compile::strategy_of_directives: its tp, ep, zero, mbs, recomputation);
// the schedule is the directives' own. Compiled with the options simulate() uses, so that the directives a
// strategy emits (`piper compile --emit-directives`) simulate to the strategy's step time exactly.
Result<SimReport> simulate_directives(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                      const ir::MeshInfo& mesh, const std::vector<ir::Directive>& directives,
                                      const Strategy& pricing, const cost::Calibration& calibration = {},
                                      const SimOptions& options = {});

}  // namespace piper::sim
