#include "piper/balance/planner.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "piper/balance/greedy_repack.h"
#include "piper/balance/load_monitor.h"
#include "piper/base/check.h"

namespace piper::balance {
namespace {

Status check_nonnegative(double value, const char* name) {
  if (!std::isfinite(value) || value < 0) {
    return invalid_argument(std::string("migration cost: ") + name + "=" + std::to_string(value) +
                            " must be finite and >= 0");
  }
  return ok_status();
}

// State of the climb: the slot table, rank loads, and which experts sit away from their starting rank.
class Climb {
 public:
  Climb(const ExpertPlacement& start, const std::vector<int64_t>& expert_tokens)
      : p_(start),
        tokens_(expert_tokens),
        start_rank_(start.expert_rank()),
        load_(rank_tokens(start, expert_tokens).value()),
        sent_(start.num_ranks, 0),
        recv_(start.num_ranks, 0) {}

  int64_t max_load() const { return *std::max_element(load_.begin(), load_.end()); }
  const ExpertPlacement& placement() const { return p_; }

  // Largest number of experts any rank sends or receives, relative to the start.
  int max_transfers() const {
    int worst = 0;
    for (int r = 0; r < p_.num_ranks; ++r) worst = std::max({worst, sent_[r], recv_[r]});
    return worst;
  }

  // Finds the best admissible step; false when there is none.
  bool best_step(int* slot_a, int* slot_b) const {
    const int spr = p_.slots_per_rank;
    const int top = static_cast<int>(std::max_element(load_.begin(), load_.end()) - load_.begin());
    const int64_t top_load = load_[top];
    const int first = p_.group_of_rank(top) * p_.ep_group_size;
    int64_t best_pair_max = top_load;  // admissible means strictly below
    int best_touched = 3;
    bool found = false;
    auto consider = [&](int64_t pair_max, int touched, int sa, int sb) {
      if (pair_max < best_pair_max || (pair_max == best_pair_max && found && touched < best_touched)) {
        best_pair_max = pair_max;
        best_touched = touched;
        *slot_a = sa;
        *slot_b = sb;
        found = true;
      }
    };
    for (int sa = top * spr; sa < (top + 1) * spr; ++sa) {
      const int e = p_.slot_expert[sa];
      if (e == kFreeSlot) continue;
      const int64_t le = tokens_[e];
      for (int r = first; r < first + p_.ep_group_size; ++r) {
        if (r == top) continue;
        int free_slot = -1;
        for (int sb = r * spr; sb < (r + 1) * spr && free_slot == -1; ++sb) {
          if (p_.slot_expert[sb] == kFreeSlot) free_slot = sb;
        }
        if (free_slot != -1) consider(std::max(top_load - le, load_[r] + le), 1, sa, free_slot);
        for (int sb = r * spr; sb < (r + 1) * spr; ++sb) {
          const int f = p_.slot_expert[sb];
          if (f == kFreeSlot || tokens_[f] >= le) continue;
          const int64_t d = le - tokens_[f];
          consider(std::max(top_load - d, load_[r] + d), 2, sa, sb);
        }
      }
    }
    return found;
  }

  void swap_slots(int sa, int sb) {
    const int ra = p_.rank_of_slot(sa), rb = p_.rank_of_slot(sb);
    const int ea = p_.slot_expert[sa], eb = p_.slot_expert[sb];
    if (ea != kFreeSlot) relocate(ea, ra, rb);
    if (eb != kFreeSlot) relocate(eb, rb, ra);
    std::swap(p_.slot_expert[sa], p_.slot_expert[sb]);
  }

 private:
  void relocate(int e, int from, int to) {
    load_[from] -= tokens_[e];
    load_[to] += tokens_[e];
    if (from != start_rank_[e]) --recv_[from], --sent_[start_rank_[e]];
    if (to != start_rank_[e]) ++recv_[to], ++sent_[start_rank_[e]];
  }

