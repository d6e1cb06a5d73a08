// planner::search: the fastest strategies for a model, cluster and training setup, by the closed-form estimate.
//
// Enumerates the space of space.h, rejects candidates by rule (counted per rule), skips the variants of a
// candidate that only differ in a2a algorithm or mesh order once the memory model says it does not fit (memory
// is independent of both), and scores the rest with cost::CostModel::estimate. The (tp, pp, ep) work items are
// shared by `threads` worker threads through an atomic counter; each keeps its own top-K and counters, merged at
// the end by (step time, enumeration index), so the result does not depend on the number of threads or on
// timing. Only candidates that fit in device memory are returned as plans.
//
// On a cluster whose scale-up domains span nodes (GB200 NVL72), mesh orders that spread the EP groups over domains
// are not searched when another order keeps them inside (Rule::kEpOutsideDomain, plan/domain.h): a preference,
// so brute_force, which applies no rules, may return such an order where the cost model hides its all-to-alls.
// brute_force() is the test oracle: one thread, no rules, no memory shortcut: every candidate goes through
// Strategy::validate_for and estimate(). Both functions return the same best plan (tests/planner/search_test.cc).
// With options.verify the best plans are then compiled (verify.h), `threads` at a time, best first; a plan the
// compiler rejects is replaced by the next one, so every returned plan verifies.
// Thread-safety: both are pure functions of their arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/cost/estimate.h"
#include "piper/planner/space.h"
#include "piper/planner/verify.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::planner {

struct Plan {
  Strategy strategy;
  cost::Estimate estimate;
  int64_t item = 0;  // enumeration index: work item, then offset inside it (ties break on it)
  int64_t offset = 0;
  bool verified = false;      // compiled and accepted by the plan verifier (search with verify = true)
  Verification verification;  // the compiler's verdict, when it ran
  // Re-scoring with the simulator (rescore.h), when it ran on this plan.
  bool simulated = false;
  double sim_step_time_s = 0;
  std::string sim_error;          // the simulator's message when it failed or was stopped
  bool sim_stopped = false;       // stopped by the re-scoring budget ("not simulated: budget ...")
  std::string origin = "search";  // "search" or "local-search"
  // The verifier's compile, kept for the first plans re-scoring simulates (SearchOptions::reuse_compiles);
  // released once simulated.
  std::shared_ptr<compile::CompileResult> compiled;
  double peak_memory_bytes() const { return estimate.memory.total(); }
  Json to_json() const;
};

