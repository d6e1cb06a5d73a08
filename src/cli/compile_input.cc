#include "piper/cli/compile_input.h"

#include "piper/cli/directive_input.h"
#include "piper/cli/flags.h"
#include "piper/compile/strategy_directives.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::cli {

Result<CompileInputs> resolve_compile_inputs(const CompileCliOptions& o, const ModelSpec* preloaded) {
  if (o.target != "megatron" && o.target != "cpu-runtime") {
    return invalid_argument("--target " + o.target +
                            " is not one of {megatron, cpu-runtime}; cpu-runtime writes the "
                            "directives `piper train` runs (whole embedding and head, ZeRO gathers after the update)");
  }
  const bool from_directives = !o.directives_file.empty() || o.has_directive_list;
  if (o.target != "megatron" && from_directives) {
    return invalid_argument("--target " + o.target +
                            " chooses how a --strategy is lowered; a --directives file is "
                            "compiled as written: drop --target");
  }
  if (o.strategy.empty() != from_directives) {
    return invalid_argument("give exactly one of --strategy S (dp=8,pp=4,ep=8,schedule=1f1b,...) or --directives FILE");
  }
  CompileInputs in;
  if (preloaded != nullptr) {
    in.model = *preloaded;
  } else {
    PIPER_ASSIGN_OR_RETURN(in.model, load_model(o.model));
  }
  PIPER_ASSIGN_OR_RETURN(in.train.seq_len, resolve_seq_len(in.model, o.seq_len));
  PIPER_RETURN_IF_ERROR(apply_precision_options(o.precision, &in.train));
  if (from_directives) {
    if (o.mesh.empty()) return invalid_argument("--directives needs --mesh pp=P[,vpp=V,dp=D,ep=E,tp=T]");
    if (o.microbatches > 0) {
      return invalid_argument(
          "--microbatches comes from the directive file's split directive with --directives; "
          "drop --microbatches");
    }
    PIPER_ASSIGN_OR_RETURN(in.mesh, parse_mesh(o.mesh));
    if (o.has_directive_list) {
      in.directives = o.directive_list;
    } else {
      PIPER_ASSIGN_OR_RETURN(in.directives, ir::load_directives_file(o.directives_file));
    }
    in.train.global_batch = o.global_batch;
    in.source = o.has_directive_list ? o.directives_label : o.directives_file;
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
  if (o.target == "cpu-runtime") dopts.overlap_param_gather = false;
  PIPER_ASSIGN_OR_RETURN(in.directives, compile::strategy_directives(s, in.model, dopts));
  in.source = s.to_string();
  in.tp_overlap = s.tp_overlap;
  return in;
}

}  // namespace piper::cli
