// `piper calibrate --model M`: the model's own task times on one rank (a "task profile", docs/calibration.md).
//
// For every model, kernel thread count t and microbatch size m, the runtime trains the model in this process on
// one rank (as `piper train --ranks 1 --threads t --strategy dp=1,microbatches=2,mbs=m --global-batch 2m` does) for
// `steps` steps; every step after the first gives each task kind's wall seconds (TrainStepStats::task_seconds:
// "attn.F", "experts.BW", ..., "update"; not the "a2a.*" / "m2n.*" exchanges), and a point is the median over those
// steps. A model's runs are stepped in rounds (each round steps every (t, m) run once, their trainers kept), so a
// slow or fast spell of a shared machine falls on all of them rather than on one run whole. Every run's trainer is
// alive at once: moe-40m's six peak at 4.3 GB resident, one of them at 0.8 GB (session 38). Beside them, the
// simulator's price of the same plan (sim::cost_task_time on local_cluster(1, t) with the device figures given,
// which carry no task profile) summed over the plan's instructions of each kind, and the calls per step. The
// simulator scales its prices by measured / priced.
//
// Called on the calibrating process only (no MPI); it sets the kernel threads while it runs and restores them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/spec/model_spec.h"

namespace piper::cli {

struct TaskProfileOptions {
  std::vector<std::string> models;       // preset names or config files (spec/model_loader.h load_model)
  int64_t seq_len = 128;                 // tokens per sequence (train's default); at most each model's max_seq_len
  std::vector<int> threads;              // kernel thread counts, each >= 1
  std::vector<int64_t> mbs = {1, 2, 4};  // microbatch sizes; a run has two microbatches
  int64_t steps = 4;                     // >= 2: the first step (first-touch page faults) is not timed
};

// One task kind of one run: per step, `calls` instructions of it took `measured_s` wall seconds and are priced at
// `priced_s`. tokens = mbs x seq_len, the tokens of one call.
struct TaskPoint {
  int threads = 1;
  int64_t tokens = 0;
  std::string task;  // "<chunk>.<pass>" (chunk_name, ir::to_string(Pass)) or "update"
  int64_t calls = 0;
  double measured_s = 0;
  double priced_s = 0;
};

struct TaskProfile {
  std::string model;       // ModelSpec::name
  int64_t parameters = 0;  // count_params(model).total()
  int64_t seq_len = 0;
  std::vector<TaskPoint> points;  // by thread count, then mbs, then task name
  std::vector<double> sharing;    // measure_model_sharing's, n = 2, 3, ...; empty: not measured
  // The largest over the runs of a run's slowest timed step over its fastest, minus 1: how much the machine's speed
  // moved while the profile ran (printed, not written).
  double step_spread = 0;
};

// The models load and take seq_len (check_seq_len), and the lists are valid: the errors of --model and --seq,
// before any measurement runs.
Result<std::vector<ModelSpec>> load_task_profile_models(const TaskProfileOptions& o);

// Runs and prices every (model, threads, mbs). `device_file`: the device calibration's JSON (one core's figures,
// thread_figures; cost::Calibration::from_json) that prices the tasks; its task_profiles, if any, are ignored (the
// price is the raw one that measured / priced corrects), and no link calibration is read (kNoLinkCalibration: one
// rank's tasks need no links). Errors: a model or list refused above, a run
// the trainer refuses, a task kind of the plan whose measured or priced seconds are not > 0 (named).
Result<std::vector<TaskProfile>> measure_task_profiles(const TaskProfileOptions& o, const Json& device_file);

// A thread count of a model whose task profile points are left out of the file: `task` at `tokens` is the point
// furthest from its price, measured `ratio` = measured / priced.
struct UnscaledThreads {
  std::string model;
  int threads = 1;
  std::string task;
  int64_t tokens = 0;
  double ratio = 1;
};

// Removes from *profiles every (model, thread count) with a point whose measured / priced lies outside
// [1 / cost::kMaxTaskScale, cost::kMaxTaskScale] (all that thread count's points of that model: the simulator then
// prices its tasks unscaled, as a thread count without points), and a profile left without points. Returns one
// entry per count removed, by model then thread count, naming its worst point (furthest in log ratio).
std::vector<UnscaledThreads> drop_implausible_threads(std::vector<TaskProfile>* profiles);

// One line for the summary and stderr: which model and thread count were left out, the worst task and its ratio,
// that those tasks are priced unscaled, and to calibrate again on a quiet machine.
std::string unscaled_threads_note(const UnscaledThreads& u);

// The model's own core sharing (cost::Calibration::TaskProfile::sharing): copies of this executable
// (`piper calibrate --model-share-worker`, one kernel thread each, as the runtime's ranks on a node) train `model`
// on one rank each (dp=1, two microbatches of kShareMbs sequences of seq_len), in `rounds` rounds (>= 1) of: one
// alone, then n = 2..max_ranks at once, then one alone again; each steps from the common start until `window_s` has
// passed and it has made kShareMinSteps steps. Per round and n, the mean over copies of its steps per CPU second over
// the round's faster alone's (calibrate_fit.h sharing_efficiency per_cpu); per n the median over rounds: what running
// together costs the model's own tasks, where the core-sharing stage's GEMM may not show it (one round's figures
// moved 0.83-1.04 between calibrations of moe-40m at n = 4 here, session 38). A median outside what a file accepts
// (cost::kMinSharingEfficiency .. kMaxSharingEfficiency) is an error (a disturbed measurement), as are rounds < 1 and
// a worker that fails or is not ready within 600 s; `calibrate` then warns and writes the profile without `sharing`.
inline constexpr int64_t kShareMbs = 2;
inline constexpr int kShareMinSteps = 3;
inline constexpr const char* kModelShareTag = "piper-model-share";
Result<std::vector<double>> measure_model_sharing(const std::string& model, int64_t seq_len, int max_ranks,
                                                  double window_s, double cores, int rounds);

// The worker (`piper calibrate --model-share-worker PREFIX --model M --seq S --share-window W`): one kernel thread;
// builds the trainer, makes one step (first touch), meets the others (meet_share_workers), steps as above and prints
// "piper-model-share STEPS CPU_S WALL_S" (the process's CPU and wall time of its steps).
Status run_model_share_worker(const std::string& prefix, const std::string& model, int64_t seq_len, double window_s);

// The calibration file's "task_profiles": [{model, parameters, seq, points: [{threads, tokens, task, calls,
// measured_s, priced_s}], sharing: [{ranks, efficiency}] (when measured)}].
Json task_profiles_json(const std::vector<TaskProfile>& profiles);

// One table per model and thread count: per task and tokens, the calls, measured and priced seconds per call and
// their ratio.
void print_task_profiles(const std::vector<TaskProfile>& profiles);

}  // namespace piper::cli
