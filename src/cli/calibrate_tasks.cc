#include "piper/cli/calibrate_tasks.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <thread>

#include "piper/base/clock.h"
#include "piper/base/units.h"
#include "piper/cli/calibrate_share.h"
#include "piper/cli/calibration_file.h"
#include "piper/cli/flags.h"
#include "piper/cli/train_report.h"
#include "piper/compile/plan.h"
#include "piper/cost/device_model.h"
#include "piper/cost/estimate.h"
#include "piper/ir/types.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/trainer.h"
#include "piper/runtime/training_run.h"
#include "piper/sim/task_time.h"
#include "piper/spec/counting.h"
#include "piper/spec/model_loader.h"
#include "piper/spec/part.h"

namespace piper::cli {
namespace {

// Per task kind of a plan: its instructions and their price, per step.
struct PlanTasks {
  std::map<std::string, int64_t> calls;
  std::map<std::string, double> priced_s;
};

// The key the executor times an instruction under (runtime::Core::execute and update), "" for none.
std::string task_key(const compile::Instruction& in) {
  if (in.op == compile::OpKind::kUpdate) return "update";
  if (in.op != compile::OpKind::kCompute || !in.part) return "";
  return ir::task_key(*in.part, in.pass);
}

// The simulator's price of every compute and update instruction of the trainer's (one-rank) plan, by key.
Result<PlanTasks> price_plan(const runtime::Trainer& trainer, const LocalMachine& machine) {
  PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(trainer.options().model, machine.cluster,
                                                                     trainer.train_spec(), machine.calibration));
  PIPER_ASSIGN_OR_RETURN(sim::TaskTimeFn price, sim::cost_task_time(cm, trainer.strategy(), machine.calibration));
  const compile::Program& program = trainer.compiled().plan.program(0);
  PlanTasks p;
  for (const compile::Stream& stream : program.streams) {
    for (const compile::Instruction& in : stream.instrs) {
      const std::string key = task_key(in);
      if (key.empty()) continue;
      ++p.calls[key];
      p.priced_s[key] += price(program, in);
    }
  }
  return p;
}

// The median of `v` (not empty; the mean of the middle two of an even count).
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One (thread count, mbs) run of a model's task profile: its trainer, kept between the rounds, and each timed step's
// seconds per task kind (not the exchanges, which the runtime times with their waits).
struct ProfileRun {
  int threads = 1;
  int64_t mbs = 1;
  std::unique_ptr<runtime::Trainer> trainer;
  PlanTasks plan;
  std::vector<std::map<std::string, double>> steps;
};

std::string run_name(const ModelSpec& model, int threads, int64_t mbs) {
  return model.name + " (" + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") + ", mbs " +
         std::to_string(mbs) + ")";
}

// The points of one run: every task kind of the plan, measured (the median over the timed steps of its seconds per
// step) and priced per step, both > 0.
Result<std::vector<TaskPoint>> run_points(const std::string& run, const ProfileRun& r, int64_t tokens) {
  for (const auto& step : r.steps) {
    for (const auto& [key, seconds] : step) {
      if (r.plan.calls.count(key) == 0) {
        return internal_error("task profile of " + run + ": the runtime timed task '" + key +
                              "', which the plan has no instruction of");
      }
    }
  }
  std::vector<TaskPoint> points;
  for (const auto& [key, calls] : r.plan.calls) {
    std::vector<double> per_step;
    for (const auto& step : r.steps) {
      const auto it = step.find(key);
      per_step.push_back(it == step.end() ? 0.0 : it->second);
    }
    TaskPoint p{r.threads, tokens, key, calls, per_step.empty() ? 0.0 : median_of(per_step), r.plan.priced_s.at(key)};
    if (!(p.measured_s > 0)) {
      return failed_precondition("task profile of " + run + ": task '" + key + "' (" + std::to_string(calls) +
                                 " calls per step) measured " + std::to_string(p.measured_s) +
                                 " s per step over the steps after the first; nothing written");
    }
    if (!(p.priced_s > 0)) {
      return failed_precondition("task profile of " + run + ": the cost model prices task '" + key + "' at " +
                                 std::to_string(p.priced_s) +
                                 " s per step, so measured / priced is undefined; nothing written");
    }
    points.push_back(p);
  }
  return points;
}

// The largest over runs of a run's slowest timed step over its fastest (the sum of its tasks' seconds), minus 1: how
// much the machine's own speed moved while the profile ran.
double step_spread(const std::vector<ProfileRun>& runs) {
  double spread = 0;
  for (const ProfileRun& r : runs) {
    std::vector<double> totals;
    for (const auto& step : r.steps) {
      double sum = 0;
      for (const auto& [key, seconds] : step) sum += seconds;
      totals.push_back(sum);
    }
    const auto [lo, hi] = std::minmax_element(totals.begin(), totals.end());
    if (lo != totals.end() && *lo > 0) spread = std::max(spread, *hi / *lo - 1);
  }
  return spread;
}

// The model trained on one rank (dp=1) in two microbatches of `mbs` sequences of seq_len, as the task profile's runs
// and the model's core-sharing workers train it.
runtime::TrainOptions one_rank_options(const ModelSpec& model, int64_t mbs, int64_t seq_len) {
  runtime::TrainOptions t;
  t.model = model;
  t.strategy = "dp=1,microbatches=2,mbs=" + std::to_string(mbs);
  t.global_batch = 2 * mbs;
  t.seq_len = seq_len;
  return t;
}

// A run's trainer, built for `threads` kernel threads and two microbatches of `mbs` sequences, and its plan priced.
Result<ProfileRun> start_run(const ModelSpec& model, const TaskProfileOptions& o, const DeviceCalibration& device,
                             int threads, int64_t mbs) {
  ProfileRun r;
  r.threads = threads;
  r.mbs = mbs;
  PIPER_ASSIGN_OR_RETURN(LocalMachine machine, local_cluster(1, threads, device, kNoLinkCalibration));
  runtime::TrainOptions t = one_rank_options(model, mbs, o.seq_len);
  t.plan_prices = local_plan_prices(machine, model);
  PIPER_ASSIGN_OR_RETURN(r.trainer, runtime::Trainer::create(t));
  PIPER_ASSIGN_OR_RETURN(r.plan, price_plan(*r.trainer, machine));
  return r;
}

// One step of a run at its thread count; a timed step's task seconds are kept.
Status step_run(ProfileRun* r, bool timed) {
  kernels::set_kernel_threads(r->threads);
  PIPER_ASSIGN_OR_RETURN(runtime::TrainStepStats s, r->trainer->step());
  if (!timed) return ok_status();
  std::map<std::string, double> tasks;
  for (const auto& [key, seconds] : s.task_seconds) {
    if (!runtime::is_exchange_task(key)) tasks[key] += seconds;
  }
  r->steps.push_back(std::move(tasks));
  return ok_status();
}

// Every (threads, mbs) run of the model, stepped in rounds: each round steps every run once, so that the shared
// machine's slow and fast spells (seconds to tens of seconds here) fall on every run alike instead of on one run
// whole; each point is its run's median step.
Result<TaskProfile> profile_model(const ModelSpec& model, const TaskProfileOptions& o,
                                  const DeviceCalibration& device) {
  TaskProfile p{model.name, count_params(model).total(), o.seq_len, {}, {}};
  std::fprintf(stderr,
               "calibrate: task profile %s: %zu runs (%zu thread count(s) x %zu mbs), %lld steps each, in "
               "rounds\n",
               model.name.c_str(), o.threads.size() * o.mbs.size(), o.threads.size(), o.mbs.size(),
               static_cast<long long>(o.steps));
  std::vector<ProfileRun> runs;
  for (int threads : o.threads) {
    for (int64_t mbs : o.mbs) {
      Result<ProfileRun> r = start_run(model, o, device, threads, mbs);
      if (!r.ok()) return r.status().with_context("task profile of " + run_name(model, threads, mbs));
      runs.push_back(std::move(r).value());
    }
  }
  for (int64_t step = 0; step < o.steps; ++step) {
    for (ProfileRun& r : runs) {
      Status st = step_run(&r, step > 0);  // the first: first-touch page faults, the pool's first allocations
      if (!st.ok()) return st.with_context("task profile of " + run_name(model, r.threads, r.mbs));
    }
  }
  for (const ProfileRun& r : runs) {
    PIPER_ASSIGN_OR_RETURN(std::vector<TaskPoint> points,
                           run_points(run_name(model, r.threads, r.mbs), r, r.mbs * o.seq_len));
    p.points.insert(p.points.end(), points.begin(), points.end());
  }
  p.step_spread = step_spread(runs);
  return p;
}

}  // namespace

