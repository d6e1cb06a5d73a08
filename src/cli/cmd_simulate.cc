// piper simulate: compile a strategy and execute the per-rank plan on the modelled cluster (src/sim/simulate.h).
#include <cstdio>
#include <string>

#include "piper/base/json.h"
#include "piper/base/units.h"
#include "piper/cli/command.h"
#include "piper/report/chrome_trace.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::cli {
namespace {

struct SimulateOptions {
  std::string model;
  std::string cluster;
  int nodes = 1;
  std::string strategy;
  int64_t global_batch = 0;
  int64_t seq_len = 4096;
  std::string calibration;
  std::string trace;
  bool full = false;
  bool interleave = false;
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
  PIPER_ASSIGN_OR_RETURN(ModelSpec model, load_model(o.model));
  PIPER_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster(o.cluster, o.nodes));
  PIPER_ASSIGN_OR_RETURN(Strategy s, Strategy::parse(o.strategy));
  TrainSpec train;
  train.global_batch = o.global_batch;
  train.micro_batch_size = s.mbs;
  train.seq_len = o.seq_len;
  cost::Calibration calibration;
  if (!o.calibration.empty()) {
    PIPER_ASSIGN_OR_RETURN(calibration, cost::Calibration::load(o.calibration));
  }
  sim::SimOptions options;
  options.full = o.full;
  options.interleave_overlap = o.interleave;
  options.record_timeline = !o.trace.empty();
  PIPER_ASSIGN_OR_RETURN(sim::SimReport r, sim::simulate(model, cluster, train, s, calibration, options));
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
    j["global_batch"] = o.global_batch > 0 ? o.global_batch : s.global_batch();
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
  sub->add_option("--model", o->model, "model preset or config file")->required();
  sub->add_option("--cluster", o->cluster, "cluster preset or file")->required();
  sub->add_option("--nodes", o->nodes, "number of nodes")->required();
  sub->add_option("--strategy", o->strategy, "compact strategy (dp=8,pp=4,...) or a JSON file")->required();
  sub->add_option("--global-batch", o->global_batch, "sequences per step (default: dp*microbatches*mbs)");
  sub->add_option("--seq", o->seq_len, "sequence length")->capture_default_str();
  sub->add_option("--calibration", o->calibration, "calibration JSON (src/cost/device_model.h)");
  sub->add_option("--trace", o->trace, "write a Chrome trace JSON of the step to this file");
  sub->add_flag("--full", o->full, "simulate every rank (default: one representative per pipeline rank)");
  sub->add_flag("--interleave-overlap", o->interleave,
                 "compile may-overlap slots (dualpipev, af-pipe F&B pairs) chunk by chunk (lower.h)");
  sub->add_flag("--json", o->json, "print one JSON object");
  return std::function<Status()>([o] {
    if (o->seq_len < 1) return invalid_argument("--seq=" + std::to_string(o->seq_len) + " must be >= 1");
    if (o->global_batch < 0) return invalid_argument("--global-batch must be >= 1");
    return run_simulate(*o);
  });
});

}  // namespace
}  // namespace piper::cli
