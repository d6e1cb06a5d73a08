// piper simulate: compile a strategy and execute the per-rank plan on the modelled cluster (src/sim/simulate.h).
#include <cstdio>
#include <string>

#include "piper/base/json.h"
#include "piper/base/units.h"
#include "piper/cli/command.h"
#include "piper/cli/scenario.h"
#include "piper/report/chrome_trace.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::cli {
namespace {

struct SimulateOptions {
  ScenarioOptions scenario;
  std::string trace;
  bool full = false;
  bool interleave = true;
  bool json = false;
};

void print_text(const ModelSpec& model, const ClusterSpec& c, const Strategy& s, const sim::SimReport& r) {
  std::printf("model     %s (%d layers)\n", model.name.c_str(), model.num_layers);
  std::printf("cluster   %s: %d nodes x %d = %d devices\n", c.name.c_str(), c.num_nodes, c.node.devices_per_node,
              c.world_size());
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
  sim::SimOptions options;
  options.full = o.full;
  options.interleave_overlap = o.interleave;
  options.record_timeline = !o.trace.empty();
  PIPER_ASSIGN_OR_RETURN(sim::SimReport r, sim::simulate(model, cluster, train, s, sc.calibration, options));
  if (!o.trace.empty()) {
    PIPER_RETURN_IF_ERROR(report::write_chrome_trace(o.trace, r.compiled.plan, r.sim));
  }
  if (o.json) {
    Json j = r.to_json();
    j["model"] = model.name;
    j["cluster"] = cluster.name;
    j["nodes"] = cluster.num_nodes;
    j["strategy"] = s.to_json();
    j["seq_len"] = train.seq_len;
    j["global_batch"] = train.global_batch > 0 ? train.global_batch : s.global_batch();
    if (!o.trace.empty()) j["trace"] = o.trace;
    print_json(j.dump(2));
  } else {
    print_text(model, cluster, s, r);
    if (!o.trace.empty()) std::printf("\ntrace written to %s (open in https://ui.perfetto.dev)\n", o.trace.c_str());
  }
  return ok_status();
}

PIPER_REGISTER_COMMAND(g_simulate, "simulate", "Execute a compiled strategy on the modelled cluster", [](CLI::App* sub) {
  auto o = std::make_shared<SimulateOptions>();
  add_scenario_options(sub, &o->scenario);
  sub->add_option("--trace", o->trace, "write a Chrome trace JSON of the step to this file");
  sub->add_flag("--full", o->full, "simulate every rank (default: one representative per pipeline rank)");
  sub->add_flag("--interleave-overlap,!--no-interleave-overlap", o->interleave,
                "may-overlap slots (dualpipev, af-pipe F&B pairs) alternate chunk by chunk (lower.h; default); "
                "--no-interleave-overlap runs each slot's F, then its B");
  sub->add_flag("--json", o->json, "print one JSON object");
  return std::function<Status()>([o] {
    return run_simulate(*o);
  });
});

}  // namespace
}  // namespace piper::cli
