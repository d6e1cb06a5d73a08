#include "piper/cli/command_json.h"

#include "piper/compile/plan_summary.h"
#include "piper/planner/domain.h"

namespace piper::cli {
namespace {

// per_rank: the report priced each ep rank's experts from its own measured loads (a simulation of every rank).
void add_scenario(const Scenario& sc, Json* j, bool per_rank = false) {
  (*j)["model"] = sc.model.name;
  (*j)["cluster"] = sc.cluster.name;
  (*j)["nodes"] = sc.cluster.num_nodes;
  (*j)["strategy"] = sc.strategy.to_json();
  if (sc.from_directives) (*j)["directives"] = sc.input.file;
  if (!sc.expert_loads.empty()) (*j)["expert_loads"] = sc.expert_loads_json(per_rank);
  (*j)["calibration"] = sc.calibration_source;
  (*j)["links"] = sc.links_source;
}

}  // namespace

Json estimate_json(const Scenario& sc, const cost::Estimate& e) {
  Json j = e.to_json();
  add_scenario(sc, &j);
  j["seq_len"] = sc.train.seq_len;
  j["global_batch"] = sc.strategy.global_batch();
  return j;
}

Json simulate_json(const Scenario& sc, const sim::SimReport& r, const std::string& trace) {
  Json j = r.to_json();
  add_scenario(sc, &j, !r.sim.reduced);
  if (sc.from_directives) j["recognised"] = sc.input.resolved.recognised;
  j["seq_len"] = sc.train.seq_len;
  j["global_batch"] = sc.train.global_batch > 0 ? sc.train.global_batch : sc.strategy.global_batch();
  if (!trace.empty()) j["trace"] = trace;
  return j;
}

Json compile_json(const CompileInputs& in, const compile::CompileResult& r) {
  double total_s = 0;
  Json steps = Json::object();
  for (const auto& [step, s] : r.step_seconds) {
    steps[step] = s;
    total_s += s;
  }
  const ir::MeshInfo& m = r.plan.mesh;
  return Json{{"model", in.model.name},
              {"source", in.source},
              {"world_size", r.plan.world_size},
              {"mesh", Json{{"pp", m.pp}, {"vpp", m.vpp}, {"dp", m.dp}, {"ep", m.ep}, {"tp", m.tp}}},
              {"microbatches", r.graph.num_microbatches},
              {"directives", in.directives.size()},
              {"graph_nodes", r.graph.num_nodes()},
              {"instructions", r.stats.instructions},
              {"compile_seconds", total_s},
              {"step_seconds", steps},
              {"templates", compile::summary_to_json(compile::summarize_plan(r.plan, r.stats))}};
}

Json plan_json(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
               const planner::SearchResult& r) {
  Json plans = Json::array();
  for (const auto& p : r.top) {
    Json pj = p.to_json();
    pj["ep_inside_domain"] = planner::ep_inside_domain(p.strategy, cluster);
    pj["ep_fits_domain"] = planner::ep_fits_domain(p.strategy, cluster);
    plans.push_back(pj);
  }
  Json j = {{"model", model.name},
            {"cluster", cluster.name},
            {"nodes", cluster.num_nodes},
            {"world_size", cluster.world_size()},
            {"devices_per_domain", cluster.devices_per_domain()},
            {"precision", to_string(train.precision)},
            {"seq_len", train.seq_len},
            {"global_batch", train.global_batch},
            {"search", r.stats.to_json()},
            {"simulated", r.stats.simulated},
            {"plans", plans},
            {"fits_nowhere", r.top.empty()}};
  if (r.top.empty() && r.has_smallest) {
    j["min_memory_bytes"] = r.smallest.peak_memory_bytes();
    j["closest"] = r.smallest.to_json();
  }
  return j;
}

}  // namespace piper::cli
