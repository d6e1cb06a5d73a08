// The training loop of one rank: `steps` optimizer steps of a Trainer, checkpoints at the save points, the
// measured timeline when asked, and the run's measurements gathered from every rank. `piper train` (and any
// other front end) calls run_training() and prints what it returns; it decides nothing about the run itself.
//
// Collective: every rank of a multi-rank trainer calls run_training() with the same options, in the same order
// as the trainer's other collectives. What each rank gets back:
//   - steps, losses, seconds, imbalance, migrations: this rank's (losses are the all-rank loss, the same on
//     every rank);
//   - measured: every rank's RankMeasurement, ascending rank (one entry on one rank);
//   - timelines (with RunOptions::trace): on rank 0 every rank's timeline, ascending rank; empty elsewhere.
// Errors: a failed step (its error), a failed checkpoint write, a communication failure or timeout while
// gathering (naming the rank). A step's error stops the loop at once; nothing after it runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/runtime/exec/trace.h"
#include "piper/runtime/trainer.h"

namespace piper::runtime {

struct RunOptions {
  int64_t steps = 1;  // >= 1
  // Write a checkpoint under save_dir after the last step and, with save_every > 0, after every step whose
  // number (TrainStepStats::step) is a multiple of save_every. "" = no checkpoints.
  std::string save_dir;
  int64_t save_every = 0;
  // Record every rank's measured timeline (Executor::set_trace) from a common origin taken after a barrier.
  bool trace = false;
  // Called on this rank after each step and its checkpoint (e.g. to print the step). May be empty.
  std::function<void(const TrainStepStats&)> on_step;
};

// One step as the run reports it (TrainStepStats without the per-task and per-expert maps).
struct StepRecord {
  int64_t step = 0;
  double loss = 0, aux_loss = 0, grad_norm = 0, seconds = 0;
  double imbalance = 1.0;
  int migrated_experts = 0;
  double migration_seconds = 0;
};

// One rank's measurements, means over the timed steps (all but the first when there are several: the first pays
// for first-touch page faults).
struct RankMeasurement {
  double step_time_s = 0;
  double compute_s = 0;  // wall seconds in compute and update tasks per step (all streams; not a2a.* / m2n.*)
  int64_t peak_bytes = 0;
  // CPU seconds (user + system, every thread of the rank's process: getrusage) per step: what the rank took from
  // the cores, its compute and the polling, progress and switching of its communication alike (docs/calibration.md).
  double cpu_s = 0;
};

struct RunSummary {
  std::vector<StepRecord> steps;
  double loss_first = 0, loss_last = 0;
  double seconds = 0;        // all steps, this rank's wall time
  int64_t timed_steps = 0;   // the steps the throughput is over (all but the first when there are several)
  double timed_seconds = 0;  // their wall time
  double timed_cpu_s = 0;    // their CPU time (this rank's process, user + system)
  double timed_compute_s = 0;  // their compute tasks' wall time (compute_seconds)
  // This rank's CPU seconds per timed step by stream (StepResult::stream_cpu_s): after the run, the mean.
  std::map<std::string, double> stream_cpu_s;
  double tokens_per_s = 0, achieved_flops = 0;  // over the timed steps; model FLOPs (docs/counting.md)
  // Expert-parallel runs (imbalance = max / mean tokens per ep rank): the mean over the first and the last
  // `window` steps (window = min(steps, migration window)), the migrations and the share of this rank's
  // time (steps + migrations) spent migrating.
  bool expert_parallel = false;
  size_t window = 0;
  double imbalance_first = 1.0, imbalance_last = 1.0;
  int migrations = 0, migrated_experts = 0;
  double migration_seconds = 0, migration_share = 0;
  RankMeasurement mine;
  std::vector<RankMeasurement> measured;  // every rank's, ascending rank
  std::vector<RankTimeline> timelines;    // RunOptions::trace, rank 0: every rank's; otherwise empty
};

// Compute and update tasks' wall seconds of a step from StepResult::task_seconds: not the expert all-to-alls and
// af-pipe exchanges, which the executor runs as tasks of their handlers and times under "a2a.*" / "m2n.*"
// (communication, waits included).
double compute_seconds(const std::map<std::string, double>& task_seconds);

// Whether a StepResult::task_seconds key is an exchange ("a2a.*": expert all-to-all, "m2n.*": af-pipe), timed with
// its communication and waits, rather than a compute or update task.
bool is_exchange_task(const std::string& key);

Result<RunSummary> run_training(Trainer& trainer, const RunOptions& options);

}  // namespace piper::runtime
