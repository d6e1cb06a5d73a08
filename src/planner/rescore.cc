#include "piper/planner/rescore.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "piper/base/units.h"
#include "piper/sim/simulate.h"

namespace piper::planner {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

VerifyOptions verify_options(const SearchOptions& options) {
  VerifyOptions v;
  v.memory_screen = options.memory_screen;
  v.data_edges = options.data_edges;
  return v;
}

// CPU ranks sharing a machine's cores (--local-ranks: NodeSpec::shared_cores) are few and simulated in full, so
// that the simulator shares the cores among the ranks computing at each moment (sim/simulate.h core_pool_of)
// instead of pricing every rank at the static share as representative ranks do.
sim::SimOptions rescore_sim_options(const ClusterSpec& cluster, const SearchOptions& options,
                                    Clock::time_point deadline) {
  sim::SimOptions so;
  so.deadline = deadline;
  so.plan_hash = false;
  so.data_edges = options.data_edges;
  so.full = cluster.node.shared_cores > 0;
  return so;
}

// The simulated step time of `p`: from the compile its verification kept (SearchOptions::reuse_compiles), else
// compiled here (simulate_step_time).
Result<double> simulate_plan_step_time(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                       Plan* p, const SearchOptions& options, Clock::time_point deadline) {
  if (!p->compiled) return simulate_step_time(model, cluster, train, p->strategy, options, deadline);
  TrainSpec t = train;
  t.micro_batch_size = p->strategy.mbs;
  sim::SimOptions so = rescore_sim_options(cluster, options, deadline);
  compile::CompileResult compiled = std::move(*p->compiled);
  p->compiled.reset();
  PIPER_ASSIGN_OR_RETURN(sim::SimReport rep, sim::simulate_compiled(std::move(compiled), model, cluster, t, p->strategy,
                                                                    options.calibration_for(p->strategy.ep), so));
  return rep.step_time_s;
}

// Verifies (a local-search neighbour) and simulates *p; fills its simulated fields. Runs on a worker thread.
void simulate_one(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                  const SearchOptions& options, Clock::time_point start, Clock::time_point deadline, Plan* p) {
  if (!p->verified && options.verify) {  // local-search neighbours: the compiler check of search()'s plans
    TrainSpec vt = train;
    vt.micro_batch_size = p->strategy.mbs;
    const double capacity = options.memory_fraction * static_cast<double>(cluster.device.memory_bytes);
    p->verification = options.verifier ? options.verifier(p->strategy, vt)
                                       : verify_strategy(model, vt, p->strategy, capacity, verify_options(options));
    p->verified = p->verification.ok;
    if (!p->verified) {
      p->sim_error = "not verified: " + p->verification.message;
      return;
    }
  }
  // A plan the memory screen accepted has not been compiled in full: do not start a compile that
  // cannot finish within the budget (compiles are not interrupted, verify.h).
  const double left_s = options.simulate_budget_s - since(start);
  if (!p->compiled && !options.simulator && p->verification.screened &&
      p->verification.full_compile_estimate_s > left_s) {
    p->sim_error = "not simulated: budget: compiling its " + std::to_string(p->strategy.microbatches) +
                   " microbatches would take about " + format_seconds(p->verification.full_compile_estimate_s) +
                   ", more than the " + format_seconds(std::max(0.0, left_s)) + " left";
    p->sim_stopped = true;
    return;
  }
  auto t = simulate_plan_step_time(model, cluster, train, p, options, deadline);
  if (t.ok()) {
    p->simulated = true;
    p->sim_step_time_s = *t;
  } else {
    p->sim_error = t.status().message();
    p->sim_stopped = t.status().code() == StatusCode::kDeadlineExceeded;
  }
}

// One re-scoring: the clock, the budget, the bound and the counters shared by both steps.
class Rescoring {
 public:
  Rescoring(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train, const SearchOptions& options,
            int threads, SearchStats* stats)
      : model_(model),
        cluster_(cluster),
        train_(train),
        options_(options),
        stats_(stats),
        slots_(static_cast<size_t>(std::max(1, threads))),
        start_(Clock::now()),
        deadline_(start_ + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(options.simulate_budget_s))) {}

  size_t slots() const { return slots_; }
  const SimRatioBound& bound() const { return bound_; }
  double elapsed_s() const { return since(start_); }

  // False (and the budget marked hit) once the budget is spent: no batch starts after that.
  bool budget_left() {
    if (since(start_) < options_.simulate_budget_s) return true;
    stats_->simulate_budget_hit = true;
    return false;
  }

