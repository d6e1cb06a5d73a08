#include "piper/balance/load_monitor.h"

#include <string>
#include <utility>

#include "piper/base/check.h"

namespace piper::balance {

LoadMonitor::LoadMonitor(std::vector<ExpertPlacement> placements, int window_steps)
    : placements_(std::move(placements)), window_steps_(window_steps) {
  for (const ExpertPlacement& p : placements_) window_expert_tokens_.emplace_back(p.num_experts, 0);
}

Result<LoadMonitor> LoadMonitor::create(std::vector<ExpertPlacement> layer_placements, int window_steps) {
  if (layer_placements.empty()) return invalid_argument("load monitor: no layers; pass one placement per MoE layer");
  if (window_steps < 1) {
    return invalid_argument("load monitor: window_steps=" + std::to_string(window_steps) + " must be at least 1");
  }
  for (size_t l = 0; l < layer_placements.size(); ++l) {
    PIPER_RETURN_IF_ERROR(layer_placements[l].validate().with_context("load monitor: layer " + std::to_string(l)));
  }
  return LoadMonitor(std::move(layer_placements), window_steps);
}

Status LoadMonitor::record_step(const std::vector<std::vector<int64_t>>& tokens) {
  if (tokens.size() != placements_.size()) {
    return invalid_argument("load monitor: step has token counts for " + std::to_string(tokens.size()) +
                            " layers, the monitor tracks " + std::to_string(placements_.size()));
  }
  StepRecord record;
  record.expert_tokens = tokens;
  for (size_t l = 0; l < tokens.size(); ++l) {
    Result<std::vector<int64_t>> ranks = rank_tokens(placements_[l], tokens[l]);
    if (!ranks.ok()) return ranks.status().with_context("load monitor: layer " + std::to_string(l));
    record.rank_tokens.push_back(std::move(ranks).value());
  }
  for (size_t l = 0; l < tokens.size(); ++l) {
    for (size_t e = 0; e < tokens[l].size(); ++e) window_expert_tokens_[l][e] += tokens[l][e];
  }
  history_.push_back(std::move(record));
  if (static_cast<int>(history_.size()) > window_steps_) {
    const StepRecord& old = history_.front();
    for (size_t l = 0; l < old.expert_tokens.size(); ++l) {
      for (size_t e = 0; e < old.expert_tokens[l].size(); ++e) window_expert_tokens_[l][e] -= old.expert_tokens[l][e];
    }
    history_.pop_front();
  }
  ++steps_recorded_;
  return ok_status();
}

Status LoadMonitor::set_placement(int layer, ExpertPlacement placement) {
  if (layer < 0 || layer >= num_layers()) {
    return out_of_range("load monitor: layer " + std::to_string(layer) + " outside [0, " +
                        std::to_string(num_layers()) + ")");
  }
  PIPER_RETURN_IF_ERROR(placement.validate().with_context("load monitor: layer " + std::to_string(layer)));
  const ExpertPlacement& old = placements_[layer];
  if (placement.num_experts != old.num_experts || placement.num_ranks != old.num_ranks ||
      placement.ep_group_size != old.ep_group_size) {
    return invalid_argument("load monitor: layer " + std::to_string(layer) +
                            ": the new placement must keep num_experts, num_ranks and ep_group_size");
  }
  placements_[layer] = std::move(placement);
  return ok_status();
}

const ExpertPlacement& LoadMonitor::placement(int layer) const {
  PIPER_CHECK(layer >= 0 && layer < num_layers(), "layer ", layer);
  return placements_[layer];
}

LayerLoadStats LoadMonitor::layer_stats(int layer) const {
  PIPER_CHECK(layer >= 0 && layer < num_layers(), "layer ", layer);
  LayerLoadStats stats;
  stats.steps = steps_in_window();
  stats.expert_tokens = window_expert_tokens_[layer];
  Result<std::vector<int64_t>> ranks = rank_tokens(placements_[layer], stats.expert_tokens);
  PIPER_CHECK_OK(ranks.status());
  stats.rank_tokens = std::move(ranks).value();
  stats.imbalance = imbalance(stats.rank_tokens);
  if (history_.empty()) {
    stats.last_step_rank_tokens.assign(placements_[layer].num_ranks, 0);
    return stats;
  }
  stats.last_step_rank_tokens = history_.back().rank_tokens[layer];
  stats.last_step_imbalance = imbalance(stats.last_step_rank_tokens);
  double sum = 0;
  for (const StepRecord& r : history_) sum += imbalance(r.rank_tokens[layer]);
  stats.mean_step_imbalance = sum / static_cast<double>(history_.size());
  return stats;
}

double LoadMonitor::max_imbalance() const {
  double worst = 1.0;
  for (int l = 0; l < num_layers(); ++l) {
    const double x = layer_stats(l).imbalance;
    if (x > worst) worst = x;
  }
  return worst;
}

}  // namespace piper::balance
