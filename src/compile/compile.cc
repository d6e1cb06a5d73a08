#include "piper/compile/compile.h"

#include <chrono>

#include "piper/base/log.h"
#include "piper/compile/strategy_directives.h"
#include "piper/ir/build_graph.h"
#include "piper/ir/passes/passes.h"

namespace piper::compile {
namespace {

class StepTimer {
 public:
  StepTimer(CompileResult& r, bool verbose) : r_(r), verbose_(verbose) {}
  void done(const std::string& step) {
    auto now = std::chrono::steady_clock::now();
    double s = std::chrono::duration<double>(now - last_).count();
    r_.step_seconds.emplace_back(step, s);
    if (verbose_) {
      PIPER_LOG(INFO) << "compile: " << step << " " << s * 1e3 << " ms";
    }
    last_ = now;
  }

 private:
  CompileResult& r_;
  bool verbose_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

Result<CompileResult> compile_directives(const ModelSpec& model, const TrainSpec& train, const ir::MeshInfo& mesh,
                                         const std::vector<ir::Directive>& directives, const CompileOptions& options) {
  CompileResult r;
  StepTimer timer(r, options.verbose);
  auto graph = ir::build_graph(model, train, mesh, options.expert_load, options.materialised_scores);
  if (!graph.ok()) return graph.status().with_context("compile: build");
  r.graph = std::move(graph).value();
  timer.done("build");
  ir::ApplyOptions apply;
  apply.verify_each = options.verify_each_pass;
  apply.defer_order_cycle_checks = options.defer_order_cycle_checks;
  Status s = ir::apply_directives(r.graph, directives, apply);
  if (!s.ok() && options.defer_order_cycle_checks) {  // the message of the directive that failed: the passes again, each order checked on its own
    auto again = ir::build_graph(model, train, mesh, options.expert_load, options.materialised_scores);
    if (!again.ok()) return again.status().with_context("compile: build");
    r.graph = std::move(again).value();
    apply.defer_order_cycle_checks = false;
    s = ir::apply_directives(r.graph, directives, apply);
  }
  if (s.ok()) s = check_directives_fill_mesh(r.graph);
  if (!s.ok()) return s.with_context("compile: passes");
  timer.done("passes");
  LowerOptions lower_options;
  lower_options.cost = options.cost;
  lower_options.interleave_overlap = options.interleave_overlap;
  lower_options.recompute_reruns_tp_collectives = options.recompute_reruns_tp_collectives;
  lower_options.p2p_blocking = options.p2p_blocking;
  lower_options.p2p_scatter_gather = options.p2p_scatter_gather;
  lower_options.dp_reduce_after_backward = options.dp_reduce_after_backward;
  lower_options.tp_overlap = options.tp_overlap;
  lower_options.data_edges = options.data_edges;
  auto plan = lower(r.graph, lower_options);
  if (!plan.ok()) return plan.status().with_context("compile: lower");
  r.plan = std::move(plan).value();
  timer.done("lower");
  auto stats = verify_plan(r.plan, options.capacity_bytes);
  if (!stats.ok()) return stats.status().with_context("compile: verify");
  r.stats = std::move(stats).value();
  timer.done("verify");
  return r;
}

Result<CompileResult> compile_strategy(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                                       const CompileOptions& options) {
  PIPER_ASSIGN_OR_RETURN(ir::MeshInfo mesh, strategy_mesh(strategy, model));
  DirectiveOptions dopts;
  dopts.vocab_parallel = options.target.vocab_parallel;
  dopts.overlap_param_gather = options.target.overlap_param_gather;
  PIPER_ASSIGN_OR_RETURN(auto directives, strategy_directives(strategy, model, dopts));
  CompileOptions opts = options;
  opts.tp_overlap = options.tp_overlap || strategy.tp_overlap;
  return compile_directives(model, train, mesh, directives, opts);
}

}  // namespace piper::compile