Result<std::vector<ModelSpec>> load_task_profile_models(const TaskProfileOptions& o) {
  if (o.steps < 2) {
    return invalid_argument("task profile: " + std::to_string(o.steps) +
                            " steps; give >= 2 (the first step is not timed)");
  }
  for (int t : o.threads) {
    if (t < 1) return invalid_argument("task profile: thread count " + std::to_string(t) + "; give >= 1");
  }
  for (int64_t m : o.mbs) {
    if (m < 1) return invalid_argument("task profile: mbs " + std::to_string(m) + "; give >= 1");
  }
  std::vector<ModelSpec> models;
  for (const std::string& name : o.models) {
    Result<ModelSpec> model = load_model(name);
    if (!model.ok()) return model.status().with_context("--model " + name);
    PIPER_RETURN_IF_ERROR(check_seq_len(*model, o.seq_len));
    models.push_back(std::move(model).value());
  }
  return models;
}

Result<std::vector<TaskProfile>> measure_task_profiles(const TaskProfileOptions& o, const Json& device_file) {
  PIPER_ASSIGN_OR_RETURN(std::vector<ModelSpec> models, load_task_profile_models(o));
  DeviceCalibration device;
  PIPER_ASSIGN_OR_RETURN(device.calibration, cost::Calibration::from_json(device_file, "the measured figures"));
  // The raw price: a device file that already holds task profiles (an earlier calibrate's) must not scale it.
  device.calibration.task_profiles.clear();
  device.source = "the figures this calibration measured";
  const int threads_before = kernels::kernel_threads();
  std::vector<TaskProfile> profiles;
  for (const ModelSpec& model : models) {
    Result<TaskProfile> p = profile_model(model, o, device);
    if (!p.ok()) {
      kernels::set_kernel_threads(threads_before);
      return p.status();
    }
    profiles.push_back(std::move(p).value());
  }
  kernels::set_kernel_threads(threads_before);
  return profiles;
}

