#include "piper/cli/scenario.h"

#include <cstdio>

#include "piper/balance/expert_loads.h"
#include "piper/base/files.h"
#include "piper/cli/calibration_file.h"
#include "piper/cli/flags.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/comm_calibration.h"
#include "piper/spec/model_loader.h"

namespace piper::cli {

void add_scenario_options(CLI::App* sub, ScenarioOptions* o) {
  sub->add_option("--model", o->model, "model preset or config file")->required();
  sub->add_option("--cluster", o->cluster, "cluster preset or file")->required();
  add_int_option(sub, "--nodes", &o->nodes, {1, kMaxNodes, "nodes of the cluster"}, "number of nodes")->required();
  sub->add_option("--strategy", o->strategy, "compact strategy (dp=8,pp=4,...) or a JSON file");
  sub->add_option("--directives", o->directives, "a directive file instead of --strategy (docs/directives.md)");
  sub->add_option("--mesh", o->mesh, "with --directives: pp=P[,vpp=V,dp=D,ep=E,tp=T]");
  add_int_option(sub, "--global-batch", &o->global_batch, {1, kMaxGlobalBatch, "sequences per step"},
                 "sequences per step (default: dp*microbatches*mbs)");
  add_int_option(sub, "--seq", &o->seq_len, {1, kMaxSeqLen, "tokens per sequence"},
                 "sequence length (default: min(4096, the model's max_seq_len))");
  sub->add_option("--calibration", o->calibration, "calibration JSON (src/cost/device_model.h)");
  sub->add_option("--comm-calibration", o->comm_calibration,
                  "measured link latency/bandwidth JSON from `piper calibrate --ranks R --links-out F` or `piper "
                  "bench comm --calibration-out F` (default on local-cpu: this machine's link calibration)");
  add_domain_option(sub, &o->domain_nodes);
  sub->add_option("--expert-loads", o->expert_loads,
                  "measured expert loads from `piper train --record-expert-loads`: price the busiest expert-parallel "
                  "rank from them (default: balanced experts, or the calibration's expert_load_imbalance)");
  add_precision_options(sub, &o->precision);
}

Result<MeasuredLoads> measured_loads(const balance::ExpertLoads& loads, const std::string& file, const ModelSpec& model,
                                     int ep) {
  if (loads.model != model.name || loads.num_experts != model.moe.num_experts) {
    return invalid_argument("--expert-loads " + elide(file) + ": recorded on model '" + elide(loads.model) + "' (" +
                            std::to_string(loads.num_experts) + " experts), not '" + model.name + "' (" +
                            std::to_string(model.moe.num_experts) + " experts); record it with `piper train --model " +
                            model.name + " --record-expert-loads FILE`");
  }
  for (const balance::LayerLoads& l : loads.layers) {
    if (l.layer >= model.num_layers || !model.is_moe_layer(l.layer)) {
      return invalid_argument("--expert-loads " + elide(file) + ": layer " + std::to_string(l.layer) +
                              " is not a MoE layer of model '" + model.name + "'; record the loads with this model");
    }
  }
  MeasuredLoads m;
  m.file = file;
  auto ranks = balance::contiguous_rank_loads(loads, ep);  // once: the two figures below read it
  if (!ranks.ok()) return ranks.status().with_context("--expert-loads " + elide(file));
  m.imbalance = balance::contiguous_imbalance(loads, *ranks);
  m.memory_load = balance::contiguous_memory_load(loads, *ranks);
  m.ranks = *std::move(ranks);
  return m;
}

namespace {

// --expert-loads: the measured loads of this model's experts, placed as the strategy's ep places them, replace the
// calibration's expert_load_imbalance (which a --calibration file may also set: the flag wins, and says so).
Status apply_expert_loads(const std::string& path, Scenario* sc) {
  PIPER_ASSIGN_OR_RETURN(balance::ExpertLoads loads, balance::load_expert_loads(path));
  PIPER_ASSIGN_OR_RETURN(MeasuredLoads m, measured_loads(loads, path, sc->model, sc->strategy.ep));
  sc->expert_loads = path;
  sc->calibration.expert_load_imbalance = m.imbalance;
  sc->calibration.expert_memory_load = m.memory_load;
  sc->rank_loads = std::move(m.ranks);
  return ok_status();
}

}  // namespace

Result<Scenario> load_scenario(const ScenarioOptions& o) {
  PIPER_ASSIGN_OR_RETURN(ModelSpec model, load_model(o.model));
  // --seq is checked before the cluster is loaded, as it always was (the first bad flag is the one named).
  PIPER_RETURN_IF_ERROR(resolve_seq_len(model, o.seq_len).status());
  PIPER_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster(o.cluster, o.nodes));
  return make_scenario(std::move(model), std::move(cluster), o);
}

