// piper estimate: the closed-form memory / time / MFU breakdown of one strategy (src/cost/estimate.h).
#include <cstdio>
#include <string>

#include "piper/base/json.h"
#include "piper/base/units.h"
#include "piper/cli/command.h"
#include "piper/cli/command_json.h"
#include "piper/cli/precision_flags.h"
#include "piper/cli/scenario.h"
#include "piper/cost/estimate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::cli {
namespace {

struct EstimateOptions {
  ScenarioOptions scenario;
  bool json = false;
};

void print_memory_row(const char* label, const cost::MemoryBreakdown& m) {
  std::printf("  %-10s params %10s  grads %10s  optimizer %10s  activations %10s  buffers %10s  total %10s\n", label,
              format_bytes(m.params).c_str(), format_bytes(m.grads).c_str(), format_bytes(m.optimizer).c_str(),
              format_bytes(m.activations).c_str(), format_bytes(m.buffers).c_str(), format_bytes(m.total()).c_str());
}

void print_text(const cost::CostModel& cm, const Strategy& s, const cost::Estimate& e) {
  const auto& c = cm.cluster();
  std::printf("model     %s (%d layers, seq %lld)\n", cm.model().name.c_str(), cm.model().num_layers,
              static_cast<long long>(cm.train().seq_len));
  std::printf("cluster   %s: %d nodes x %d = %d devices (%s, %s each)\n", c.name.c_str(), c.num_nodes,
              c.node.devices_per_node, c.world_size(), c.device.name.c_str(), format_bytes(e.device_memory_bytes).c_str());
  if (c.has_multi_node_domain()) {
    std::printf("domain    %d ranks per scale-up domain (%s), %d domains\n", c.devices_per_domain(),
                c.scale_up.name.c_str(), c.num_domains());
  }
  std::printf("precision %s\n", describe_precision(cm.train()).c_str());
  std::printf("strategy  %s\n", s.to_string().c_str());
  std::printf("batch     %lld sequences = %s tokens per step\n\n", static_cast<long long>(s.global_batch()),
              format_count(e.tokens_per_step).c_str());
  std::printf("memory per rank (pipeline rank %d has the most):\n", e.worst_rank);
  print_memory_row("worst", e.memory);
  // af-pipe's pipeline ranks: the attention ranks first, then the FFN ranks (cost/estimate_af.cc).
  auto label = [&](size_t r) {
    if (!s.disaggregate) return "pp " + std::to_string(r);
    const size_t a = static_cast<size_t>(s.pp);
    return r < a ? "attn " + std::to_string(r) : "ffn " + std::to_string(r - a);
  };
  const size_t shown = e.ranks.size() <= 8 ? e.ranks.size() : 4;
  for (size_t r = 0; r < shown; ++r) print_memory_row(label(r).c_str(), e.ranks[r]);
  if (shown < e.ranks.size()) {
    std::printf("  ...\n");
    for (size_t r = e.ranks.size() - 2; r < e.ranks.size(); ++r) print_memory_row(label(r).c_str(), e.ranks[r]);
  }
  std::printf("  fits: %s\n\n", e.fits ? "yes" : "NO (largest rank exceeds device memory)");
  std::printf("step time %s (bottleneck pipeline rank %d):\n", format_seconds(e.step_time_s).c_str(), e.bottleneck_rank);
  std::printf("  compute       %s\n", format_seconds(e.time.compute_s).c_str());
  // af-pipe: the ep share is the attention/FFN m2n exchange (and ZeRO-2/3's traffic on the same NIC).
  std::printf("  exposed comm  %s  (tp %s, %s %s, pp %s, dp %s)\n", format_seconds(e.time.exposed_comm_s).c_str(),
              format_seconds(e.comm.tp_s).c_str(), s.disaggregate ? "m2n" : "ep", format_seconds(e.comm.ep_s).c_str(),
              format_seconds(e.comm.pp_s).c_str(), format_seconds(e.comm.dp_s).c_str());
  std::printf("  bubble        %s\n", format_seconds(e.time.bubble_s).c_str());
  std::printf("  optimizer     %s\n", format_seconds(e.time.optimizer_s).c_str());
  std::printf("  per microbatch: F %s, B+W %s (W %s)\n\n", format_seconds(e.t_f_s).c_str(),
              format_seconds(e.t_b_s).c_str(), format_seconds(e.t_w_s).c_str());
  std::printf("MFU %.1f %%, %s tokens/s\n", 100 * e.mfu, format_count(e.tokens_per_s).c_str());
}

Status run_estimate(const EstimateOptions& o) {
  PIPER_ASSIGN_OR_RETURN(Scenario sc, load_scenario(o.scenario));
  const ModelSpec& model = sc.model;
  const ClusterSpec& cluster = sc.cluster;
  const Strategy& s = sc.strategy;
  const TrainSpec& train = sc.train;
  const cost::Calibration& calibration = sc.calibration;
  PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(model, cluster, train, calibration));
  PIPER_RETURN_IF_ERROR(check_estimable(sc));
  cost::Estimate e;
  PIPER_RETURN_IF_ERROR(cm.estimate(s, &e));
  if (o.json) {
    print_json(estimate_json(sc, e).dump(2));
  } else {
    print_text(cm, s, e);
    std::printf("calibration %s\nlinks       %s\n", sc.calibration_source.c_str(), sc.links_source.c_str());
    if (!sc.expert_loads.empty()) std::printf("%s\n", sc.expert_loads_line(false).c_str());
    if (sc.from_directives) std::printf("\ndirectives %s: %s\n", sc.input.file.c_str(), describe(sc.input).c_str());
  }
  return ok_status();
}

PIPER_REGISTER_COMMAND(g_estimate, "estimate", "Closed-form memory, time and MFU of one strategy", [](CLI::App* sub) {
  auto o = std::make_shared<EstimateOptions>();
  add_scenario_options(sub, &o->scenario);
  sub->add_flag("--json", o->json, "print one JSON object");
  return std::function<Status()>([o] {
    return run_estimate(*o);
  });
});

}  // namespace
}  // namespace piper::cli