std::vector<UnscaledThreads> drop_implausible_threads(std::vector<TaskProfile>* profiles) {
  std::vector<UnscaledThreads> dropped;
  std::vector<TaskProfile> kept;
  for (TaskProfile& p : *profiles) {
    // Per thread count with a point outside the bound, the one furthest from its price (in log ratio).
    std::map<int, UnscaledThreads> worst;
    for (const TaskPoint& t : p.points) {
      const double ratio = t.measured_s / t.priced_s;
      if (cost::task_scale_plausible(ratio)) continue;
      auto [it, added] = worst.try_emplace(t.threads, UnscaledThreads{p.model, t.threads, t.task, t.tokens, ratio});
      if (!added && std::abs(std::log(ratio)) > std::abs(std::log(it->second.ratio))) {
        it->second = UnscaledThreads{p.model, t.threads, t.task, t.tokens, ratio};
      }
    }
    for (const auto& [threads, w] : worst) dropped.push_back(w);
    std::erase_if(p.points, [&worst](const TaskPoint& t) { return worst.count(t.threads) > 0; });
    if (!p.points.empty()) kept.push_back(std::move(p));
  }
  *profiles = std::move(kept);
  return dropped;
}

std::string unscaled_threads_note(const UnscaledThreads& u) {
  char ratio[32];
  std::snprintf(ratio, sizeof(ratio), "%.3gx", u.ratio);
  const std::string threads = std::to_string(u.threads) + " thread" + (u.threads == 1 ? "" : "s");
  return "task profile of " + u.model + " at " + threads + " left out of the file: " + u.task + " at " +
         std::to_string(u.tokens) + " tokens measured " + ratio + " its price (outside 1/" +
         std::to_string(static_cast<int>(cost::kMaxTaskScale)) + ".." +
         std::to_string(static_cast<int>(cost::kMaxTaskScale)) + "x: a loaded machine's measurement); " + u.model +
         "'s tasks on " + threads +
         " are priced unscaled, like an unfitted thread count; run `piper calibrate --model " + u.model +
         "` again on a quiet machine";
}

