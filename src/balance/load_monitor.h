// LoadMonitor: tokens received per step, per MoE layer, by every expert and every rank, over a moving window.
//
// The runtime (or a simulator replaying a load trace) calls record_step once per training step with the tokens
// each logical expert received in each layer, summed over the micro-batches of the step. The monitor keeps the
// last `window_steps` steps and reports, per layer:
//   - expert_tokens: window sum per logical expert (placement independent; this is what the planner reads),
//   - rank_tokens: the window's expert sums mapped through the current placement,
//   - imbalance: max / mean of rank_tokens; what a static placement can fix, and what a migration changes at once,
//   - mean_step_imbalance: the average over the window of each step's own max / mean under the placement that
//     was in force at that step (what the steps actually experienced).
// set_placement() after a migration changes future steps' rank accounting and `imbalance` immediately.
// Thread-safety: none; one owner (the rank that plans, or every rank with identical inputs).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "piper/balance/placement.h"
#include "piper/base/status.h"

namespace piper::balance {

struct LayerLoadStats {
  std::vector<int64_t> expert_tokens;          // [num_experts], summed over the window
  std::vector<int64_t> rank_tokens;            // [num_ranks], window sums under the current placement
  std::vector<int64_t> last_step_rank_tokens;  // [num_ranks], the newest step under its own placement
  double imbalance = 1.0;
  double last_step_imbalance = 1.0;
  double mean_step_imbalance = 1.0;
  int steps = 0;  // steps in the window (< window_steps until the window fills)
};

class LoadMonitor {
 public:
  // One placement per MoE layer (layers may differ). window_steps >= 1.
  static Result<LoadMonitor> create(std::vector<ExpertPlacement> layer_placements, int window_steps);

  // tokens[layer][expert] received in this step. Errors name the layer and expert on a shape mismatch or a
  // negative count; on error nothing is recorded.
  Status record_step(const std::vector<std::vector<int64_t>>& tokens);
  // Replaces a layer's placement (after a migration). The new placement must describe the same experts and ranks.
  Status set_placement(int layer, ExpertPlacement placement);

  int num_layers() const { return static_cast<int>(placements_.size()); }
  int window_steps() const { return window_steps_; }
  int steps_in_window() const { return static_cast<int>(history_.size()); }
  int64_t steps_recorded() const { return steps_recorded_; }
  const ExpertPlacement& placement(int layer) const;
  // Precondition: 0 <= layer < num_layers().
  LayerLoadStats layer_stats(int layer) const;
  // The largest `imbalance` over layers (the trigger a caller compares with its threshold).
  double max_imbalance() const;

 private:
  struct StepRecord {
    std::vector<std::vector<int64_t>> expert_tokens;  // [layer][expert]
    std::vector<std::vector<int64_t>> rank_tokens;    // [layer][rank], under the placement of that step
  };
  LoadMonitor(std::vector<ExpertPlacement> placements, int window_steps);

  std::vector<ExpertPlacement> placements_;
  int window_steps_;
  std::deque<StepRecord> history_;
  std::vector<std::vector<int64_t>> window_expert_tokens_;  // running sums over history_
  int64_t steps_recorded_ = 0;
};

}  // namespace piper::balance
