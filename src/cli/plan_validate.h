// `piper plan --local-ranks R --validate K`: the planner checked against measured runs on this machine. The
// planner's best K plans and K others drawn (seeded) from the rest of its ranked list are each trained for a few
// steps with `piper train --ranks R --json` (a child process per plan, so one failing plan cannot stop the others),
// and their predicted and measured step times and peak memory are printed side by side with the rank correlation
// (Kendall tau) between the predicted and the measured order and where the measured best stands in the predicted
// order (docs/planner.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/planner/search.h"

namespace piper::cli {

// How many plans the search ranks when validating (the rest the K others are drawn from).
inline constexpr int kValidateRankedPlans = 30;

struct ValidateOptions {
  int k = 0;            // plans from the top, and as many drawn from the rest
  int steps = 5;        // training steps per plan (the first is not timed)
  int ranks = 0;        // --local-ranks
  std::string model;    // as given to plan
  int64_t global_batch = 0;
  int64_t seq_len = 0;
  std::string calibration, comm_calibration;
  std::string expert_loads;  // plan's --expert-loads FILE, given to every run too ("" without)
  uint64_t seed = 1;    // which of the rest are drawn
};

struct ValidatedPlan {
  int predicted_rank = 0;  // 1-based position in the planner's order
  bool top = false;        // one of the best K (else drawn from the rest)
  std::string strategy;
  double predicted_step_s = 0;    // what the planner ranked by (simulated when re-scored, else the closed form)
  double closed_form_step_s = 0;  // the resource model's step time of the plan
  double predicted_peak_bytes = 0;
  double measured_step_s = 0;     // slowest rank's mean step after the first
  double measured_peak_bytes = 0; // largest rank's peak
  // The run's own prediction (`piper train --json`): its simulation of every rank, with the run's own measured
  // expert loads when it reports one (an ep plan: known only after the run), else with the planner's loads.
  bool run_own_loads = false;     // the run's own loads priced it
  double run_sim_step_s = 0;      // that simulation's step
  double run_sim_peak_bytes = 0;  // its largest rank's peak
  double worst_memory_ratio = 0;  // measured / simulated peak of the rank furthest from 1 (0: none reported)
  std::string error;              // the run's error, when it failed (then not in the correlation)
  Json to_json() const;
};

struct ValidationReport {
  std::vector<ValidatedPlan> plans;  // in predicted order
  double kendall_tau = 0;            // over the plans that ran; 0 with fewer than 2
  double kendall_tau_run_sim = 0;    // the same with each run's own simulation (run_sim_step_s) for predicted
  int measured_best_predicted_rank = 0;
  // The planner's first plan's measured step over the fastest measured (what `--strategy auto`, which takes the
  // first plan, loses); 0 when the first plan failed or did not run.
  double first_over_fastest = 0;
  Json to_json() const;
};

// Kendall's tau-b of two equally long samples (ties in either count as neither concordant nor discordant).
double kendall_tau(const std::vector<double>& a, const std::vector<double>& b);

// The plans to validate: the first k of `ranked` and k drawn without replacement from the rest (all when fewer).
std::vector<int> pick_validation_plans(int ranked, int k, uint64_t seed);

// Fills v's measured and run_* fields from one run's `piper train --json` report: the slowest rank's step, the
// largest rank's peak, and the run's own simulation (predicted_vs_measured_own_expert_loads when present, else
// predicted_vs_measured). Errors: a report without predicted_vs_measured or its ranks (named).
Status read_train_report(const Json& report, ValidatedPlan* v);

// Trains each picked plan and measures it. `ranked` is the planner's order (SearchResult::top).
Result<ValidationReport> validate_plans(const std::vector<planner::Plan>& ranked, const ValidateOptions& options);

void print_validation(const ValidationReport& report, int steps, int ranks);

}  // namespace piper::cli
