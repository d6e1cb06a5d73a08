// Re-scoring of planned strategies with the simulator, and a local search on simulated step times.
//
// The closed form (cost::CostModel::estimate) ranks hundreds of thousands of candidates; the simulator
// (sim::simulate: compile + discrete-event execution with link contention) is slower but sees what the closed
// form approximates (schedule order, overlap, contention). After search() has verified its best plans,
// rescore_with_simulator():
//   1. simulates the first options.simulate_top plans, `threads` at a time, and orders the result by simulated
//      step time (plans it did not simulate keep their closed-form order, after the simulated ones). A plan whose
//      mesh order the simulator refuses (sim::check_simulated_order: closed form only) is marked so without
//      taking one of the `threads` slots;
//   2. runs a greedy local search from the best simulated plan: its neighbours (micro batch size x2 / /2,
//      another schedule, ZeRO stage, recomputation, all-to-all algorithm) that validate and fit by the closed
//      form are simulated, best closed form first, `threads` at a time; the walk moves to the fastest neighbour
//      while it improves, until options.local_search_steps simulations have been spent. Improving plans join the
//      list (origin "local-search").
// The stopping rule (options.rescore_bound; docs/planner.md "Re-scoring with the simulator"): before each batch
// of the local search, a neighbour is simulated only if it may beat the best simulated step time so far by the
// SimRatioBound below; the walk stops when no neighbour may (counted in stats.local_search_ruled_out). So
// re-scoring stops once the top plans are settled instead of spending the budget on neighbours that cannot win.
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

// The bound behind the stopping rule: the smallest ratio of simulated to closed-form step time over the plans
// simulated so far in this re-scoring, r_min, times a plan's closed-form step time. The rule takes that as the
// least a plan can simulate to: it holds for a plan whose simulator/closed-form ratio is at least r_min, which is
// what is assumed, not proven: the simulator prices compute as the closed form does (cost::CostModel::part_shape)
// and adds what the closed form only approximates (schedule order, overlap, link contention), and a neighbour
// shares the best plan's model, cluster and most of its strategy. Measured on the neighbours of DeepSeek-V3's #1
// on 2,048 H800s the assumption does NOT hold (their ratios are 0.99-1.44 against r_min = 1.51: the top plans are
// those the closed form under-prices most), though every plan it ruled out there simulates 8-69 % slower than
// #1 (docs/planner.md has the table and the closed forms at which it would drop a winner). The proven bound, the
// bottleneck rank's compute alone, is too weak to rule anything out there (14.4 s against a simulated best of 24.3 s).
// Before any observation nothing is ruled out. Thread-safety: none (re-scoring updates it between batches, on the
// calling thread).
class SimRatioBound {
 public:
  // Records a plan simulated to `simulated_s` whose closed form is `closed_form_s`; ignored unless both are > 0.
  void observe(double closed_form_s, double simulated_s);
  bool known() const { return observed_ > 0; }
  double min_ratio() const { return min_ratio_; }  // 0 until known()
  // closed_form_s * min_ratio(); 0 until known().
  double lower_bound_s(double closed_form_s) const { return known() ? closed_form_s * min_ratio_ : 0.0; }
  // Whether a plan with this closed form may simulate below best_s: lower_bound_s(closed_form_s) < best_s.
  bool may_beat(double closed_form_s, double best_s) const { return lower_bound_s(closed_form_s) < best_s; }

 private:
  double min_ratio_ = 0;
  int observed_ = 0;
};

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
