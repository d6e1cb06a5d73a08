// Search time for DeepSeek-V3 on 256 H800 nodes (global batch 15,360 x 4,096; the docs/planner.md case) and
// Mixtral-8x7B on 8 DGX-H100 nodes, without compiler verification, against brute_force() over the same space
// (every candidate through validate_for + estimate, one thread) measured in the same run. Prints both times,
// the speed-up, the goal (< 60 s for the DeepSeek-V3 plan including verification) and whether the two agree.
// Then verification and simulator re-scoring of DeepSeek-V2-Lite on 4 H800 nodes with the compile reuse
// (SearchOptions::reuse_compiles) against without it, in the same run: CPU seconds of each, their ratio, and whether
// the plans and simulated step times agree. Then the compile of the DeepSeek-V3 plan's #1 (DualPipeV, pp=8) at 32
// microbatches with one cycle check per run of order directives (CompileOptions::defer_order_cycle_checks, the
// default) against a check after every order directive (the former path), in the same run: CPU seconds, ratio and
// whether the two plans are equal.
// Then the search of DeepSeek-V3 on 32 H800 nodes with the closed form's HALO memo against without it.
// Then search + verification of the DeepSeek-V3 / 2,048-GPU case with the verdict cache against without it.
// Then the compile of the DeepSeek-V3 #1 plan (120 microbatches) for the simulator without Instruction::inputs/outputs
// (SimOptions::data_edges = false, the planner's compiles) against with them, in the same run, alternating (3 pairs):
// CPU seconds, ratio, and whether the plans are equal but for those fields.
// Then the whole DeepSeek-V3 / 2,048-GPU plan with `piper plan`'s defaults (verification, simulator re-scoring of
// the top 5, 8 local-search steps, 15 s budget) with re-scoring's stopping rule (SearchOptions::rescore_bound, the
// default) against without it (the former path), alternating (2 pairs): wall and CPU seconds, ratios, and whether
// #1 and its simulated step time agree.
// `plan_bench --compile-only` runs only the compile comparison, `--memo-only` only the memo one, `--verify-cache-only`
// only the verdict cache one, `--data-edges-only` only the data edges one, `--rescore-bound-only` only the last.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <string>
#include <vector>

#include "piper/compile/compile.h"
#include "piper/planner/search.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace {

int run_case(const char* model_name, const char* cluster_name, int nodes, int64_t batch, int64_t seq, int threads) {
  auto model = piper::load_model(model_name);
  auto cluster = piper::load_cluster(cluster_name, nodes);
  if (!model.ok() || !cluster.ok()) {
    std::fprintf(stderr, "plan_bench: cannot load %s / %s\n", model_name, cluster_name);
    return 1;
  }
  piper::TrainSpec train;
  train.global_batch = batch;
  train.seq_len = seq;
  piper::planner::SearchOptions o;
  o.verify = false;
  o.threads = threads;
  auto fast = piper::planner::search(*model, *cluster, train, o);
  auto slow = piper::planner::brute_force(*model, *cluster, train, o);
  if (!fast.ok() || !slow.ok()) {
    std::fprintf(stderr, "plan_bench: %s\n", (fast.ok() ? slow.status() : fast.status()).message().c_str());
    return 1;
  }
  const bool agree = !fast->top.empty() && !slow->top.empty() &&
                     fast->top[0].strategy.to_string() == slow->top[0].strategy.to_string();
  std::printf(
      "%-16s %-9s x%-4d candidates %9lld  search %8.3f s (%d threads, %lld scored)  brute force %8.3f s "
      "(%lld scored)  speed-up %6.1fx  same best: %s\n",
      model_name, cluster_name, nodes, static_cast<long long>(fast->stats.considered), fast->stats.search_time_s,
      threads, static_cast<long long>(fast->stats.scored), slow->stats.search_time_s,
      static_cast<long long>(slow->stats.scored), slow->stats.search_time_s / fast->stats.search_time_s,
      agree ? "yes" : "NO");
  return agree ? 0 : 1;
}

