// piper compile: strategy (or directive file) -> verified per-rank Plan; prints per-template statistics.
#include <cstdio>

#include "piper/base/files.h"
#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/base/units.h"
#include "piper/cli/command.h"
#include "piper/cli/directive_input.h"
#include "piper/cli/flags.h"
#include "piper/cli/precision_flags.h"
#include "piper/compile/compile.h"
#include "piper/compile/plan_summary.h"
#include "piper/compile/strategy_directives.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::cli {
namespace {

struct CompileCliOptions {
  std::string model;
  std::string strategy;
  std::string directives_file;
  std::string mesh;  // with --directives: "pp=2,dp=4,ep=2" (vpp, tp default 1)
  int64_t global_batch = 0;  // 0: not given
  int64_t seq_len = 0;       // 0: not given (min(4096, the model's max_seq_len))
  int microbatches = 0;      // 0: not given (the strategy's)
  double capacity_gib = 0;   // 0: not given (no memory check)
  std::string emit_directives;
  std::string target = "megatron";  // which backend a strategy's directives are for
  bool verbose = false;
  bool json = false;
  PrecisionOptions precision;  // the stash, wire and dispatch bytes of the compiled plan
};

// Resolves the model, training setup, mesh and directives from the options.
struct Inputs {
  ModelSpec model;
  TrainSpec train;
  ir::MeshInfo mesh;
  std::vector<ir::Directive> directives;
  std::string source;  // the strategy text or the file name
};

Result<Inputs> resolve(const CompileCliOptions& o) {
  if (o.target != "megatron" && o.target != "cpu-runtime") {
    return invalid_argument("--target " + o.target + " is not one of {megatron, cpu-runtime}; cpu-runtime writes the "
                            "directives `piper train` runs (whole embedding and head, ZeRO gathers after the update)");
  }
  if (o.target != "megatron" && !o.directives_file.empty()) {
    return invalid_argument("--target " + o.target + " chooses how a --strategy is lowered; a --directives file is "
                            "compiled as written: drop --target");
  }
  if (o.strategy.empty() == o.directives_file.empty()) {
    return invalid_argument("give exactly one of --strategy S (dp=8,pp=4,ep=8,schedule=1f1b,...) or --directives FILE");
  }
  Inputs in;
  PIPER_ASSIGN_OR_RETURN(in.model, load_model(o.model));
  PIPER_ASSIGN_OR_RETURN(in.train.seq_len, resolve_seq_len(in.model, o.seq_len));
  PIPER_RETURN_IF_ERROR(apply_precision_options(o.precision, &in.train));
  if (!o.directives_file.empty()) {
    if (o.mesh.empty()) return invalid_argument("--directives needs --mesh pp=P[,vpp=V,dp=D,ep=E,tp=T]");
    if (o.microbatches > 0) {
      return invalid_argument(
          "--microbatches comes from the directive file's split directive with --directives; "
          "drop --microbatches");
    }
    PIPER_ASSIGN_OR_RETURN(in.mesh, parse_mesh(o.mesh));
    PIPER_ASSIGN_OR_RETURN(in.directives, ir::load_directives_file(o.directives_file));
    in.train.global_batch = o.global_batch;
    in.source = o.directives_file;
    return in;
  }
  if (!o.mesh.empty()) return invalid_argument("--mesh is for --directives; the strategy carries the mesh");
  PIPER_ASSIGN_OR_RETURN(Strategy s, Strategy::parse(o.strategy));
  if (o.microbatches > 0) s.microbatches = o.microbatches;
  if (o.global_batch > 0 && o.microbatches == 0) {
    const int64_t per_microbatch = static_cast<int64_t>(s.dp) * s.mbs;
    if (o.global_batch % per_microbatch != 0) {
      return invalid_argument("--global-batch " + std::to_string(o.global_batch) + " is not a multiple of dp*mbs = " +
                              std::to_string(per_microbatch) + "; pick a multiple or give --microbatches");
    }
    s.microbatches = static_cast<int>(o.global_batch / per_microbatch);
  }
  in.train.micro_batch_size = s.mbs;
  in.train.global_batch = o.global_batch > 0 ? o.global_batch : s.global_batch();
  PIPER_RETURN_IF_ERROR(s.validate_for(in.model, in.train, s.world_size()));
  PIPER_ASSIGN_OR_RETURN(in.mesh, compile::strategy_mesh(s, in.model));
  compile::DirectiveOptions dopts;  // the target's (compile_strategy does the same)
  if (o.target == "cpu-runtime") dopts.vocab_parallel = dopts.overlap_param_gather = false;
  PIPER_ASSIGN_OR_RETURN(in.directives, compile::strategy_directives(s, in.model, dopts));
  in.source = s.to_string();
  return in;
}

Status run(const CompileCliOptions& o) {
  PIPER_ASSIGN_OR_RETURN(Inputs in, resolve(o));
  compile::CompileOptions options;
  options.verbose = o.verbose;
  options.capacity_bytes = static_cast<int64_t>(o.capacity_gib * static_cast<double>(1LL << 30));
  PIPER_ASSIGN_OR_RETURN(compile::CompileResult r,
                         compile::compile_directives(in.model, in.train, in.mesh, in.directives, options));
  // Written only once the directives compiled and verified: a failed compile leaves no file behind.
  if (!o.emit_directives.empty()) {
    PIPER_RETURN_IF_ERROR(write_text_file(o.emit_directives, ir::directives_to_json(in.directives).dump(1) + "\n"));
  }
  const auto summary = compile::summarize_plan(r.plan, r.stats);
  double total_s = 0;
  for (const auto& [step, s] : r.step_seconds) total_s += s;
  const ir::MeshInfo& m = r.plan.mesh;
  if (o.json) {
    Json steps = Json::object();
    for (const auto& [step, s] : r.step_seconds) steps[step] = s;
    Json j{{"model", in.model.name},
           {"source", in.source},
           {"world_size", r.plan.world_size},
           {"mesh", Json{{"pp", m.pp}, {"vpp", m.vpp}, {"dp", m.dp}, {"ep", m.ep}, {"tp", m.tp}}},
           {"microbatches", r.graph.num_microbatches},
           {"directives", in.directives.size()},
           {"graph_nodes", r.graph.num_nodes()},
           {"instructions", r.stats.instructions},
           {"compile_seconds", total_s},
           {"step_seconds", steps},
           {"templates", compile::summary_to_json(summary)}};
    print_json(j.dump());
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
      sub->add_option("--target", o->target, "megatron (default) or cpu-runtime: the backend a strategy is lowered for");
      sub->add_flag("--verbose", o->verbose, "log each compile step with its time");
      add_precision_options(sub, &o->precision);
      sub->add_flag("--json", o->json, "print one JSON object");
      return std::function<Status()>([o] { return run(*o); });
    });

}  // namespace
}  // namespace piper::cli