struct SearchOptions {
  SearchSpace space;
  int top_k = 5;
  int threads = 2;
  // A plan fits when its largest rank needs at most this fraction of device memory: the rest is headroom for
  // allocator fragmentation the model does not see (PyTorch's caching allocator typically loses 5-10 %).
  double memory_fraction = 0.95;
  cost::Calibration calibration;
  // Measured expert loads (`piper plan --expert-loads FILE`): for each expert-parallel degree, the busiest ep
  // rank's routed rows over the mean rank's, for time (balance::contiguous_imbalance of the file) and at its peak
  // for memory (balance::contiguous_memory_load), which a candidate of that ep is priced with (closed form,
  // verification and simulation) instead of calibration.expert_load_imbalance / expert_memory_load.
  // Empty: every candidate takes the calibration's figures.
  struct ExpertLoad {
    double time = 1;
    double memory = 1;
  };
  std::map<int, ExpertLoad> expert_load_by_ep;
  // The calibration a candidate of expert-parallel degree `ep` is priced with.
  cost::Calibration calibration_for(int ep) const;
  // Compile each plan (compile::compile_strategy, memory checked at memory_fraction of the device) before
  // returning it; plans that fail are skipped and counted. At most verify_attempts_per_plan * top_k compiles.
  bool verify = true;
  int verify_attempts_per_plan = 3;
  // The first plans that re-scoring simulates at once (min(threads, simulate_top)) are verified with the compile the
  // simulator runs, which re-scoring then simulates without compiling again (verify.h). Same verdicts and step
  // times; false: compile them twice (the former path; tests compare both).
  bool reuse_compiles = true;
  // Reject plans whose compiled peak exceeds the capacity from two small compiles before compiling every
  // microbatch (VerifyOptions::memory_screen, verify.h). Same verdicts and messages; false: the former path.
  bool memory_screen = true;
  // Verify a candidate that the verifier cannot tell apart from one already verified (it differs only in mesh order
  // or all-to-all algorithm: VerifyCache, verify.h) by that candidate's verdict instead of compiling it again.
  // Same verdicts, messages and peaks; false: compile every candidate (the former path, `--no-verify-cache`).
  bool verify_cache = true;
  // One memo of the closed form's HALO all-to-all times for every cost model of the search
  // (cost::CostModel::set_halo_memo): the same estimates; false: recompute them per candidate (the former path,
  // about 1,000x slower on DeepSeek-V3 / 2,048 GPUs; bench/plan compares both).
  bool memoise_closed_form = true;
  // Replaces compile::compile_strategy as the verifier when set (tests); called concurrently.
  std::function<Verification(const Strategy&, const TrainSpec&)> verifier;
  // Re-scoring with the simulator (rescore.h): the best `simulate_top` returned plans are simulated and the
  // list is ordered by simulated step time; then up to `local_search_steps` neighbours of the best are
  // simulated. No simulation starts after `simulate_budget_s` seconds of re-scoring, and running ones stop then
  // ("not simulated: budget"). 0 / 0: closed form only.
  int simulate_top = 0;
  int local_search_steps = 0;
  double simulate_budget_s = 60;
  // The local search simulates only neighbours that may beat the best simulated step time by rescore.h's
  // SimRatioBound, and stops when none may. false: every fitting neighbour until local_search_steps or the budget
  // runs out (the former path, `--no-rescore-bound`).
  bool rescore_bound = true;
  // Compile plans for verification and re-scoring with Instruction::inputs/outputs (CompileOptions::data_edges),
  // which neither the verifier nor the simulator reads. false (default): cheaper compiles, the same verdicts, peaks
  // and step times; true: the former path (`--compile-data-edges`).
  bool data_edges = false;
  // Replaces sim::simulate (returns the step time) when set (tests); called concurrently.
  std::function<Result<double>(const Strategy&, const TrainSpec&)> simulator;
  // Called from the calling thread after the search and after every batch of compiles and simulations with one
  // line of progress ("verify: 4 verified, 2 rejected by the compiler, 6 of at most 15 compiled, 12.3 s"). The
  // CLI prints it on stderr; unset: silent.
  std::function<void(const std::string&)> progress;
};

struct SearchStats {
  int64_t considered = 0;    // candidates in the space
  int64_t scored = 0;        // closed-form estimates computed
  int64_t fitting = 0;       // candidates that are valid, distinct and fit in memory
  RuleCounts rejected{};     // by rule; considered == sum(rejected) + fitting
  double search_time_s = 0;  // enumeration and scoring (verification excluded)
  int threads = 1;
  int64_t verified = 0, verify_failed = 0;
  int64_t verify_screened = 0;  // of verify_failed: rejected by the memory screen without a full compile
  int64_t verify_cached = 0;    // of verified + verify_failed: verdicts taken from the VerifyCache (no compile)
  double verify_time_s = 0;
  std::string first_verify_failure;            // strategy and compiler message of the first plan that failed
  int64_t simulated = 0, simulate_failed = 0;  // simulator runs (re-scoring and local search together)
  int64_t simulate_stopped = 0;  // runs stopped at the budget's deadline (not failures; counted in `simulated`)
  int64_t local_search_tried = 0, local_search_improved = 0;
  // Neighbours not simulated because the bound says they cannot beat the best (SearchOptions::rescore_bound),
  // and the bound's smallest simulated / closed-form ratio (0: no plan simulated).
  int64_t local_search_ruled_out = 0;
  double sim_ratio_min = 0;
  double simulate_time_s = 0;
  bool simulate_budget_hit = false;  // some planned simulation did not start, or was stopped, by simulate_budget_s
  int64_t rejected_total() const;
  Json to_json() const;
};

struct SearchResult {
  // Best first: shortest step time, ties in enumeration order. Plans with exactly the same step time and peak
  // memory as a better-ranked one (e.g. mesh orders the model cannot tell apart) are listed once.
  std::vector<Plan> top;
  bool has_smallest = false;
  Plan smallest;  // the scored candidate needing the least memory: the closest plan when none fits
  SearchStats stats;
};

// `train` gives sequence length, dtypes and the global batch (must be >= 1); its micro_batch_size is ignored
// (mbs is searched). Errors: bad inputs (model, cluster, train, space), never "nothing fits": an empty `top`
// with `smallest` set says that, and by how much.
Result<SearchResult> search(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                            const SearchOptions& options);
Result<SearchResult> brute_force(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                 const SearchOptions& options);

}  // namespace piper::planner
