// Migration planner: a pure function from expert loads and the current placement to a list of expert moves.
//
// Inputs: the tokens every logical expert of one MoE layer received over the monitor's window (window_steps
// steps), the layer's current placement, cost parameters and options. Output: a MigrationPlan whose moves turn
// the current placement into plan.placement (empty when nothing should move).
//
// Algorithm (deterministic, integer loads, ties broken by the lowest index):
//  1. If imbalance (max rank tokens / mean) <= options.imbalance_threshold: no moves ("balanced").
//  2. Hill climbing. Each step takes the most loaded rank r* (lowest index on ties) and considers, for every
//     expert e on r* and every other rank r of r*'s EP group, moving e into r's first free slot (1 expert) or
//     swapping e with a lighter expert f on r (2 experts). A candidate is admissible when the larger of the two
//     new loads is below r*'s load; the best candidate has the smallest such pair maximum, then the fewest
//     experts touched, then the lowest (slot of e, rank r, slot of f). Steps repeat until none is admissible
//     or, with options.stop_at_greedy_balance (default), until the maximum is no higher than greedy repacking
//     from scratch would give (greedy_repack): the balance of a full reshuffle, reached with few moves, without
//     chasing the last token of imbalance with many more.
//     The global maximum never rises, and it falls once every rank at the maximum has been relieved.
//  3. Cost-aware cut. For every prefix of the climb, with "moved" meaning experts whose rank differs from the
//     start (an expert moved back costs nothing):
//       saving_s = (max_before - max_after) / window_steps * time_per_token_s * steps_next_window
//       cost_s   = link_latency_s + max over ranks of max(experts sent, experts received) * bytes_per_expert
//                  / link_bw_bytes_per_s        (ranks move in parallel, full duplex; training waits for it)
//     The plan is the prefix with the largest saving_s - cost_s (earliest on ties).
//  4. Safety net: the climb's local optimum can be above greedy repacking from scratch (rare, small layouts:
//     4 of 200 Zipf(0.7) cases on 16 experts / 4 ranks, by at most 0.51%). When it is, the relabeled greedy
//     packing (greedy_repack_min_moves) is a candidate too and wins if its net gain is strictly larger.
//     So with cheap moves the result is never above greedy repacking. When no candidate has a positive net gain
//     there are no moves ("does not pay").
// Experts that stay on their rank keep their slot; arrivals take the slots that were freed (keep_stayers_in_place).
// Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/balance/placement.h"
#include "piper/base/status.h"

namespace piper::balance {

class LoadMonitor;

struct MigrationCost {
  double bytes_per_expert = 0;     // weights + gradients + optimizer states that travel with one expert
  double link_bw_bytes_per_s = 0;  // per rank and direction, between ranks of an EP group
  double link_latency_s = 0;       // once per migration
  double steps_next_window = 0;    // steps the new placement serves before the next plan
  double time_per_token_s = 0;     // time the busiest rank spends per received token (expert compute + its comm)
  Status validate() const;
};

// Live migration's defaults (docs/balance.md), named once for the trainer, `piper simulate --expert-zipf` and
// the CLI: the planner runs every kDefaultWindowSteps steps over that many steps' loads, and plans a layer whose
// window imbalance (max / mean ep-rank tokens) exceeds kDefaultImbalanceThreshold.
inline constexpr int kDefaultWindowSteps = 10;
inline constexpr double kDefaultImbalanceThreshold = 1.10;

struct PlannerOptions {
  double imbalance_threshold = kDefaultImbalanceThreshold;   // plan only above this max/mean; >= 1
  int max_steps = 100000;              // bound on hill-climbing steps (a safety net; the climb ends far earlier)
  bool stop_at_greedy_balance = true;  // stop climbing once as balanced as greedy repacking from scratch
};

struct ExpertMove {
  int expert = 0;
  int from_rank = 0;
  int from_slot = 0;
  int to_rank = 0;
  int to_slot = 0;
};
bool operator==(const ExpertMove& a, const ExpertMove& b);

struct MigrationPlan {
  std::vector<ExpertMove> moves;       // by expert index; only experts that change rank
  ExpertPlacement placement;           // after the moves (== the input when moves is empty)
  int64_t max_rank_tokens_before = 0;  // over the window
  int64_t max_rank_tokens_after = 0;
  double imbalance_before = 1.0;
  double imbalance_after = 1.0;
  double saving_s = 0;  // expected over the next window
  double cost_s = 0;
  int climb_steps = 0;  // hill-climbing steps taken before the cost cut
  std::string reason;   // "balanced", "no improving move", "does not pay", "moves pay", "greedy repack pays more"
};

Result<MigrationPlan> plan_migration(const std::vector<int64_t>& expert_tokens, int window_steps,
                                     const ExpertPlacement& current, const MigrationCost& cost,
                                     const PlannerOptions& options = {});

// One plan per layer of a monitor, from its window (expert_tokens, steps) and current placements; a layer with an
// empty window or below the threshold gets an empty plan. Errors from any layer carry the layer index.
// Each layer is weighed on its own: `cost` describes one layer's experts and time per token.
Result<std::vector<MigrationPlan>> plan_layers(const LoadMonitor& monitor, const MigrationCost& cost,
                                               const PlannerOptions& options = {});

// cost_s of moving from `before` to `after` under the model above (0 when nothing moves).
// Precondition: both valid, same shape.
double migration_time_s(const ExpertPlacement& before, const ExpertPlacement& after, const MigrationCost& cost);

// The moves that turn `before` into `after`: experts whose rank differs, by expert index.
std::vector<ExpertMove> moves_between(const ExpertPlacement& before, const ExpertPlacement& after);

}  // namespace piper::balance