  ExpertPlacement p_;
  const std::vector<int64_t>& tokens_;
  std::vector<int> start_rank_;
  std::vector<int64_t> load_;
  std::vector<int> sent_, recv_;
};

double transfer_time_s(int max_transfers, const MigrationCost& cost) {
  if (max_transfers == 0) return 0;
  return cost.link_latency_s + max_transfers * cost.bytes_per_expert / cost.link_bw_bytes_per_s;
}

double saving_s(int64_t max_before, int64_t max_after, int window_steps, const MigrationCost& cost) {
  return static_cast<double>(max_before - max_after) / window_steps * cost.time_per_token_s * cost.steps_next_window;
}

}  // namespace

Status MigrationCost::validate() const {
  PIPER_RETURN_IF_ERROR(check_nonnegative(bytes_per_expert, "bytes_per_expert"));
  PIPER_RETURN_IF_ERROR(check_nonnegative(link_latency_s, "link_latency_s"));
  PIPER_RETURN_IF_ERROR(check_nonnegative(steps_next_window, "steps_next_window"));
  PIPER_RETURN_IF_ERROR(check_nonnegative(time_per_token_s, "time_per_token_s"));
  if (!std::isfinite(link_bw_bytes_per_s) || link_bw_bytes_per_s <= 0) {
    return invalid_argument("migration cost: link_bw_bytes_per_s=" + std::to_string(link_bw_bytes_per_s) +
                            " must be finite and > 0");
  }
  return ok_status();
}

bool operator==(const ExpertMove& a, const ExpertMove& b) {
  return a.expert == b.expert && a.from_rank == b.from_rank && a.from_slot == b.from_slot && a.to_rank == b.to_rank &&
         a.to_slot == b.to_slot;
}

std::vector<ExpertMove> moves_between(const ExpertPlacement& before, const ExpertPlacement& after) {
  const std::vector<int> from = before.expert_slot();
  const std::vector<int> to = after.expert_slot();
  std::vector<ExpertMove> moves;
  for (int e = 0; e < before.num_experts; ++e) {
    if (before.rank_of_slot(from[e]) == after.rank_of_slot(to[e])) continue;
    moves.push_back({e, before.rank_of_slot(from[e]), from[e], after.rank_of_slot(to[e]), to[e]});
  }
  return moves;
}

double migration_time_s(const ExpertPlacement& before, const ExpertPlacement& after, const MigrationCost& cost) {
  std::vector<int> sent(before.num_ranks, 0), recv(before.num_ranks, 0);
  int worst = 0;
  for (const ExpertMove& m : moves_between(before, after)) {
    worst = std::max({worst, ++sent[m.from_rank], ++recv[m.to_rank]});
  }
  return transfer_time_s(worst, cost);
}

Result<MigrationPlan> plan_migration(const std::vector<int64_t>& expert_tokens, int window_steps,
                                     const ExpertPlacement& current, const MigrationCost& cost,
                                     const PlannerOptions& options) {
  PIPER_RETURN_IF_ERROR(current.validate().with_context("migration planner"));
  PIPER_RETURN_IF_ERROR(cost.validate());
  if (window_steps < 1) {
    return invalid_argument("migration planner: window_steps=" + std::to_string(window_steps) + " must be >= 1");
  }
  if (!(options.imbalance_threshold >= 1.0) || !std::isfinite(options.imbalance_threshold)) {
    return invalid_argument("migration planner: imbalance_threshold=" + std::to_string(options.imbalance_threshold) +
                            " must be finite and >= 1 (max/mean is never below 1)");
  }
  if (options.max_steps < 0) return invalid_argument("migration planner: max_steps must be >= 0");
  PIPER_ASSIGN_OR_RETURN(std::vector<int64_t> loads, rank_tokens(current, expert_tokens));

  MigrationPlan plan;
  plan.placement = current;
  plan.max_rank_tokens_before = plan.max_rank_tokens_after = *std::max_element(loads.begin(), loads.end());
  plan.imbalance_before = plan.imbalance_after = imbalance(loads);
  if (plan.imbalance_before <= options.imbalance_threshold) {
    plan.reason = "balanced";
    return plan;
  }

  PIPER_ASSIGN_OR_RETURN(ExpertPlacement greedy, greedy_repack_min_moves(expert_tokens, current));
  PIPER_ASSIGN_OR_RETURN(std::vector<int64_t> greedy_loads, rank_tokens(greedy, expert_tokens));
  const int64_t greedy_max = *std::max_element(greedy_loads.begin(), greedy_loads.end());

  Climb climb(current, expert_tokens);
  std::vector<std::pair<int, int>> steps;
  int best_prefix = 0;
  double best_net = 0;
  int64_t best_max = plan.max_rank_tokens_before;
  int sa = 0, sb = 0;
  auto at_target = [&] { return options.stop_at_greedy_balance && climb.max_load() <= greedy_max; };
  while (static_cast<int>(steps.size()) < options.max_steps && !at_target() && climb.best_step(&sa, &sb)) {
    climb.swap_slots(sa, sb);
    steps.emplace_back(sa, sb);
    const int64_t max_now = climb.max_load();
    const double net = saving_s(plan.max_rank_tokens_before, max_now, window_steps, cost) -
                       transfer_time_s(climb.max_transfers(), cost);
    if (net > best_net) best_net = net, best_prefix = static_cast<int>(steps.size()), best_max = max_now;
  }
  plan.climb_steps = static_cast<int>(steps.size());
  ExpertPlacement result = current;
  for (int i = 0; i < best_prefix; ++i)
    std::swap(result.slot_expert[steps[i].first], result.slot_expert[steps[i].second]);
  result = keep_stayers_in_place(current, result);
  plan.reason = "moves pay";

  // The climb's local optimum can (rarely, on small layouts) be above the from-scratch packing; then the
  // relabeled greedy packing is a candidate too, taken only when its net gain is strictly larger.
  const bool greedy_better = greedy_max < climb.max_load();
  if (greedy_better) {
    const double greedy_net =
        saving_s(plan.max_rank_tokens_before, greedy_max, window_steps, cost) - migration_time_s(current, greedy, cost);
    if (greedy_net > best_net) {
      best_net = greedy_net, best_max = greedy_max, result = greedy;
      plan.reason = "greedy repack pays more";
    }
  }
  if (best_net <= 0) {
    plan.reason = steps.empty() && !greedy_better ? "no improving move" : "does not pay";
    return plan;
  }
  plan.placement = std::move(result);
  plan.moves = moves_between(current, plan.placement);
  PIPER_CHECK(!plan.moves.empty(), "a paying plan moves at least one expert");
  plan.max_rank_tokens_after = best_max;
  plan.imbalance_after = imbalance(rank_tokens(plan.placement, expert_tokens).value());
  plan.saving_s = saving_s(plan.max_rank_tokens_before, best_max, window_steps, cost);
  plan.cost_s = migration_time_s(current, plan.placement, cost);
  return plan;
}

Result<std::vector<MigrationPlan>> plan_layers(const LoadMonitor& monitor, const MigrationCost& cost,
                                               const PlannerOptions& options) {
  std::vector<MigrationPlan> plans;
  for (int layer = 0; layer < monitor.num_layers(); ++layer) {
    const LayerLoadStats stats = monitor.layer_stats(layer);
    if (stats.steps == 0) {
      MigrationPlan empty;
      empty.placement = monitor.placement(layer);
      empty.reason = "no steps recorded";
      plans.push_back(std::move(empty));
      continue;
    }
    Result<MigrationPlan> plan =
        plan_migration(stats.expert_tokens, stats.steps, monitor.placement(layer), cost, options);
    if (!plan.ok()) return plan.status().with_context("layer " + std::to_string(layer));
    plans.push_back(std::move(plan).value());
  }
  return plans;
}

}  // namespace piper::balance