// The closed form's HALO memo (SearchOptions::memoise_closed_form) against recomputing the HALO traffic per
// candidate, on DeepSeek-V3 / 256 H800s (the 2,048-GPU case takes about 300 s of CPU without it).
int run_memo_case(int threads) {
  auto model = piper::load_model("deepseek-v3");
  auto cluster = piper::load_cluster("h800", 32);
  if (!model.ok() || !cluster.ok()) return 1;
  piper::TrainSpec train;
  train.global_batch = 15360;
  train.seq_len = 4096;
  piper::planner::SearchOptions o;
  o.verify = false;
  o.threads = threads;
  o.top_k = 20;
  double cpu_s[2], wall_s[2];
  piper::Result<piper::planner::SearchResult> r[2] = {piper::internal_error("not run"),
                                                      piper::internal_error("not run")};
  for (int memo = 0; memo < 2; ++memo) {
    o.memoise_closed_form = memo == 1;
    const std::clock_t c0 = std::clock();
    const auto w0 = std::chrono::steady_clock::now();
    r[memo] = piper::planner::search(*model, *cluster, train, o);
    cpu_s[memo] = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    wall_s[memo] = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    if (!r[memo].ok()) {
      std::fprintf(stderr, "plan_bench: %s\n", r[memo].status().message().c_str());
      return 1;
    }
  }
  bool same = r[0]->top.size() == r[1]->top.size() && r[0]->stats.scored == r[1]->stats.scored;
  for (size_t i = 0; same && i < r[0]->top.size(); ++i) {
    same = r[0]->top[i].strategy == r[1]->top[i].strategy &&
           r[0]->top[i].estimate.step_time_s == r[1]->top[i].estimate.step_time_s;
  }
  std::printf(
      "deepseek-v3 h800 x32: search (%lld scored), HALO memo on %.2f s CPU %.2f s wall, off %.2f s CPU %.2f s wall, "
      "CPU ratio %.3f; same top %zu and step times: %s\n",
      static_cast<long long>(r[1]->stats.scored), cpu_s[1], wall_s[1], cpu_s[0], wall_s[0], cpu_s[1] / cpu_s[0],
      r[1]->top.size(), same ? "yes" : "NO");
  return same ? 0 : 1;
}

int run_rescore_case(int threads) {
  auto model = piper::load_model("deepseek-v2-lite");
  auto cluster = piper::load_cluster("h800", 4);
  if (!model.ok() || !cluster.ok()) return 1;
  piper::TrainSpec train;
  train.global_batch = 256;
  train.seq_len = 4096;
  piper::planner::SearchOptions o;
  o.threads = threads;
  o.top_k = 3;
  o.simulate_top = 3;
  double cpu_s[2];
  piper::Result<piper::planner::SearchResult> r[2] = {piper::internal_error("not run"), piper::internal_error("not run")};
  for (int reuse = 0; reuse < 2; ++reuse) {
    o.reuse_compiles = reuse == 1;
    const std::clock_t c0 = std::clock();
    r[reuse] = piper::planner::search(*model, *cluster, train, o);
    cpu_s[reuse] = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    if (!r[reuse].ok()) {
      std::fprintf(stderr, "plan_bench: %s\n", r[reuse].status().message().c_str());
      return 1;
    }
  }
  bool agree = r[0]->top.size() == r[1]->top.size();
  for (size_t i = 0; agree && i < r[0]->top.size(); ++i) {
    agree = r[0]->top[i].strategy == r[1]->top[i].strategy &&
            r[0]->top[i].sim_step_time_s == r[1]->top[i].sim_step_time_s;
  }
  std::printf(
      "deepseek-v2-lite h800 x4: verify + re-score top 3, reuse_compiles on %.2f s CPU, off %.2f s CPU, ratio %.2f; "
      "same plans and simulated times: %s\n",
      cpu_s[1], cpu_s[0], cpu_s[1] / cpu_s[0], agree ? "yes" : "NO");
  return agree ? 0 : 1;
}

