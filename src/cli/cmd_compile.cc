// piper compile: strategy (or directive file) -> verified per-rank Plan; prints per-template statistics.
#include <cstdio>

#include "piper/base/files.h"
#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/base/units.h"
#include "piper/cli/command.h"
#include "piper/cli/command_json.h"
#include "piper/cli/compile_input.h"
#include "piper/cli/flags.h"
#include "piper/cli/precision_flags.h"
#include "piper/compile/compile.h"
#include "piper/compile/plan_io.h"
#include "piper/compile/plan_summary.h"
#include "piper/compile/strategy_directives.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::cli {
namespace {

Status run(const CompileCliOptions& o) {
  PIPER_ASSIGN_OR_RETURN(CompileInputs in, resolve_compile_inputs(o));
  compile::CompileOptions options;
  options.verbose = o.verbose;
  options.tp_overlap = in.tp_overlap;  // as compile_strategy: the plan the simulator and `piper train` run
  options.capacity_bytes = static_cast<int64_t>(o.capacity_gib * static_cast<double>(1LL << 30));
  PIPER_ASSIGN_OR_RETURN(compile::CompileResult r,
                         compile::compile_directives(in.model, in.train, in.mesh, in.directives, options));
  // Written only once the directives compiled and verified: a failed compile leaves no file behind.
  if (!o.emit_directives.empty()) {
    PIPER_RETURN_IF_ERROR(write_text_file(o.emit_directives, ir::directives_to_json(in.directives).dump(1) + "\n"));
  }
  if (!o.emit_plan.empty()) PIPER_RETURN_IF_ERROR(compile::write_plan_file(o.emit_plan, r.plan));
  const auto summary = compile::summarize_plan(r.plan, r.stats);
  double total_s = 0;
  for (const auto& [step, s] : r.step_seconds) total_s += s;
  const ir::MeshInfo& m = r.plan.mesh;
  if (o.json) {
    print_json(compile_json(in, r).dump());
    return ok_status();
  }
  std::printf("compiled %s with %s: %d ranks (pp=%d vpp=%d dp=%d ep=%d tp=%d), %d microbatches\n",
              in.model.name.c_str(), in.source.c_str(), r.plan.world_size, m.pp, m.vpp, m.dp, m.ep, m.tp,
              r.graph.num_microbatches);
  std::printf("%zu directives, %zu graph nodes, %zu program templates, %zu instructions; verified deadlock-free\n",
              in.directives.size(), r.graph.num_nodes(), r.plan.templates.size(), r.stats.instructions);
  std::string steps;
  for (const auto& [step, s] : r.step_seconds) steps += " " + step + " " + format_seconds(s);
  std::printf("compile time %s:%s\n\n", format_seconds(total_s).c_str(), steps.c_str());
  std::printf("%s", compile::format_summary(summary).c_str());
  std::printf(
      "\npeak mem: live bytes at the peak of the verifier's abstract execution (model state + activations "
      "+ gathered parameters)\n");
  if (!o.emit_directives.empty()) std::printf("wrote %s\n", o.emit_directives.c_str());
  if (!o.emit_plan.empty()) std::printf("wrote %s\n", o.emit_plan.c_str());
  return ok_status();
}

PIPER_REGISTER_COMMAND(
    g_compile, "compile", "Compile a strategy into verified per-rank programs; print their stats", [](CLI::App* sub) {
      auto o = std::make_shared<CompileCliOptions>();
      sub->add_option("--model", o->model, "model preset or config file")->required();
      sub->add_option("--strategy", o->strategy, "compact strategy (dp=8,pp=4,...) or JSON file");
      sub->add_option("--directives", o->directives_file, "a JSON directive file instead");
      sub->add_option("--mesh", o->mesh, "mesh for --directives: pp=P[,vpp=V,dp=D,ep=E,tp=T]");
      add_int_option(sub, "--global-batch", &o->global_batch, {1, kMaxGlobalBatch, "sequences per step"},
                     "sequences per step (default: dp*microbatches*mbs)");
      add_int_option(sub, "--seq", &o->seq_len, {1, kMaxSeqLen, "tokens per sequence"},
                     "sequence length (default: min(4096, the model's max_seq_len))");
      add_int_option(sub, "--microbatches", &o->microbatches,
                     {1, kMaxMicrobatches, "microbatches per step; the graph holds every layer per microbatch"},
                     "override the strategy's microbatches");
      add_real_option(sub, "--capacity-gib", &o->capacity_gib, {0, kMaxCapacityGib, true, "GiB of device memory"},
                      "check every rank's peak against this device memory (GiB)");
      sub->add_option("--emit-directives", o->emit_directives,
                      "write the directives that were compiled to this JSON file");
      sub->add_option("--emit-plan", o->emit_plan,
                      "write the compiled plan (every rank's program) to this JSON file (docs/ir.md, Plan files)");
      sub->add_option("--target", o->target, "megatron (default) or cpu-runtime: the backend a strategy is lowered for");
      sub->add_flag("--verbose", o->verbose, "log each compile step with its time");
      add_precision_options(sub, &o->precision);
      sub->add_flag("--json", o->json, "print one JSON object");
      return std::function<Status()>([o] { return run(*o); });
    });

}  // namespace
}  // namespace piper::cli
