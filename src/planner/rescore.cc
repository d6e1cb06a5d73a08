#include "piper/planner/rescore.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>
#include <chrono>
#include <thread>

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
                                                                    options.calibration, so));
  return rep.step_time_s;
}

// Simulates plans[i] for every i in `which`, `threads` at a time, while the budget lasts. Returns how many ran.
size_t simulate_batch(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                      const SearchOptions& options, int threads, Clock::time_point start, std::vector<Plan*> which,
                      SearchStats* stats) {
  size_t done = 0;
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.simulate_budget_s));
  while (done < which.size()) {
    if (since(start) >= options.simulate_budget_s) {
      stats->simulate_budget_hit = true;
      break;
    }
    const size_t n = std::min(which.size() - done, static_cast<size_t>(std::max(1, threads)));
    std::vector<std::thread> pool;
    for (size_t i = 0; i < n; ++i) {
      pool.emplace_back([&, i] {
        Plan* p = which[done + i];
        if (!p->verified && options.verify) {  // local-search neighbours: the compiler check of search()'s plans
          TrainSpec vt = train;
          vt.micro_batch_size = p->strategy.mbs;
          const double capacity = options.memory_fraction * static_cast<double>(cluster.device.memory_bytes);
          p->verification = options.verifier
                                ? options.verifier(p->strategy, vt)
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
      });
    }
    for (auto& th : pool) th.join();
    for (size_t i = 0; i < n; ++i) {
      ++stats->simulated;
      const Plan* p = which[done + i];
      if (p->simulated) continue;
      if (p->sim_stopped) {
        ++stats->simulate_stopped;
        stats->simulate_budget_hit = true;
      } else {
        ++stats->simulate_failed;
      }
    }
    done += n;
    if (options.progress) {
      options.progress("simulate: " + std::to_string(stats->simulated) + " run (" +
                       std::to_string(stats->simulate_stopped) + " stopped by the budget), " +
                       format_seconds(since(start)) + " of the " + format_seconds(options.simulate_budget_s) +
                       " budget");
    }
  }
  return done;
}

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
  PIPER_ASSIGN_OR_RETURN(sim::SimReport rep, sim::simulate(model, cluster, t, strategy, options.calibration, so));
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

void rescore_with_simulator(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                            const SearchOptions& options, int threads, SearchResult* out) {
  const auto start = Clock::now();
  std::vector<Plan*> first;
  for (size_t i = 0; i < out->top.size() && static_cast<int>(i) < options.simulate_top; ++i) {
    first.push_back(&out->top[i]);
  }
  simulate_batch(model, cluster, train, options, threads, start, first, &out->stats);
  std::stable_sort(out->top.begin(), out->top.end(), sim_before);

  // Greedy local search from the best simulated plan.
  int steps_left = options.local_search_steps;
  if (out->top.empty() || !out->top.front().simulated) steps_left = 0;
  Plan best = out->top.empty() ? Plan{} : out->top.front();
  std::vector<Strategy> seen;
  for (const Plan& p : out->top) {
    if (p.simulated || !p.sim_error.empty()) seen.push_back(p.strategy);
  }
  const double capacity = options.memory_fraction * static_cast<double>(cluster.device.memory_bytes);
  while (steps_left > 0 && !out->stats.simulate_budget_hit) {
    std::vector<Plan> cands;
    for (Strategy n : neighbours(best.strategy)) {
      if (static_cast<int>(cands.size()) >= steps_left) break;
      if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
      seen.push_back(n);
      TrainSpec t = train;
      t.micro_batch_size = n.mbs;
      if (!n.validate_for(model, t, cluster.world_size()).ok()) continue;
      auto cm = cost::CostModel::create(model, cluster, t, options.calibration);
      if (!cm.ok()) continue;
      auto e = cm->estimate(n);
      if (!e.ok() || !e->fits || e->memory.total() > capacity) continue;
      Plan p;
      p.strategy = n;
      p.estimate = *e;
      p.origin = "local-search";
      cands.push_back(std::move(p));
    }
    if (cands.empty()) break;
    std::vector<Plan*> which;
    for (auto& c : cands) which.push_back(&c);
    const size_t ran = simulate_batch(model, cluster, train, options, threads, start, which, &out->stats);
    steps_left -= static_cast<int>(ran);
    out->stats.local_search_tried += static_cast<int64_t>(ran);
    const Plan* better = nullptr;
    for (const Plan& c : cands) {
      if (c.simulated && c.sim_step_time_s < (better ? better->sim_step_time_s : best.sim_step_time_s)) better = &c;
    }
    if (better == nullptr) break;
    ++out->stats.local_search_improved;
    best = *better;
    out->top.erase(
        std::remove_if(out->top.begin(), out->top.end(), [&](const Plan& q) { return q.strategy == best.strategy; }),
        out->top.end());
    out->top.insert(out->top.begin(), best);
  }
  if (static_cast<int>(out->top.size()) > options.top_k) out->top.resize(static_cast<size_t>(options.top_k));
  out->stats.simulate_time_s = since(start);
}

}  // namespace piper::planner
