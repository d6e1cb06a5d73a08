// Planning for this machine. `piper plan --local-ranks R` and `piper train --strategy auto` run the same search
// on the same ClusterSpec as train's predictions (train_report.h local_cluster: local-cpu, one device per rank,
// the cores shared), so the strategy `piper train --strategy auto` picks is `piper plan --local-ranks R`'s #1.
//
// restrict_to_runtime() narrows a search to what the runtime executes today (runtime/support.h): the space's
// schedules, ZeRO stages, recomputation, tensor and expert parallelism come from runtime_support(), and a plan
// that check_runnable() still rejects fails verification (counted, the next plan is tried) before it is compiled.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "piper/base/status.h"
#include "piper/planner/search.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::cli {

// Requires options->space to be the default (or a narrower) space; intersects it with runtime_support().
// `model` and the cluster's device memory are needed by the wrapped verifier (verify_strategy).
void restrict_to_runtime(const ModelSpec& model, double capacity_bytes, planner::SearchOptions* options);

// The training setup of a CPU run: fp32 parameters, gradients, optimizer state and activations (the runtime's).
TrainSpec local_train_spec(int64_t global_batch, int64_t seq_len);

// `piper plan`'s defaults for how many plans it keeps and how it re-scores them with the simulator; --strategy
// auto searches with the same ones, so it runs `piper plan --local-ranks R --runnable`'s #1.
inline constexpr int kPlanTopK = 5;
inline constexpr int kPlanLocalSearchSteps = 8;
inline constexpr double kPlanSimBudgetS = 15;

struct AutoStrategy {
  Strategy strategy;
  int64_t scored = 0;      // candidates the closed form scored
  double step_time_s = 0;  // the resource model's step time of the chosen plan
};

// The planner's best runnable strategy for `ranks` ranks on this machine (global batch and sequence as given;
// fp32 training). Errors: nothing runnable fits (the planner's message, and the fix).
// expert_loads: a `train --record-expert-loads` file ("" for none) that prices every candidate's busiest ep rank,
// as `piper plan --expert-loads` does.
Result<AutoStrategy> auto_strategy(const ModelSpec& model, int ranks, int kernel_threads, int64_t global_batch,
                                   int64_t seq_len, const std::string& calibration, const std::string& comm_calibration,
                                   const std::string& expert_loads = "");

// `--expert-loads FILE` for the planner: the busiest ep rank's load over the mean (time) and at its peak (memory) for
// every ep that divides the model's experts (the experts placed contiguously, as the compiler places them; 1 at
// ep = 1, where one rank holds every expert), planner::SearchOptions::expert_load_by_ep. Errors: the file's own, a
// model without experts, loads of another model.
Result<std::map<int, planner::SearchOptions::ExpertLoad>> expert_load_by_ep(const std::string& file,
                                                                            const ModelSpec& model);

}  // namespace piper::cli