// The verdict cache (SearchOptions::verify_cache) against compiling every candidate, on the docs/planner.md case:
// DeepSeek-V3 on 256 H800 nodes, search + verification of the top 5 (no re-scoring), the same run. CPU seconds of the
// whole search() call (the closed-form search, about 2.6 s CPU, is in both), verification wall times, and whether
// the plans, verdicts and counts agree.
int run_verify_cache_case(int threads) {
  auto model = piper::load_model("deepseek-v3");
  auto cluster = piper::load_cluster("h800", 256);
  if (!model.ok() || !cluster.ok()) return 1;
  piper::TrainSpec train;
  train.global_batch = 15360;
  train.seq_len = 4096;
  piper::planner::SearchOptions o;
  o.threads = threads;
  double cpu_s[2];
  piper::Result<piper::planner::SearchResult> r[2] = {piper::internal_error("not run"),
                                                      piper::internal_error("not run")};
  for (int cache = 0; cache < 2; ++cache) {
    o.verify_cache = cache == 1;
    const std::clock_t c0 = std::clock();
    r[cache] = piper::planner::search(*model, *cluster, train, o);
    cpu_s[cache] = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    if (!r[cache].ok()) {
      std::fprintf(stderr, "plan_bench: %s\n", r[cache].status().message().c_str());
      return 1;
    }
  }
  const auto& a = r[0]->stats;
  const auto& b = r[1]->stats;
  bool same = r[0]->top.size() == r[1]->top.size() && a.verified == b.verified && a.verify_failed == b.verify_failed &&
              a.first_verify_failure == b.first_verify_failure;
  for (size_t i = 0; same && i < r[0]->top.size(); ++i) {
    same = r[0]->top[i].strategy == r[1]->top[i].strategy &&
           r[0]->top[i].verification.compiled_peak_bytes == r[1]->top[i].verification.compiled_peak_bytes;
  }
  std::printf(
      "deepseek-v3 h800 x256: search + verify top 5 (%lld verified, %lld rejected, %lld verdicts cached), verdict "
      "cache on %.2f s CPU (verify %.2f s wall), off %.2f s CPU (verify %.2f s wall), CPU ratio %.2f; same plans, "
      "verdicts and peaks: %s\n",
      static_cast<long long>(b.verified), static_cast<long long>(b.verify_failed),
      static_cast<long long>(b.verify_cached), cpu_s[1], b.verify_time_s, cpu_s[0], a.verify_time_s,
      cpu_s[1] / cpu_s[0], same ? "yes" : "NO");
  return same ? 0 : 1;
}

int run_compile_case() {
  auto model = piper::load_model("deepseek-v3");
  auto s = piper::Strategy::parse(
      "dp=128,tp=2,pp=8,ep=32,etp=2,zero=1,sp=1,recompute=selective,schedule=dualpipev,microbatches=32,a2a=halo");
  if (!model.ok() || !s.ok()) return 1;
  piper::TrainSpec train;
  train.global_batch = s->global_batch();
  train.seq_len = 4096;
  double cpu_s[2];
  piper::Result<piper::compile::CompileResult> r[2] = {piper::internal_error("not run"),
                                                      piper::internal_error("not run")};
  for (int defer = 0; defer < 2; ++defer) {
    piper::compile::CompileOptions o;
    o.defer_order_cycle_checks = defer == 1;
    const std::clock_t c0 = std::clock();
    r[defer] = piper::compile::compile_strategy(*model, train, *s, o);
    cpu_s[defer] = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    if (!r[defer].ok()) {
      std::fprintf(stderr, "plan_bench: %s\n", r[defer].status().message().c_str());
      return 1;
    }
  }
  const bool same = r[0]->plan == r[1]->plan;
  std::printf(
      "deepseek-v3 #1 plan at 32 microbatches (2,048 ranks): compile with one cycle check per run of orders %.2f s "
      "CPU, a check per order %.2f s CPU, ratio %.2f; same plan: %s\n",
      cpu_s[1], cpu_s[0], cpu_s[1] / cpu_s[0], same ? "yes" : "NO");
  return same ? 0 : 1;
}

// SimOptions::data_edges on the #1 plan's full compile for the simulator (DeepSeek-V3 / 2,048 GPUs, m = 120).
int run_data_edges_case() {
  auto model = piper::load_model("deepseek-v3");
  auto cluster = piper::load_cluster("h800", 256);
  auto s = piper::Strategy::parse(
      "dp=128,tp=2,pp=8,ep=32,etp=2,zero=1,sp=1,recompute=selective,schedule=dualpipev,microbatches=120,a2a=halo");
  if (!model.ok() || !cluster.ok() || !s.ok()) return 1;
  piper::TrainSpec train;
  train.global_batch = s->global_batch();
  train.seq_len = 4096;
  double cpu_s[2] = {0, 0};
  bool same = true;
  for (int pair = 0; pair < 3; ++pair) {
    piper::Result<piper::compile::CompileResult> r[2] = {piper::internal_error("not run"),
                                                         piper::internal_error("not run")};
    for (int edges = 0; edges < 2; ++edges) {
      piper::sim::SimOptions so;
      so.data_edges = edges == 1;
      const std::clock_t c0 = std::clock();
      r[edges] = piper::sim::compile_for_simulation(*model, *cluster, train, *s, {}, so, 0);
      cpu_s[edges] += static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
      if (!r[edges].ok()) return 1;
    }
    for (auto& prog : r[1]->plan.templates) {
      for (auto& st : prog.streams) {
        for (auto& in : st.instrs) {
          in.inputs.clear();
          in.outputs.clear();
        }
      }
    }
    same = same && r[0]->plan == r[1]->plan && r[0]->stats.peak_bytes == r[1]->stats.peak_bytes;
  }
  std::printf(
      "deepseek-v3 #1 plan, full compile for the simulator (120 microbatches, 2,048 ranks), 3 pairs: without data "
      "edges %.2f s CPU, with %.2f s CPU, ratio %.2f; same plan but for inputs/outputs: %s\n",
      cpu_s[0], cpu_s[1], cpu_s[0] / cpu_s[1], same ? "yes" : "NO");
  return same ? 0 : 1;
}

