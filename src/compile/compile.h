// The compile driver: a short list of named, timed steps — build -> passes -> lower -> verify.
//
// compile_strategy() turns a Strategy into directives (strategy_directives.h) and compiles them;
// compile_directives() compiles any directive list (a user's JSON file) the same way, so both paths give the
// same Plan for the same strategy. Errors carry the step and, for passes, the directive's label.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "piper/base/status.h"
#include "piper/compile/lower.h"
#include "piper/compile/plan.h"
#include "piper/compile/target.h"
#include "piper/compile/verify_plan.h"
#include "piper/ir/directive.h"
#include "piper/ir/graph.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::compile {

struct CompileOptions {
#ifdef NDEBUG
  bool verify_each_pass = false;
#else
  bool verify_each_pass = true;
#endif
  bool verbose = false;                          // log each step with its time
  int64_t capacity_bytes = 0;                    // device memory to check against; 0 = do not check
  CostFn cost;                                   // optional cost annotations
  bool interleave_overlap = true;                // LowerOptions::interleave_overlap
  bool recompute_reruns_tp_collectives = false;  // LowerOptions::recompute_reruns_tp_collectives
  Target target = megatron_target();             // compile_strategy: how the backend runs the strategy
  bool tp_overlap = false;                       // LowerOptions::tp_overlap (compile_strategy: or Strategy's)
  bool p2p_blocking = false;                     // LowerOptions::p2p_blocking
  bool p2p_scatter_gather = false;               // LowerOptions::p2p_scatter_gather
  bool dp_reduce_after_backward = false;         // LowerOptions::dp_reduce_after_backward
  bool data_edges = true;                        // LowerOptions::data_edges (false: for the verifier/simulator only)
  // ir::ApplyOptions::defer_order_cycle_checks (one cycle check per run of order directives; on failure the
  // passes run again with a check per directive, for its message). false: the former check after every order.
  bool defer_order_cycle_checks = true;
  // The routed experts' rows on a rank over the mean rank's (ir::build_graph): the experts' activation buffers
  // are sized for it. The simulator's compile passes Calibration::expert_load_imbalance, the busiest ep rank, as
  // its task prices do; 1 = balanced (every other compile, the runtime's included).
  double expert_load = 1.0;
  // The attention's backward materialises its s x s probabilities (part of its working set: ir::build_graph);
  // the simulator's compile passes Calibration::attention_score_bytes > 0.
  bool materialised_scores = false;
};

struct CompileResult {
  ir::Graph graph;
  Plan plan;
  PlanStats stats;
  std::vector<std::pair<std::string, double>> step_seconds;  // (step, wall seconds)
};

Result<CompileResult> compile_directives(const ModelSpec& model, const TrainSpec& train, const ir::MeshInfo& mesh,
                                         const std::vector<ir::Directive>& directives,
                                         const CompileOptions& options = {});

Result<CompileResult> compile_strategy(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                                       const CompileOptions& options = {});

}  // namespace piper::compile
