// piper simulate: compile a strategy and execute the per-rank plan on the modelled cluster (src/sim/simulate.h).
// --expert-zipf S: expert loads skewed by a Zipf(S) popularity; the step is simulated under the contiguous
// placement and after the migration planner's moves (src/balance, docs/balance.md), with the migration's cost.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "piper/balance/migration_cost.h"
#include "piper/balance/planner.h"
#include "piper/base/json.h"
#include "piper/base/units.h"
#include "piper/cli/command.h"
#include "piper/cli/command_json.h"
#include "piper/cli/flags.h"
#include "piper/cli/scenario.h"
#include "piper/report/chrome_trace.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/counting.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::cli {
namespace {

struct SimulateOptions {
  ScenarioOptions scenario;
  std::string trace;
  bool full = false;
  bool reference_rates = false;
  bool interleave = true;
  bool json = false;
  double expert_zipf = 0;  // 0 = balanced experts (the calibration's expert_load_imbalance)
  int migrate_window = balance::kDefaultWindowSteps;
};

// The step with Zipf-skewed expert loads, without and with migration.
struct ExpertBalance {
  int num_experts = 0, ep = 0, moe_layers = 0, window = 0;
  double zipf = 0;
  double imbalance_before = 1, imbalance_after = 1;  // max / mean tokens per ep rank
  int moved_per_layer = 0;
  std::string reason;
  double step_balanced_s = 0, step_before_s = 0, step_after_s = 0;
  double migration_cost_s = 0;     // one migration of every MoE layer (they move one after the other)
  double overhead_per_step_s = 0;  // migration_cost_s / window
  Json to_json() const {
    return Json{{"zipf", zipf},
                {"num_experts", num_experts},
                {"ep", ep},
                {"moe_layers", moe_layers},
                {"window_steps", window},
                {"imbalance_contiguous", imbalance_before},
                {"imbalance_migrated", imbalance_after},
                {"experts_moved_per_layer", moved_per_layer},
                {"planner", reason},
                {"step_time_balanced_s", step_balanced_s},
                {"step_time_without_migration_s", step_before_s},
                {"step_time_with_migration_s", step_after_s + overhead_per_step_s},
                {"migration_cost_s", migration_cost_s},
                {"migration_overhead_per_step_s", overhead_per_step_s}};
  }
};

// Loads: every step, the ep group's routed tokens (global batch x seq x top_k, split over the dp / ep groups)
// spread over the experts by Zipf(s) popularity in index order, so the contiguous placement puts the hottest
// experts together on ep rank 0 (the worst case a static placement meets). The planner's cost model: an expert
// moves with its parameters, gradients, master copy and Adam moments (the run's dtypes) over the device link; a
// token on the busiest rank costs what the simulated step gains per token of imbalance removed. Every MoE layer
// gets the same loads and plan.
Result<ExpertBalance> expert_balance(const Scenario& sc, const sim::SimOptions& options, double zipf, int window) {
  const ModelSpec& m = sc.model;
  const Strategy& s = sc.strategy;
  if (!m.is_moe()) return invalid_argument("--expert-zipf: model '" + m.name + "' has no experts");
  if (s.ep < 2) return invalid_argument("--expert-zipf: strategy has ep=1; expert loads only matter across ep ranks");
  if (!(zipf > 0)) return invalid_argument("--expert-zipf must be > 0 (the Zipf exponent of expert popularity)");
  if (window < 1) return invalid_argument("--migrate-window must be >= 1 step");
  ExpertBalance b;
  b.zipf = zipf;
  b.num_experts = m.moe.num_experts;
  b.ep = s.ep;
  b.window = window;
  b.moe_layers = m.num_moe_layers();
  const int E = b.num_experts, per = E / s.ep;
  const int64_t global_batch = sc.train.global_batch > 0 ? sc.train.global_batch : s.global_batch();
  const double group_rows = static_cast<double>(global_batch) * static_cast<double>(sc.train.seq_len) * m.moe.top_k *
                            s.ep / std::max(1, s.dp);
  std::vector<double> w(static_cast<size_t>(E));
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += w[static_cast<size_t>(e)] = 1.0 / std::pow(e + 1.0, zipf);
  std::vector<int64_t> tokens(static_cast<size_t>(E));  // over the window
  for (int e = 0; e < E; ++e) {
    tokens[static_cast<size_t>(e)] = std::llround(group_rows * window * w[static_cast<size_t>(e)] / sum);
  }
  PIPER_ASSIGN_OR_RETURN(balance::ExpertPlacement start, balance::ExpertPlacement::contiguous(E, s.ep, per, s.ep));
  PIPER_ASSIGN_OR_RETURN(std::vector<int64_t> ranks, balance::rank_tokens(start, tokens));
  b.imbalance_before = balance::imbalance(ranks);
  auto step = [&](double imbalance) -> Result<double> {
    cost::Calibration c = sc.calibration;
    c.expert_load_imbalance = imbalance;
    PIPER_ASSIGN_OR_RETURN(sim::SimReport r, sim::simulate(m, sc.cluster, sc.train, s, c, options));
    return r.step_time_s;
  };
  PIPER_ASSIGN_OR_RETURN(b.step_balanced_s, step(1.0));
  PIPER_ASSIGN_OR_RETURN(b.step_before_s, step(b.imbalance_before));
  const double max_rows = static_cast<double>(*std::max_element(ranks.begin(), ranks.end())) / window;
  const double mean_rows = max_rows / b.imbalance_before;
  const double time_per_token_s = max_rows > mean_rows ? std::max(0.0, b.step_before_s - b.step_balanced_s) /
                                                             ((max_rows - mean_rows) * std::max(1, b.moe_layers))
                                                       : 0.0;
  const balance::MigrationCost cost = balance::migration_cost(m, sc.train, sc.cluster, s.etp, window, time_per_token_s);
  PIPER_ASSIGN_OR_RETURN(balance::MigrationPlan plan, balance::plan_migration(tokens, window, start, cost));
  b.imbalance_after = plan.imbalance_after;
  b.moved_per_layer = static_cast<int>(plan.moves.size());
  b.reason = plan.reason;
  PIPER_ASSIGN_OR_RETURN(b.step_after_s, step(b.imbalance_after));
  b.migration_cost_s = plan.cost_s * b.moe_layers;
  b.overhead_per_step_s = b.migration_cost_s / window;
  return b;
}

void print_balance(const ExpertBalance& b) {
  std::printf(
      "\nexperts   Zipf(%.2f) popularity over %d experts, ep=%d: max/mean tokens per ep rank %.3f contiguous, "
      "%.3f after migration (%d expert(s) moved per layer, planner: %s)\n",
      b.zipf, b.num_experts, b.ep, b.imbalance_before, b.imbalance_after, b.moved_per_layer, b.reason.c_str());
  const double with = b.step_after_s + b.overhead_per_step_s;
  std::printf(
      "step time balanced %s   contiguous %s   migrated %s + migration %s / step (%s for %d layer(s) "
      "every %d steps) = %s (%.2fx)\n",
      format_seconds(b.step_balanced_s).c_str(), format_seconds(b.step_before_s).c_str(),
      format_seconds(b.step_after_s).c_str(), format_seconds(b.overhead_per_step_s).c_str(),
      format_seconds(b.migration_cost_s).c_str(), b.moe_layers, b.window, format_seconds(with).c_str(),
      with > 0 ? b.step_before_s / with : 0.0);
}

void print_text(const ModelSpec& model, const ClusterSpec& c, const Strategy& s, const sim::SimReport& r) {
  std::printf("model     %s (%d layers)\n", model.name.c_str(), model.num_layers);
  std::printf("cluster   %s: %d nodes x %d = %d devices\n", c.name.c_str(), c.num_nodes, c.node.devices_per_node,
              c.world_size());
  if (c.has_multi_node_domain()) {
    std::printf("domain    %d ranks per scale-up domain, %d domains\n", c.devices_per_domain(), c.num_domains());
  }
  std::printf("strategy  %s\n", s.to_string().c_str());
  std::printf("plan      %d ranks, %zu simulated (%s), %lld instructions executed, %lld flows\n\n", r.world_size,
              r.sim.ranks.size(), r.sim.reduced ? "one per pipeline rank" : "all",
              static_cast<long long>(r.sim.instructions), static_cast<long long>(r.sim.flows));
  std::printf("step time %s   %s tokens/s   MFU %.1f %%\n", format_seconds(r.step_time_s).c_str(),
              format_count(r.tokens_per_s).c_str(), 100 * r.mfu);
  std::printf("bubble %.1f %%   exposed communication %.1f %%   peak memory %s of %s\n\n", 100 * r.bubble_fraction,
              100 * r.exposed_comm_fraction, format_bytes(static_cast<double>(r.peak_memory_max_bytes)).c_str(),
              format_bytes(r.device_memory_bytes).c_str());
  std::printf("  %6s %4s %12s %12s %12s %12s %12s\n", "rank", "pp", "busy", "exposed comm", "bubble", "comm total",
              "peak memory");
  for (const sim::RankStats& k : r.sim.ranks) {
    std::printf("  %6d %4d %12s %12s %12s %12s %12s\n", k.rank, k.pp_rank, format_seconds(k.busy_s).c_str(),
                format_seconds(k.exposed_comm_s).c_str(), format_seconds(k.bubble_s).c_str(),
                format_seconds(k.comm_s).c_str(), format_bytes(static_cast<double>(k.peak_bytes)).c_str());
  }
}

Status run_simulate(const SimulateOptions& o) {
  PIPER_ASSIGN_OR_RETURN(Scenario sc, load_scenario(o.scenario));
  const ModelSpec& model = sc.model;
  const ClusterSpec& cluster = sc.cluster;
  const Strategy& s = sc.strategy;
  const TrainSpec& train = sc.train;
  // An invalid strategy (order=foo) is named as such before the simulator says which valid ones it cannot run.
  PIPER_RETURN_IF_ERROR(s.validate());
  sim::SimOptions options;
  options.full = o.full;
  options.reference_rates = o.reference_rates;
  options.plan_hash = false;  // not printed
  options.interleave_overlap = o.interleave;
  options.record_timeline = !o.trace.empty();
  if (o.full) options.expert_loads = sc.expert_sim_loads();  // each rank from its own loads; else the busiest
  if (sc.from_directives && o.expert_zipf != 0) {
    return invalid_argument("--expert-zipf re-simulates a strategy under skewed loads; with --directives give "
                            "--strategy instead, or drop --expert-zipf");
  }
  if (!sc.expert_loads.empty() && o.expert_zipf != 0) {
    return invalid_argument("--expert-loads gives measured expert loads and --expert-zipf synthetic ones; give one");
  }
  PIPER_ASSIGN_OR_RETURN(sim::SimReport r, sc.from_directives
                                               ? sim::simulate_directives(model, cluster, train, sc.input.mesh,
                                                                          sc.input.directives, s, sc.calibration,
                                                                          options)
                                               : sim::simulate(model, cluster, train, s, sc.calibration, options));
  ExpertBalance balance;
  if (o.expert_zipf != 0) {
    sim::SimOptions quiet = options;
    quiet.record_timeline = false;
    PIPER_ASSIGN_OR_RETURN(balance, expert_balance(sc, quiet, o.expert_zipf, o.migrate_window));
  }
  if (!o.trace.empty()) {
    PIPER_RETURN_IF_ERROR(report::write_chrome_trace(o.trace, r.compiled.plan, r.sim));
  }
  if (o.json) {
    Json j = simulate_json(sc, r, o.trace);
    if (o.expert_zipf != 0) j["expert_balance"] = balance.to_json();
    print_json(j.dump(2));
  } else {
    print_text(model, cluster, s, r);
    if (sc.from_directives) std::printf("\ndirectives %s: %s\n", sc.input.file.c_str(), describe(sc.input).c_str());
    if (o.expert_zipf != 0) print_balance(balance);
    std::printf("calibration %s\nlinks       %s\n", sc.calibration_source.c_str(), sc.links_source.c_str());
    if (!sc.expert_loads.empty()) std::printf("%s\n", sc.expert_loads_line(o.full).c_str());
    if (!o.trace.empty()) std::printf("\ntrace written to %s (open in https://ui.perfetto.dev)\n", o.trace.c_str());
  }
  return ok_status();
}

PIPER_REGISTER_COMMAND(g_simulate, "simulate", "Execute a compiled strategy on the modelled cluster", [](CLI::App* sub) {
  auto o = std::make_shared<SimulateOptions>();
  add_scenario_options(sub, &o->scenario);
  sub->add_option("--trace", o->trace, "write a Chrome trace JSON of the step to this file");
  sub->add_flag("--full", o->full, "simulate every rank (default: one representative per pipeline rank)");
  sub->add_flag("--reference-rates", o->reference_rates,
                "recompute every flow's rate at each change (the reference; default: only the flows it can affect)");
  sub->add_flag("--interleave-overlap,!--no-interleave-overlap", o->interleave,
                "may-overlap slots (dualpipev, af-pipe F&B pairs) alternate chunk by chunk (lower.h; default); "
                "--no-interleave-overlap runs each slot's F, then its B");
  add_real_option(sub, "--expert-zipf", &o->expert_zipf, {0, 100, true, "the Zipf exponent of expert popularity"},
                  "also simulate expert loads skewed by Zipf(S) popularity, under the contiguous placement and after "
                  "the migration planner's moves, with the migration's cost (ep > 1; docs/balance.md)");
  add_int_option(sub, "--migrate-window", &o->migrate_window, {1, 1000000, "steps between migrations"},
                 "--expert-zipf: steps between migrations (the planner's window)")
      ->capture_default_str();
  sub->add_flag("--json", o->json, "print one JSON object");
  return std::function<Status()>([o] {
    return run_simulate(*o);
  });
});

}  // namespace
}  // namespace piper::cli
