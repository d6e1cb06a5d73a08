// The C++ side of bench/python/estimate_calls.py: N calls of what piper.estimate(model, cluster, strategy, seq=4096)
// runs in C++ (python/bindings.cc run_estimate: the scenario from the strategy text, the cost model, the estimate and
// its JSON object, as `piper estimate --json` builds them), over the same strategies, with the model and cluster
// loaded once as the Python loop does. Prints one JSON line: {"calls": N, "seconds": S}.
//
//   python_estimate_baseline CALLS STRATEGY...
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "piper/cli/command_json.h"
#include "piper/cli/scenario.h"
#include "piper/cost/estimate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace {

piper::Result<piper::Json> estimate_once(const piper::ModelSpec& model, const piper::ClusterSpec& cluster,
                                         const std::string& strategy) {
  piper::cli::ScenarioOptions o;
  o.strategy = strategy;
  o.seq_len = 4096;
  PIPER_ASSIGN_OR_RETURN(piper::cli::Scenario sc, piper::cli::make_scenario(model, cluster, o));
  PIPER_ASSIGN_OR_RETURN(piper::cost::CostModel cm,
                         piper::cost::CostModel::create(sc.model, sc.cluster, sc.train, sc.calibration));
  PIPER_RETURN_IF_ERROR(piper::cli::check_estimable(sc));
  piper::cost::Estimate e;
  PIPER_RETURN_IF_ERROR(cm.estimate(sc.strategy, &e));
  return piper::cli::estimate_json(sc, e);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: python_estimate_baseline CALLS STRATEGY...\n");
    return 2;
  }
  const long calls = std::strtol(argv[1], nullptr, 10);
  const std::vector<std::string> strategies(argv + 2, argv + argc);
  auto model = piper::load_model("mixtral-8x7b");
  auto cluster = piper::load_cluster("dgx-h100", 8);
  if (!model.ok() || !cluster.ok()) {
    std::fprintf(stderr, "presets: %s %s\n", model.status().message().c_str(), cluster.status().message().c_str());
    return 1;
  }
  double checksum = 0;  // keeps the results live
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) {
    auto j = estimate_once(*model, *cluster, strategies[static_cast<size_t>(i) % strategies.size()]);
    if (!j.ok()) {
      std::fprintf(stderr, "%s\n", j.status().message().c_str());
      return 1;
    }
    checksum += (*j)["step_time_s"].get<double>();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"calls\": %ld, \"seconds\": %.6f, \"checksum\": %.9g}\n", calls, seconds, checksum);
  return 0;
}
