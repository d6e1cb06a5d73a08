// Re-scoring of planned strategies with the simulator, and a local search on simulated step times.
//
// The closed form (cost::CostModel::estimate) ranks hundreds of thousands of candidates; the simulator
// (sim::simulate: compile + discrete-event execution with link contention) is slower but sees what the closed
// form approximates (schedule order, overlap, contention). After search() has verified its best plans,
// rescore_with_simulator():
//   1. simulates the first options.simulate_top plans, `threads` at a time, and orders the result by simulated
//      step time (plans it did not simulate keep their closed-form order, after the simulated ones);
//   2. runs a greedy local search from the best simulated plan: its neighbours (micro batch size x2 / /2,
//      another schedule, ZeRO stage, recomputation, all-to-all algorithm) that validate and fit by the closed
//      form are simulated, `threads` at a time; the walk moves to the fastest neighbour while it improves, until
//      options.local_search_steps simulations have been spent. Improving plans join the list (origin
//      "local-search").
// The budget: no simulation starts after options.simulate_budget_s seconds of re-scoring, and a running one
// stops at that deadline (sim::SimOptions::deadline, checked in the simulator's event loop) with
// "not simulated: budget" in the plan's sim_error (counted in stats.simulate_stopped); such a plan keeps its
// closed-form place after the simulated ones. So re-scoring takes at most the budget plus one compile, and the
// command's time stays bounded on large clusters.
// Thread-safety: a pure function of its arguments (sim::simulate is).
#pragma once

#include <chrono>

#include "piper/planner/search.h"

namespace piper::planner {

// Simulated step time of `strategy` (the simulator, or options.simulator in tests). Errors: the compiler's or
// the simulator's message; StatusCode::kDeadlineExceeded ("not simulated: budget ...") when `deadline` passed
// before the simulation finished (the simulator checks it in its event loop; options.simulator ignores it).
Result<double> simulate_step_time(
    const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train, const Strategy& strategy,
    const SearchOptions& options,
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());

// The neighbours the local search tries around `s`, before validation (tests use it to check the walk).
std::vector<Strategy> neighbours(const Strategy& s);

// Steps 1 and 2 above on out->top; fills the simulated fields of the plans and the stats' simulation counters.
void rescore_with_simulator(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                            const SearchOptions& options, int threads, SearchResult* out);

}  // namespace piper::planner
