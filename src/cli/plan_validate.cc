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
  for (const Json& r : j["predicted_vs_measured"]["ranks"]) {
    v->measured_step_s = std::max(v->measured_step_s, r["measured"]["step_time_s"].get<double>());
    v->measured_peak_bytes = std::max(v->measured_peak_bytes, r["measured"]["peak_memory_bytes"].get<double>());
  }
  return ok_status();
}

}  // namespace

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
  }
  return j;
}

Json ValidationReport::to_json() const {
  Json plans_json = Json::array();
  for (const ValidatedPlan& p : plans) plans_json.push_back(p.to_json());
  return Json{{"plans", plans_json},
              {"kendall_tau", kendall_tau},
              {"measured_best_predicted_rank", measured_best_predicted_rank}};
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
  std::vector<double> predicted, measured;
  double best = 0;
  for (const ValidatedPlan& v : report.plans) {
    if (!v.error.empty()) continue;
    predicted.push_back(v.predicted_step_s);
    measured.push_back(v.measured_step_s);
    if (report.measured_best_predicted_rank == 0 || v.measured_step_s < best) {
      best = v.measured_step_s;
      report.measured_best_predicted_rank = v.predicted_rank;
    }
  }
  report.kendall_tau = kendall_tau(predicted, measured);
  return report;
}

void print_validation(const ValidationReport& r, int steps, int ranks) {
  std::printf("\nvalidation: each plan trained %d steps on %d local ranks (measured: the slowest rank's mean step "
              "after the first; memory: the largest rank's peak)\n",
              steps, ranks);
  std::printf("  %-4s %-4s %10s %10s %10s %6s %10s %10s  %s\n", "#", "pick", "predicted", "closed", "measured", "x",
              "pred mem", "meas mem", "strategy");
  for (const ValidatedPlan& v : r.plans) {
    std::printf("  %-4d %-4s %10s %10s ", v.predicted_rank, v.top ? "top" : "rest",
                format_seconds(v.predicted_step_s).c_str(), format_seconds(v.closed_form_step_s).c_str());
    if (!v.error.empty()) {
      std::printf("failed: %s  %s\n", elide(v.error).c_str(), v.strategy.c_str());
      continue;
    }
    std::printf("%10s %6.2f %10s %10s  %s\n", format_seconds(v.measured_step_s).c_str(),
                v.measured_step_s / v.predicted_step_s, format_bytes(v.predicted_peak_bytes).c_str(),
                format_bytes(v.measured_peak_bytes).c_str(), v.strategy.c_str());
  }
  std::printf("  Kendall tau (predicted vs measured order) %.2f; the measured fastest is the planner's #%d\n",
              r.kendall_tau, r.measured_best_predicted_rank);
}

}  // namespace piper::cli
