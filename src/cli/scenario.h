// The scenario options shared by `piper estimate` and `piper simulate`: model, cluster, node count, strategy,
// batch, sequence length and device calibration, registered and loaded in one place so both commands accept
// and check them the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/balance/expert_loads.h"
#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/cli/command.h"
#include "piper/cli/directive_input.h"
#include "piper/cli/precision_flags.h"
#include "piper/cost/device_model.h"
#include "piper/sim/expert_rank_loads.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::cli {

struct ScenarioOptions {
  std::string model;
  std::string cluster;
  int nodes = 1;
  std::string strategy;
  int64_t global_batch = 0;  // 0: not given (dp * microbatches * mbs)
  int64_t seq_len = 0;       // 0: not given (min(4096, the model's max_seq_len))
  std::string calibration;
  std::string comm_calibration;  // `piper bench comm --calibration-out F`: measured link latency and bandwidth
  std::string directives;        // instead of --strategy: a directive file (with mesh)
  std::string mesh;
  PrecisionOptions precision;    // --precision and the per-state dtypes
  int domain_nodes = 0;          // --domain-nodes; 0: not given (the whole scale-up domain)
  std::string expert_loads;      // --expert-loads FILE (balance/expert_loads.h): measured expert loads
  // Instead of a --directives file: a directive list already parsed (the Python module's builder), named
  // `directives_label` in messages; needs `mesh` as a file does.
  bool has_directive_list = false;
  std::vector<ir::Directive> directive_list;
  std::string directives_label;
};

struct Scenario {
  ModelSpec model;
  ClusterSpec cluster;
  Strategy strategy;
  TrainSpec train;
  cost::Calibration calibration;
  std::string calibration_source;  // which file (calibration_file.h) or "preset figures ...", for the reports
  std::string links_source;        // the link calibration used (apply_link_calibration), for the reports' `links`
  // With --directives: the file, its mesh and what it was resolved to; `strategy` is resolved.strategy.
  bool from_directives = false;
  DirectiveInput input;
  // With --expert-loads: the file (its busiest ep rank's loads are calibration.expert_load_imbalance and
  // expert_memory_load, what the closed form and a representative simulation price every rank as), and each ep
  // rank's load per layer (what a simulation of every rank prices each rank from: expert_sim_loads()).
  std::string expert_loads;
  balance::RankLoads rank_loads;

  // "experts   FILE: ..." for the text reports, or "" without the flag; per_rank: the report is of a simulation
  // that priced each rank from its own loads (else every rank as the busiest). The JSON object (null without).
  std::string expert_loads_line(bool per_rank) const;
  Json expert_loads_json(bool per_rank) const;
  // SimOptions::expert_loads for a simulation of every rank of a plan compiled for this scenario (off without
  // --expert-loads).
  sim::ExpertRankLoads expert_sim_loads() const;
};

// Measured expert loads (`--expert-loads FILE`) checked against `model` (its name, experts and MoE layers) and
// priced for `ep` contiguous expert ranks: the busiest rank's imbalance (cost::Calibration::expert_load_imbalance)
// and every rank's load per layer (SimOptions::expert_loads). Errors name the file and the fix.
struct MeasuredLoads {
  std::string file;
  double imbalance = 1.0;    // time: balance::contiguous_imbalance
  double memory_load = 1.0;  // memory: balance::contiguous_memory_load (cost::Calibration::expert_memory_load)
  balance::RankLoads ranks;
};
Result<MeasuredLoads> measured_loads(const balance::ExpertLoads& loads, const std::string& file, const ModelSpec& model,
                                     int ep);

// --model, --cluster, --nodes, --strategy or --directives with --mesh, --global-batch, --seq, --calibration,
// --comm-calibration, --domain-nodes, --expert-loads, --precision and the dtype flags (precision_flags.h).
void add_scenario_options(CLI::App* sub, ScenarioOptions* o);

// Loads the model, cluster (with the comm calibration applied), strategy and calibration; --seq is checked against
// the model's max_seq_len as `piper train` checks it (the flags' own ranges are checked as they are parsed).
Result<Scenario> load_scenario(const ScenarioOptions& o);

// `piper estimate`'s refusal of a directive file that is not the directives of any strategy (the closed form prices
// only the built-in schedules; such a file is priced by `piper simulate`); ok otherwise.
Status check_estimable(const Scenario& sc);

// The same from a model and cluster already loaded (the Python module's Model and Cluster objects): o.model,
// o.cluster and o.nodes are not read. load_scenario() loads those two and calls it.
Result<Scenario> make_scenario(ModelSpec model, ClusterSpec cluster, const ScenarioOptions& o);

}  // namespace piper::cli
