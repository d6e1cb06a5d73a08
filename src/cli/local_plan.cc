#include "piper/cli/local_plan.h"

#include <algorithm>
#include <thread>

#include "piper/balance/expert_loads.h"
#include "piper/cli/scenario.h"
#include "piper/cli/train_report.h"
#include "piper/cost/task_profile.h"
#include "piper/planner/verify.h"
#include "piper/runtime/support.h"

namespace piper::cli {

namespace {

template <typename T>
std::vector<T> intersect(const std::vector<T>& space, const std::vector<T>& allowed) {
  std::vector<T> out;
  for (const T& v : space) {
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) out.push_back(v);
  }
  return out;
}

}  // namespace

void restrict_to_runtime(const ModelSpec& model, double capacity_bytes, planner::SearchOptions* options) {
  const runtime::RuntimeSupport rs = runtime::runtime_support();
  planner::SearchSpace& sp = options->space;
  sp.schedules = intersect(sp.schedules, rs.schedules);
  sp.zero = intersect(sp.zero, rs.zero);
  sp.recompute = intersect(sp.recompute, rs.recompute);
  // A bound of 0 is none (on either side).
  auto bound = [](int space, int runtime) {
    return space > 0 && runtime > 0 ? std::min(space, runtime) : space + runtime;
  };
  sp.max_tp = bound(sp.max_tp, rs.max_tp);
  sp.max_ep = bound(sp.max_ep, rs.max_ep);
  // etp = tp is searched too: the runtime slices experts over etp with ep > 1 (check_runnable refuses etp with ep = 1,
  // through the verifier below).
  auto inner = options->verifier;
  options->verifier = [model, capacity_bytes, inner](const Strategy& s, const TrainSpec& t) {
    Status st = runtime::check_runnable(s);
    if (!st.ok()) {
      planner::Verification v;
      v.message = st.message();
      return v;
    }
    return inner ? inner(s, t) : planner::verify_strategy(model, t, s, capacity_bytes);
  };
}

TrainSpec local_train_spec(int64_t global_batch, int64_t seq_len) {
  TrainSpec t;
  t.global_batch = global_batch;
  t.seq_len = seq_len;
  t.param_dtype = t.grad_dtype = t.master_dtype = DType::kFP32;
  t.optimizer_dtype = t.activation_dtype = DType::kFP32;
  return t;
}

Result<AutoStrategy> auto_strategy(const ModelSpec& model, int ranks, int kernel_threads, int64_t global_batch,
                                   int64_t seq_len, const std::string& calibration, const std::string& comm_calibration,
                                   const std::string& expert_loads) {
  PIPER_ASSIGN_OR_RETURN(LocalMachine m, local_cluster(ranks, kernel_threads, calibration, comm_calibration));
  cost::apply_model_sharing(&m.calibration, model, seq_len);
  const TrainSpec train = local_train_spec(global_batch, seq_len);
  // The same search as `piper plan --local-ranks R --runnable` with its defaults (the kept plans re-scored by
  // the simulator, then a local search around the best), so --strategy auto runs that command's #1.
  planner::SearchOptions o;
  o.top_k = kPlanTopK;
  o.simulate_top = o.top_k;
  o.local_search_steps = kPlanLocalSearchSteps;
  o.simulate_budget_s = kPlanSimBudgetS;
  o.calibration = m.calibration;
  if (!expert_loads.empty()) {
    PIPER_ASSIGN_OR_RETURN(o.expert_load_by_ep, expert_load_by_ep(expert_loads, model));
  }
  o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  restrict_to_runtime(model, o.memory_fraction * static_cast<double>(m.cluster.device.memory_bytes), &o);
  PIPER_ASSIGN_OR_RETURN(planner::SearchResult r, planner::search(model, m.cluster, train, o));
  if (r.top.empty()) {
    return failed_precondition(
        "--strategy auto: the planner found no strategy the runtime runs for " + std::to_string(ranks) +
        " ranks and a global batch of " + std::to_string(global_batch) + " (" + std::to_string(r.stats.fitting) +
        " fit, " + std::to_string(r.stats.verify_failed) + " rejected" +
        (r.stats.first_verify_failure.empty() ? "" : ": " + r.stats.first_verify_failure) +
        "); see `piper plan --local-ranks " + std::to_string(ranks) + " --runnable`, or pass --strategy");
  }
  AutoStrategy a;
  a.strategy = r.top[0].strategy;
  a.scored = r.stats.scored;
  a.step_time_s = r.top[0].estimate.step_time_s;
  return a;
}

Result<std::map<int, planner::SearchOptions::ExpertLoad>> expert_load_by_ep(const std::string& file,
                                                                            const ModelSpec& model) {
  if (!model.is_moe()) {
    return invalid_argument("--expert-loads: model '" + model.name + "' has no routed experts; drop the flag");
  }
  PIPER_ASSIGN_OR_RETURN(balance::ExpertLoads loads, balance::load_expert_loads(file));
  std::map<int, planner::SearchOptions::ExpertLoad> out;
  for (int ep = 1; ep <= model.moe.num_experts; ++ep) {
    if (model.moe.num_experts % ep != 0) continue;
    PIPER_ASSIGN_OR_RETURN(MeasuredLoads m, measured_loads(loads, file, model, ep));
    out[ep] = {m.imbalance, m.memory_load};
  }
  return out;
}

}  // namespace piper::cli
