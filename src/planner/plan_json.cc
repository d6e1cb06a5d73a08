// JSON forms of plans and search statistics (the `piper plan --json` output uses them).
#include "piper/planner/search.h"

namespace piper::planner {

Json Plan::to_json() const {
  Json ranks = Json::array();
  for (const auto& r : estimate.ranks) ranks.push_back(r.total());
  return Json{
      {"strategy", strategy.to_string()},
      {"step_time_s", estimate.step_time_s},
      {"mfu", estimate.mfu},
      {"tokens_per_s", estimate.tokens_per_s},
      {"peak_memory_bytes", peak_memory_bytes()},
      {"device_memory_bytes", estimate.device_memory_bytes},
      {"fits", estimate.fits},
      {"memory_per_pp_rank_bytes", ranks},
      {"verified", verified},
      {"compile_s", verification.seconds},
      {"compiled_peak_memory_bytes", verification.compiled_peak_bytes},
      {"simulated", simulated},
      {"simulated_step_time_s", simulated ? Json(sim_step_time_s) : Json(nullptr)},
      {"simulated_tokens_per_s",
       simulated && sim_step_time_s > 0 ? Json(estimate.tokens_per_step / sim_step_time_s) : Json(nullptr)},
      {"simulated_mfu",
       simulated && sim_step_time_s > 0 ? Json(estimate.mfu * estimate.step_time_s / sim_step_time_s) : Json(nullptr)},
      {"simulation_error", sim_error},
      {"simulation_stopped_by_budget", sim_stopped},
      {"origin", origin},
      {"estimate", estimate.to_json()}};
}

Json SearchStats::to_json() const {
  Json rules = Json::object();
  for (int k = 0; k < kNumRules; ++k) {
    if (rejected[k] > 0) rules[to_string(static_cast<Rule>(k))] = rejected[k];
  }
  return Json{{"considered", considered},
              {"scored", scored},
              {"fitting", fitting},
              {"rejected", rejected_total()},
              {"rejected_by_rule", rules},
              {"search_time_s", search_time_s},
              {"threads", threads},
              {"verified", verified},
              {"verify_failed", verify_failed},
              {"verify_screened", verify_screened},
              {"verify_cached", verify_cached},
              {"verify_time_s", verify_time_s},
              {"first_verify_failure", first_verify_failure},
              {"simulated", simulated},
              {"simulate_failed", simulate_failed},
              {"simulate_stopped", simulate_stopped},
              {"simulate_time_s", simulate_time_s},
              {"simulate_budget_hit", simulate_budget_hit},
              {"local_search_tried", local_search_tried},
              {"local_search_improved", local_search_improved},
              {"local_search_ruled_out", local_search_ruled_out},
              {"sim_ratio_min", sim_ratio_min}};
}

}  // namespace piper::planner
