#include "piper/cli/plan_validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>

#include "piper/base/files.h"
#include "piper/base/units.h"
#include "piper/comm/launch.h"

namespace piper::cli {
namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs argv, returns its standard output (stderr is dropped: `--json` puts errors on stdout) and exit status.
Result<std::pair<std::string, int>> run_child(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const std::string& a : argv) cmd += shell_quote(a) + " ";
  cmd += "2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return internal_error("plan --validate: cannot start " + elide(cmd));
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), f)) out.append(buf, n);
  const int status = pclose(f);
  return std::make_pair(out, status);
}

// The first JSON value of `text` (a failed multi-rank run prints one error object per rank, then the launcher's).
Result<Json> first_json(const std::string& text) {
  std::istringstream in(text);
  Json j;
  try {
    in >> j;
  } catch (const std::exception&) {
    return internal_error("plan --validate: `piper train --json` printed no JSON: " + elide(text));
  }
  return j;
}

// Trains one plan and fills the measured fields (or error).
Status measure(const ValidateOptions& o, ValidatedPlan* v) {
  PIPER_ASSIGN_OR_RETURN(std::string self, comm::self_executable());
  std::vector<std::string> argv = {self, "train", "--model", o.model, "--ranks", std::to_string(o.ranks),
                                   "--strategy", v->strategy, "--steps", std::to_string(o.steps),
                                   "--global-batch", std::to_string(o.global_batch), "--seq",
                                   std::to_string(o.seq_len), "--json"};
  if (!o.calibration.empty()) argv.insert(argv.end(), {"--calibration", o.calibration});
  if (!o.comm_calibration.empty()) argv.insert(argv.end(), {"--comm-calibration", o.comm_calibration});
  if (!o.expert_loads.empty()) argv.insert(argv.end(), {"--expert-loads", o.expert_loads});
  PIPER_ASSIGN_OR_RETURN(auto run, run_child(argv));
  PIPER_ASSIGN_OR_RETURN(Json j, first_json(run.first));
  if (j.contains("error")) {
    v->error = j["error"].value("message", std::string("failed"));
    return ok_status();
  }
  if (run.second != 0 || !j.contains("predicted_vs_measured")) {
    v->error = "piper train exited with status " + std::to_string(run.second);
    return ok_status();
  }
  return read_train_report(j, v);
}

// A number of a report's object, 0 when absent or not a number.
double number_at(const Json& j, const char* object, const char* key) {
  if (!j.is_object() || !j.contains(object) || !j[object].is_object()) return 0;
  const Json& o = j[object];
  return o.contains(key) && o[key].is_number() ? o[key].get<double>() : 0.0;
}

}  // namespace

Status read_train_report(const Json& report, ValidatedPlan* v) {
  const char* own_key = "predicted_vs_measured_own_expert_loads";
  const bool own = report.contains(own_key) && report[own_key].is_object();
  const Json& sim = own ? report[own_key] : report.value("predicted_vs_measured", Json());
  if (!sim.is_object() || !sim.contains("ranks") || !sim["ranks"].is_array() || sim["ranks"].empty()) {
    return internal_error("plan --validate: the run's report has no predicted_vs_measured ranks");
  }
  v->run_own_loads = own;
  v->run_sim_step_s = sim.value("simulated_step_time_s", 0.0);
  double worst_log = -1;
  for (const Json& r : sim["ranks"]) {
    const double measured = number_at(r, "measured", "peak_memory_bytes");
    const double simulated = number_at(r, "simulated", "peak_memory_bytes");
    v->measured_step_s = std::max(v->measured_step_s, number_at(r, "measured", "step_time_s"));
    v->measured_peak_bytes = std::max(v->measured_peak_bytes, measured);
    v->run_sim_peak_bytes = std::max(v->run_sim_peak_bytes, simulated);
    if (measured <= 0 || simulated <= 0) continue;
    const double off = std::abs(std::log(measured / simulated));
    if (off > worst_log) {
      worst_log = off;
      v->worst_memory_ratio = measured / simulated;
    }
  }
  return ok_status();
}

Json ValidatedPlan::to_json() const {
  Json j{{"predicted_rank", predicted_rank}, {"top", top},
         {"strategy", strategy}, {"predicted_step_time_s", predicted_step_s},
         {"closed_form_step_time_s", closed_form_step_s}, {"predicted_peak_memory_bytes", predicted_peak_bytes}};
  if (!error.empty()) {
    j["error"] = error;
  } else {
    j["measured_step_time_s"] = measured_step_s;
    j["measured_peak_memory_bytes"] = measured_peak_bytes;
    j["measured_over_predicted"] = measured_step_s / predicted_step_s;
    j["run_simulation"] = Json{{"loads", run_own_loads ? "the run's own" : "the planner's"},
                               {"step_time_s", run_sim_step_s},
                               {"peak_memory_bytes", run_sim_peak_bytes},
                               {"worst_rank_memory_measured_over_simulated", worst_memory_ratio}};
  }
  return j;
}

Json ValidationReport::to_json() const {
  Json plans_json = Json::array();
  for (const ValidatedPlan& p : plans) plans_json.push_back(p.to_json());
  return Json{{"plans", plans_json},
              {"kendall_tau", kendall_tau},
              {"kendall_tau_run_simulation", kendall_tau_run_sim},
              {"measured_best_predicted_rank", measured_best_predicted_rank},
              {"first_over_fastest", first_over_fastest}};
}