  // Simulates every plan of `batch` (at most slots()) at once, then counts them and feeds the bound.
  void run(const std::vector<Plan*>& batch) {
    std::vector<std::thread> pool;
    for (Plan* p : batch) {
      pool.emplace_back([this, p] { simulate_one(model_, cluster_, train_, options_, start_, deadline_, p); });
    }
    for (auto& th : pool) th.join();
    for (const Plan* p : batch) {
      ++stats_->simulated;
      if (p->simulated) {
        bound_.observe(p->estimate.step_time_s, p->sim_step_time_s);
      } else if (p->sim_stopped) {
        ++stats_->simulate_stopped;
        stats_->simulate_budget_hit = true;
      } else {
        ++stats_->simulate_failed;
      }
    }
    stats_->sim_ratio_min = bound_.min_ratio();
    report();
  }

  // One line of progress (SearchOptions::progress): runs, stops, neighbours ruled out, time.
  void report() const {
    if (!options_.progress) return;
    options_.progress("simulate: " + std::to_string(stats_->simulated) + " run (" +
                      std::to_string(stats_->simulate_stopped) + " stopped by the budget), " +
                      std::to_string(stats_->local_search_ruled_out) + " neighbours ruled out by the bound, " +
                      format_seconds(since(start_)) + " of the " + format_seconds(options_.simulate_budget_s) +
                      " budget");
  }

  // A plan the simulator refuses without compiling (a closed-form-only mesh order): marked failed, as the
  // simulator would, without a slot. Fake simulators (options.simulator) decide for themselves.
  bool refuse(Plan* p) {
    if (options_.simulator) return false;
    Status order = sim::check_simulated_order(p->strategy);
    if (order.ok()) return false;
    p->sim_error = order.message();
    ++stats_->simulated;
    ++stats_->simulate_failed;
    return true;
  }

 private:
  const ModelSpec& model_;
  const ClusterSpec& cluster_;
  const TrainSpec& train_;
  const SearchOptions& options_;
  SearchStats* stats_;
  size_t slots_;
  Clock::time_point start_, deadline_;
  SimRatioBound bound_;
};

bool sim_before(const Plan& a, const Plan& b) {
  if (a.simulated != b.simulated) return a.simulated;
  if (a.simulated && a.sim_step_time_s != b.sim_step_time_s) return a.sim_step_time_s < b.sim_step_time_s;
  return false;  // stable sort keeps the closed-form order
}

}  // namespace

Result<double> simulate_step_time(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                  const Strategy& strategy, const SearchOptions& options,
                                  std::chrono::steady_clock::time_point deadline) {
  TrainSpec t = train;
  t.micro_batch_size = strategy.mbs;
  if (options.simulator) return options.simulator(strategy, t);
  sim::SimOptions so = rescore_sim_options(cluster, options, deadline);
  PIPER_ASSIGN_OR_RETURN(sim::SimReport rep,
                         sim::simulate(model, cluster, t, strategy, options.calibration_for(strategy.ep), so));
  return rep.step_time_s;
}

std::vector<Strategy> neighbours(const Strategy& s) {
  std::vector<Strategy> out;
  auto add = [&](Strategy n) {
    if (!(n == s) && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(std::move(n));
  };
  // Micro batch size x2 and /2 at the same global batch.
  if (s.microbatches % 2 == 0) {
    Strategy n = s;
    n.mbs *= 2;
    n.microbatches /= 2;
    add(n);
  }
  if (s.mbs % 2 == 0) {
    Strategy n = s;
    n.mbs /= 2;
    n.microbatches *= 2;
    add(n);
  }
  for (const char* sched : {"1f1b", "zb-h1", "dualpipev", "interleaved"}) {
    Strategy n = s;
    n.schedule = sched;
    n.vpp = n.schedule == "interleaved" ? 2 : 1;
    add(n);
  }
  for (int z = 0; z <= 3; ++z) {
    Strategy n = s;
    n.zero = z;
    add(n);
  }
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    Strategy n = s;
    n.recompute = r;
    add(n);
  }
  if (s.ep > 1) {
    Strategy n = s;
    n.a2a = s.a2a == "flat" ? "halo" : "flat";
    add(n);
  }
  return out;
}

void SimRatioBound::observe(double closed_form_s, double simulated_s) {
  if (!(closed_form_s > 0) || !(simulated_s > 0)) return;
  const double r = simulated_s / closed_form_s;
  min_ratio_ = observed_ == 0 ? r : std::min(min_ratio_, r);
  ++observed_;
}

