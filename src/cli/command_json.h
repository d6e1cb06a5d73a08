// The JSON objects of `piper estimate|simulate|compile|plan --json`, built in one place so that the commands and the
// Python module (python/bindings.cc) return the same objects.
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/cli/compile_input.h"
#include "piper/cli/scenario.h"
#include "piper/compile/compile.h"
#include "piper/cost/estimate.h"
#include "piper/planner/search.h"
#include "piper/sim/simulate.h"

namespace piper::cli {

// The estimate with the scenario's model, cluster, nodes, strategy, directive file, seq_len and global batch.
Json estimate_json(const Scenario& sc, const cost::Estimate& e);

// The simulated step with the same scenario keys (+ "recognised" with directives, "trace" when one was written).
Json simulate_json(const Scenario& sc, const sim::SimReport& r, const std::string& trace);

// The compiled plan: world size, mesh, microbatches, counts, compile step times and the per-template summary.
Json compile_json(const CompileInputs& in, const compile::CompileResult& r);

// The search: the plans best first (with their scale-up domain fit), the search statistics, and when nothing fits
// the closest plan.
Json plan_json(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train, const planner::SearchResult& r);

}  // namespace piper::cli