double kendall_tau(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = std::min(a.size(), b.size());
  double concordant = 0, discordant = 0, ties_a = 0, ties_b = 0;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = i + 1; j < n; ++j) {
      const double da = a[i] - a[j], db = b[i] - b[j];
      if (da == 0 && db == 0) continue;
      if (da == 0) {
        ++ties_a;
      } else if (db == 0) {
        ++ties_b;
      } else if ((da > 0) == (db > 0)) {
        ++concordant;
      } else {
        ++discordant;
      }
    }
  }
  const double denom = std::sqrt((concordant + discordant + ties_a) * (concordant + discordant + ties_b));
  return denom > 0 ? (concordant - discordant) / denom : 0.0;
}

std::vector<int> pick_validation_plans(int ranked, int k, uint64_t seed) {
  std::vector<int> picked;
  for (int i = 0; i < std::min(k, ranked); ++i) picked.push_back(i);
  std::vector<int> rest;
  for (int i = k; i < ranked; ++i) rest.push_back(i);
  std::mt19937_64 rng(seed);
  std::shuffle(rest.begin(), rest.end(), rng);
  rest.resize(std::min(rest.size(), static_cast<size_t>(std::max(0, k))));
  picked.insert(picked.end(), rest.begin(), rest.end());
  std::sort(picked.begin(), picked.end());
  return picked;
}

Result<ValidationReport> validate_plans(const std::vector<planner::Plan>& ranked, const ValidateOptions& o) {
  ValidationReport report;
  for (int i : pick_validation_plans(static_cast<int>(ranked.size()), o.k, o.seed)) {
    const planner::Plan& p = ranked[static_cast<size_t>(i)];
    ValidatedPlan v;
    v.predicted_rank = i + 1;
    v.top = i < o.k;
    v.strategy = p.strategy.to_string();
    v.closed_form_step_s = p.estimate.step_time_s;
    v.predicted_step_s = p.simulated ? p.sim_step_time_s : p.estimate.step_time_s;
    v.predicted_peak_bytes = p.peak_memory_bytes();
    std::fprintf(stderr, "plan: validating #%d %s (%d steps on %d ranks)\n", v.predicted_rank, v.strategy.c_str(),
                 o.steps, o.ranks);
    PIPER_RETURN_IF_ERROR(measure(o, &v));
    report.plans.push_back(std::move(v));
  }
  std::vector<double> predicted, run_sim, measured;
  double best = 0;
  for (const ValidatedPlan& v : report.plans) {
    if (!v.error.empty()) continue;
    predicted.push_back(v.predicted_step_s);
    run_sim.push_back(v.run_sim_step_s);
    measured.push_back(v.measured_step_s);
    if (report.measured_best_predicted_rank == 0 || v.measured_step_s < best) {
      best = v.measured_step_s;
      report.measured_best_predicted_rank = v.predicted_rank;
    }
  }
  report.kendall_tau = kendall_tau(predicted, measured);
  const ValidatedPlan* first = report.plans.empty() ? nullptr : &report.plans.front();
  if (first != nullptr && first->predicted_rank == 1 && first->error.empty() && best > 0) {
    report.first_over_fastest = first->measured_step_s / best;
  }
  report.kendall_tau_run_sim = kendall_tau(run_sim, measured);
  return report;
}

void print_validation(const ValidationReport& r, int steps, int ranks) {
  std::printf(
      "\nvalidation: each plan trained %d steps on %d local ranks (measured: the slowest rank's mean step "
      "after the first; memory: the largest rank's peak; run sim: the run's own simulation of every rank, "
      "with its own measured expert loads where marked *; mem x: measured / simulated peak of the rank "
      "furthest from 1)\n",
      steps, ranks);
  std::printf("  %-4s %-4s %10s %10s %10s %6s %11s %6s %10s %10s %10s %6s  %s\n", "#", "pick", "predicted", "closed",
              "measured", "x", "run sim", "x", "pred mem", "meas mem", "run mem", "mem x", "strategy");
  for (const ValidatedPlan& v : r.plans) {
    std::printf("  %-4d %-4s %10s %10s ", v.predicted_rank, v.top ? "top" : "rest",
                format_seconds(v.predicted_step_s).c_str(), format_seconds(v.closed_form_step_s).c_str());
    if (!v.error.empty()) {
      std::printf("failed: %s  %s\n", elide(v.error).c_str(), v.strategy.c_str());
      continue;
    }
    const std::string run_sim = format_seconds(v.run_sim_step_s) + (v.run_own_loads ? "*" : " ");
    std::printf("%10s %6.2f %11s %6.2f %10s %10s %10s %6.2f  %s\n", format_seconds(v.measured_step_s).c_str(),
                v.measured_step_s / v.predicted_step_s, run_sim.c_str(),
                v.run_sim_step_s > 0 ? v.measured_step_s / v.run_sim_step_s : 0.0,
                format_bytes(v.predicted_peak_bytes).c_str(), format_bytes(v.measured_peak_bytes).c_str(),
                format_bytes(v.run_sim_peak_bytes).c_str(), v.worst_memory_ratio, v.strategy.c_str());
  }
  std::printf(
      "  Kendall tau (predicted vs measured order) %.2f, with each run's own simulation %.2f; the measured "
      "fastest is the planner's #%d",
      r.kendall_tau, r.kendall_tau_run_sim, r.measured_best_predicted_rank);
  if (r.first_over_fastest > 0) {
    std::printf("; its #1 (what --strategy auto takes) measured %.2fx the fastest", r.first_over_fastest);
  }
  std::printf("\n");
}

}  // namespace piper::cli