// One whole search with `piper plan`'s defaults (cli/local_plan.h: top 5 simulated, 8 local-search steps, a 15 s
// budget; this bench does not link the CLI) with the stopping rule on or off.
struct BoundRun {
  double wall_s = 0, cpu_s = 0;
  std::string best;
  double best_sim_s = 0;
};

piper::Result<BoundRun> run_plan_defaults(const piper::ModelSpec& model, const piper::ClusterSpec& cluster,
                                          const piper::TrainSpec& train, bool bound) {
  piper::planner::SearchOptions o;
  o.threads = 2;
  o.top_k = 5;
  o.simulate_top = 5;
  o.local_search_steps = 8;
  o.simulate_budget_s = 15;
  o.rescore_bound = bound;
  BoundRun b;
  const auto w0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  PIPER_ASSIGN_OR_RETURN(piper::planner::SearchResult r, piper::planner::search(model, cluster, train, o));
  b.cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  b.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  if (r.top.empty()) return piper::internal_error("no plan");
  b.best = r.top[0].strategy.to_string();
  b.best_sim_s = r.top[0].sim_step_time_s;
  return b;
}

int run_rescore_bound_case() {
  auto model = piper::load_model("deepseek-v3");
  auto cluster = piper::load_cluster("h800", 256);
  if (!model.ok() || !cluster.ok()) return 1;
  piper::TrainSpec train;
  train.global_batch = 15360;
  train.seq_len = 4096;
  bool same = true;
  std::vector<double> wall_ratio, cpu_ratio;
  for (int pair = 0; pair < 2; ++pair) {
    auto on = run_plan_defaults(*model, *cluster, train, true);
    auto off = run_plan_defaults(*model, *cluster, train, false);
    if (!on.ok() || !off.ok()) {
      std::fprintf(stderr, "plan_bench: %s\n", (on.ok() ? off.status() : on.status()).message().c_str());
      return 1;
    }
    const bool agree = on->best == off->best && on->best_sim_s == off->best_sim_s;
    same = same && agree;
    wall_ratio.push_back(on->wall_s / off->wall_s);
    cpu_ratio.push_back(on->cpu_s / off->cpu_s);
    std::printf(
        "deepseek-v3 h800 x256, plan defaults: stopping rule on %.2f s wall / %.2f s CPU, off %.2f s wall / %.2f s "
        "CPU, ratio %.2f wall / %.2f CPU; #1 %s simulated %.3f s (off: %.3f s): %s\n",
        on->wall_s, on->cpu_s, off->wall_s, off->cpu_s, wall_ratio.back(), cpu_ratio.back(), on->best.c_str(),
        on->best_sim_s, off->best_sim_s, agree ? "same" : "DIFFERENT");
  }
  std::printf("stopping rule: wall ratio %.2f-%.2f, CPU ratio %.2f-%.2f over 2 pairs; same #1: %s\n",
              *std::min_element(wall_ratio.begin(), wall_ratio.end()),
              *std::max_element(wall_ratio.begin(), wall_ratio.end()),
              *std::min_element(cpu_ratio.begin(), cpu_ratio.end()),
              *std::max_element(cpu_ratio.begin(), cpu_ratio.end()), same ? "yes" : "NO");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--compile-only") return run_compile_case();
  if (argc > 1 && std::string(argv[1]) == "--memo-only") return run_memo_case(2);
  if (argc > 1 && std::string(argv[1]) == "--verify-cache-only") return run_verify_cache_case(2);
  if (argc > 1 && std::string(argv[1]) == "--data-edges-only") return run_data_edges_case();
  if (argc > 1 && std::string(argv[1]) == "--rescore-bound-only") return run_rescore_bound_case();
  int rc = 0;
  rc |= run_case("deepseek-v3", "h800", 256, 15360, 4096, 2);
  rc |= run_case("mixtral-8x7b", "dgx-h100", 8, 512, 4096, 2);
  rc |= run_memo_case(2);
  rc |= run_rescore_case(2);
  rc |= run_compile_case();
  rc |= run_verify_cache_case(2);
  rc |= run_data_edges_case();
  rc |= run_rescore_bound_case();
  std::printf("goal: the DeepSeek-V3 plan (search + verification of the top 5) under 60 s on 2 cores\n");
  return rc;
}