Status run_model_share_worker(const std::string& prefix, const std::string& model_name, int64_t seq_len,
                              double window_s) {
  kernels::set_kernel_threads(1);
  PIPER_ASSIGN_OR_RETURN(ModelSpec model, load_model(model_name));
  PIPER_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Trainer> trainer,
                         runtime::Trainer::create(one_rank_options(model, kShareMbs, seq_len)));
  PIPER_RETURN_IF_ERROR(trainer->step().status());  // first-touch page faults, as the task profile's first step
  PIPER_ASSIGN_OR_RETURN(const double start_s, meet_share_workers(prefix));
  while (wall_s() < start_s) std::this_thread::sleep_for(std::chrono::microseconds(200));
  ShareSample s;
  const double cpu0 = process_cpu_s(), wall0 = wall_s();
  while (s.calls < kShareMinSteps || wall_s() < start_s + window_s) {
    PIPER_RETURN_IF_ERROR(trainer->step().status());
    ++s.calls;
  }
  s.cpu_s = process_cpu_s() - cpu0;
  s.wall_s = wall_s() - wall0;
  std::printf("%s %.0f %.9f %.9f\n", kModelShareTag, s.calls, s.cpu_s, s.wall_s);
  return ok_status();
}

namespace {

// n workers of run_model_share_worker: their samples.
Result<std::vector<ShareSample>> model_share_run(const std::string& model, int64_t seq_len, int n, double window_s) {
  auto args = [&](const std::string& prefix) {
    return "--model-share-worker " + shell_quote(prefix) + " --model " + shell_quote(model) + " --seq " +
           std::to_string(seq_len) + " --share-window " + std::to_string(window_s);
  };
  // Each worker builds its trainer and makes a step before it is ready: a large model's copies on few cores take
  // a while.
  PIPER_ASSIGN_OR_RETURN(std::vector<std::string> texts, run_share_workers(n, args, 600.0));
  std::vector<ShareSample> out;
  const std::string tag = std::string(kModelShareTag) + " ";
  for (const std::string& text : texts) {
    const size_t at = text.rfind(tag);
    ShareSample s;
    if (at == std::string::npos ||
        std::sscanf(text.c_str() + at + tag.size(), "%lf %lf %lf", &s.calls, &s.cpu_s, &s.wall_s) != 3) {
      return unavailable("calibrate: a model sharing worker printed no steps: " + text);
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace

namespace {

// One round of measure_model_sharing: one copy alone, then n = 2..max_ranks at once, then one alone again; per n its
// efficiency per CPU second against the faster alone (other load only ever slows it down: one slow baseline would
// lift every n above 1).
Result<std::vector<double>> model_sharing_round(const std::string& model, int64_t seq_len, int max_ranks,
                                                double window_s, double cores) {
  PIPER_ASSIGN_OR_RETURN(std::vector<ShareSample> alone, model_share_run(model, seq_len, 1, window_s));
  std::vector<std::vector<ShareSample>> runs;
  for (int n = 2; n <= max_ranks; ++n) {
    PIPER_ASSIGN_OR_RETURN(std::vector<ShareSample> together, model_share_run(model, seq_len, n, window_s));
    runs.push_back(std::move(together));
  }
  PIPER_ASSIGN_OR_RETURN(std::vector<ShareSample> after, model_share_run(model, seq_len, 1, window_s));
  auto per_cpu = [](const ShareSample& s) { return s.calls / s.cpu_s; };
  const ShareSample& best = per_cpu(after[0]) > per_cpu(alone[0]) ? after[0] : alone[0];
  std::vector<double> sharing;
  for (const std::vector<ShareSample>& together : runs) {
    PIPER_ASSIGN_OR_RETURN(SharingEfficiency e, sharing_efficiency(best, together, cores));
    sharing.push_back(e.per_cpu);
  }
  return sharing;
}

}  // namespace

Result<std::vector<double>> measure_model_sharing(const std::string& model, int64_t seq_len, int max_ranks,
                                                  double window_s, double cores, int rounds) {
  if (rounds < 1) {
    return invalid_argument("calibrate: core sharing of " + model + "'s own steps in " + std::to_string(rounds) +
                            " rounds; give --sharing-rounds >= 1 (0 skips the stage)");
  }
  std::vector<std::vector<double>> by_n(static_cast<size_t>(std::max(0, max_ranks - 1)));
  for (int round = 1; round <= rounds; ++round) {
    std::fprintf(stderr, "calibrate: core sharing of %s's own steps, round %d of %d: 1..%d processes at once\n",
                 model.c_str(), round, rounds, max_ranks);
    PIPER_ASSIGN_OR_RETURN(std::vector<double> got, model_sharing_round(model, seq_len, max_ranks, window_s, cores));
    for (size_t k = 0; k < got.size() && k < by_n.size(); ++k) by_n[k].push_back(got[k]);
  }
  std::vector<double> sharing;
  for (const std::vector<double>& rounds_of_n : by_n) {
    const double e = median_of(rounds_of_n);
    // The file's bounds (cost::Calibration's core_sharing): outside them a disturbed measurement, not a machine.
    if (!(e >= cost::kMinSharingEfficiency && e <= cost::kMaxSharingEfficiency)) {
      return unavailable("calibrate: " + model + "'s steps with " + std::to_string(sharing.size() + 2) +
                         " processes at once kept " + std::to_string(e) +
                         " of their speed per CPU second (the median of " + std::to_string(rounds) +
                         " rounds), outside " + std::to_string(cost::kMinSharingEfficiency) + ".." +
                         std::to_string(cost::kMaxSharingEfficiency) + ": a disturbed measurement");
    }
    sharing.push_back(e);
  }
  return sharing;
}

Json task_profiles_json(const std::vector<TaskProfile>& profiles) {
  Json list = Json::array();
  for (const TaskProfile& p : profiles) {
    Json points = Json::array();
    for (const TaskPoint& t : p.points) {
      points.push_back({{"threads", t.threads},
                        {"tokens", t.tokens},
                        {"task", t.task},
                        {"calls", t.calls},
                        {"measured_s", t.measured_s},
                        {"priced_s", t.priced_s}});
    }
    Json entry{{"model", p.model}, {"parameters", p.parameters}, {"seq", p.seq_len}, {"points", points}};
    if (!p.sharing.empty()) {
      Json sharing = Json::array();
      for (size_t k = 0; k < p.sharing.size(); ++k) {
        sharing.push_back({{"ranks", static_cast<int>(k) + 2}, {"efficiency", p.sharing[k]}});
      }
      entry["sharing"] = sharing;
    }
    list.push_back(entry);
  }
  return list;
}

void print_task_profiles(const std::vector<TaskProfile>& profiles) {
  for (const TaskProfile& p : profiles) {
    std::map<int, std::vector<TaskPoint>> by_threads;
    for (const TaskPoint& t : p.points) by_threads[t.threads].push_back(t);
    for (auto& [threads, points] : by_threads) {
      // A task's sizes next to each other: how its ratio moves with the tokens.
      std::stable_sort(points.begin(), points.end(),
                       [](const TaskPoint& a, const TaskPoint& b) { return a.task < b.task; });
      std::printf(
          "tasks     %s (%s parameters, seq %lld), one rank, %d thread%s: per call, measured (the median "
          "step after the first) against the simulator's price\n",
          p.model.c_str(), format_count(static_cast<double>(p.parameters)).c_str(), static_cast<long long>(p.seq_len),
          threads, threads == 1 ? "" : "s");
      std::printf("  %-12s %7s %6s %12s %12s %10s\n", "task", "tokens", "calls", "measured", "priced", "x price");
      for (const TaskPoint& t : points) {
        std::printf("  %-12s %7lld %6lld %12s %12s %9.2fx\n", t.task.c_str(), static_cast<long long>(t.tokens),
                    static_cast<long long>(t.calls), format_seconds(t.measured_s / t.calls).c_str(),
                    format_seconds(t.priced_s / t.calls).c_str(), t.measured_s / t.priced_s);
      }
    }
    std::printf(
        "  %s's steps varied by up to %.0f %% within a run (slowest over fastest): the machine's own speed "
        "moving, which every figure above and every measured run carries\n",
        p.model.c_str(), 100 * p.step_spread);
  }
}

}  // namespace piper::cli