namespace {

// Step 1: the first options.simulate_top plans, `slots` at a time; refused orders take no slot.
void rescore_first(const SearchOptions& options, Rescoring* run, SearchResult* out) {
  size_t next = 0;
  const size_t n = std::min(out->top.size(), static_cast<size_t>(std::max(0, options.simulate_top)));
  while (next < n && run->budget_left()) {
    std::vector<Plan*> batch;
    while (batch.size() < run->slots() && next < n) {
      Plan* p = &out->top[next++];
      if (!run->refuse(p)) batch.push_back(p);
    }
    if (!batch.empty()) run->run(batch);
  }
}

// The neighbours of `from` not in `seen` that validate and fit by the closed form, as plans with their estimates,
// best closed form first (ties in neighbours() order).
std::vector<Plan> fitting_neighbours(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                     const SearchOptions& options, const Strategy& from,
                                     const std::vector<Strategy>& seen) {
  const double capacity = options.memory_fraction * static_cast<double>(cluster.device.memory_bytes);
  std::vector<Plan> out;
  for (Strategy n : neighbours(from)) {
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
    TrainSpec t = train;
    t.micro_batch_size = n.mbs;
    if (!n.validate_for(model, t, cluster.world_size()).ok()) continue;
    auto cm = cost::CostModel::create(model, cluster, t, options.calibration_for(n.ep));
    if (!cm.ok()) continue;
    auto e = cm->estimate(n);
    if (!e.ok() || !e->fits || e->memory.total() > capacity) continue;
    Plan p;
    p.strategy = std::move(n);
    p.estimate = *e;
    p.origin = "local-search";
    out.push_back(std::move(p));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Plan& a, const Plan& b) { return a.estimate.step_time_s < b.estimate.step_time_s; });
  return out;
}

// One round of the local search: simulates `cands` in order, `slots` at a time, skipping those the bound rules
// out against the best simulated step time so far (best_s, updated); returns the fastest simulated candidate.
const Plan* local_search_round(const SearchOptions& options, Rescoring* run, std::vector<Plan>* cands, double* best_s,
                               int* steps_left, std::vector<Strategy>* seen, std::vector<Strategy>* ruled_out,
                               SearchStats* stats) {
  const Plan* fastest = nullptr;
  size_t next = 0;
  while (next < cands->size() && *steps_left > 0 && run->budget_left()) {
    std::vector<Plan*> batch;
    while (batch.size() < std::min(run->slots(), static_cast<size_t>(*steps_left)) && next < cands->size()) {
      Plan* c = &(*cands)[next++];
      if (options.rescore_bound && !run->bound().may_beat(c->estimate.step_time_s, *best_s)) {
        if (std::find(ruled_out->begin(), ruled_out->end(), c->strategy) == ruled_out->end()) {
          ruled_out->push_back(c->strategy);
          ++stats->local_search_ruled_out;
        }
        continue;
      }
      seen->push_back(c->strategy);
      batch.push_back(c);
    }
    if (batch.empty()) break;
    run->run(batch);
    *steps_left -= static_cast<int>(batch.size());
    stats->local_search_tried += static_cast<int64_t>(batch.size());
    for (const Plan* c : batch) {
      if (c->simulated && (fastest == nullptr || c->sim_step_time_s < fastest->sim_step_time_s)) fastest = c;
      if (c->simulated) *best_s = std::min(*best_s, c->sim_step_time_s);
    }
  }
  return fastest;
}

}  // namespace

void rescore_with_simulator(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                            const SearchOptions& options, int threads, SearchResult* out) {
  Rescoring run(model, cluster, train, options, threads, &out->stats);
  rescore_first(options, &run, out);
  std::stable_sort(out->top.begin(), out->top.end(), sim_before);

  // Greedy local search from the best simulated plan.
  int steps_left = options.local_search_steps;
  if (out->top.empty() || !out->top.front().simulated) steps_left = 0;
  Plan best = out->top.empty() ? Plan{} : out->top.front();
  double best_s = best.sim_step_time_s;
  std::vector<Strategy> seen, ruled_out;
  for (const Plan& p : out->top) {
    if (p.simulated || !p.sim_error.empty()) seen.push_back(p.strategy);
  }
  while (steps_left > 0 && !out->stats.simulate_budget_hit) {
    std::vector<Plan> cands = fitting_neighbours(model, cluster, train, options, best.strategy, seen);
    const Plan* better =
        local_search_round(options, &run, &cands, &best_s, &steps_left, &seen, &ruled_out, &out->stats);
    if (better == nullptr || !(better->sim_step_time_s < best.sim_step_time_s)) break;
    ++out->stats.local_search_improved;
    best = *better;
    out->top.erase(
        std::remove_if(out->top.begin(), out->top.end(), [&](const Plan& q) { return q.strategy == best.strategy; }),
        out->top.end());
    out->top.insert(out->top.begin(), best);
  }
  if (out->stats.local_search_ruled_out > 0) run.report();
  if (static_cast<int>(out->top.size()) > options.top_k) out->top.resize(static_cast<size_t>(options.top_k));
  out->stats.simulate_time_s = run.elapsed_s();
}

}  // namespace piper::planner