Result<Scenario> make_scenario(ModelSpec model, ClusterSpec cluster, const ScenarioOptions& o) {
  Scenario sc;
  sc.model = std::move(model);
  sc.cluster = std::move(cluster);
  PIPER_ASSIGN_OR_RETURN(const int64_t seq_len, resolve_seq_len(sc.model, o.seq_len));
  PIPER_RETURN_IF_ERROR(apply_domain_nodes(o.domain_nodes, &sc.cluster));
  PIPER_ASSIGN_OR_RETURN(sc.links_source, apply_link_calibration(o.comm_calibration, &sc.cluster));
  const bool with_directives = !o.directives.empty() || o.has_directive_list;
  if (!o.mesh.empty() && !with_directives) {
    return invalid_argument("--mesh is for --directives; a strategy carries its mesh: drop --mesh");
  }
  if (o.has_directive_list) {
    sc.from_directives = true;
    PIPER_ASSIGN_OR_RETURN(sc.input, resolve_directive_input(sc.model, o.directive_list, o.directives_label, o.mesh,
                                                             o.global_batch, sc.cluster.world_size()));
    sc.strategy = sc.input.resolved.strategy;
  } else if (o.strategy.empty() || with_directives) {
    sc.from_directives = true;
    PIPER_ASSIGN_OR_RETURN(sc.input, load_directive_input(sc.model, o.strategy, o.directives, o.mesh,
                                                          o.global_batch, sc.cluster.world_size()));
    sc.strategy = sc.input.resolved.strategy;
  } else {
    PIPER_ASSIGN_OR_RETURN(sc.strategy, Strategy::parse(o.strategy));
  }
  sc.train.global_batch = o.global_batch;
  sc.train.micro_batch_size = sc.strategy.mbs;
  sc.train.seq_len = seq_len;
  PIPER_RETURN_IF_ERROR(apply_precision_options(o.precision, &sc.train));
  PIPER_ASSIGN_OR_RETURN(DeviceCalibration device, load_device_calibration(o.calibration, sc.cluster.name));
  sc.calibration = device.calibration;
  sc.calibration_source = with_task_profile(device.source, sc.calibration, sc.model, seq_len);
  if (!o.expert_loads.empty()) PIPER_RETURN_IF_ERROR(apply_expert_loads(o.expert_loads, &sc));
  return sc;
}

std::string Scenario::expert_loads_line(bool per_rank) const {
  if (expert_loads.empty()) return "";
  const bool per_step = per_rank && !rank_loads.step_factor.empty();
  char buf[400];
  std::snprintf(buf, sizeof(buf),
                per_step ? ": each ep rank's experts priced from its own measured share (time: its share in each "
                           "recorded step, the steps simulated one by one and averaged; memory: its busiest step); "
                           "busiest %.3f x the mean at ep=%d, %.3f at its peak"
                : per_rank
                    ? ": each ep rank's experts priced from its own measured share (time: its mean, memory: its "
                      "busiest step); busiest %.3f x the mean at ep=%d, %.3f at its peak"
                    : ": busiest ep rank %.3f x the mean at ep=%d (measured), %.3f at its peak; every rank's experts "
                      "priced as the busiest's (time and memory)",
                calibration.expert_load_imbalance, strategy.ep, calibration.memory_load());
  return "experts   " + expert_loads + buf;
}

Json Scenario::expert_loads_json(bool per_rank) const {
  if (expert_loads.empty()) return Json();
  Json layers = Json::array();
  for (size_t i = 0; i < rank_loads.layers.size(); ++i) {
    layers.push_back({{"layer", rank_loads.layers[i]},
                      {"rank_load", rank_loads.factor[i]},
                      {"rank_peak_load", rank_loads.peak[i]}});
  }
  return Json{{"file", expert_loads},
              {"imbalance", calibration.expert_load_imbalance},
              {"memory_load", calibration.memory_load()},
              {"ep", strategy.ep},
              {"priced", !per_rank                        ? "busiest"
                         : rank_loads.step_factor.empty() ? "per_rank"
                                                          : "per_rank_per_step"},
              {"layers", layers}};
}

sim::ExpertRankLoads Scenario::expert_sim_loads() const {
  sim::ExpertRankLoads l;
  if (expert_loads.empty()) return l;
  l.loads = rank_loads;
  l.plan_load = calibration.memory_load();  // simulate() sizes the plan's experts buffers for the busiest
  return l;
}

Status check_estimable(const Scenario& sc) {
  if (!sc.from_directives || sc.input.resolved.recognised) return ok_status();
  return unimplemented("estimate: the closed form prices the built-in schedules of a strategy, and " + sc.input.file +
                       " is not the directives of any strategy (its order, placement or overlap is its own); price "
                       "it with `piper simulate --directives " + sc.input.file + "`");
}

}  // namespace piper::cli
