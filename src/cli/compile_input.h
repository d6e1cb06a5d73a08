// The inputs of `piper compile` (and the Python module's piper.compile): the model, training setup, mesh and
// directive list of a --strategy (lowered for a target) or of a --directives file, with the flags' checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/cli/precision_flags.h"
#include "piper/ir/directive.h"
#include "piper/ir/graph.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"

namespace piper::cli {

struct CompileCliOptions {
  std::string model;
  std::string strategy;
  std::string directives_file;
  std::string mesh;          // with --directives: "pp=2,dp=4,ep=2" (vpp, tp default 1)
  int64_t global_batch = 0;  // 0: not given
  int64_t seq_len = 0;       // 0: not given (min(4096, the model's max_seq_len))
  int microbatches = 0;      // 0: not given (the strategy's)
  double capacity_gib = 0;   // 0: not given (no memory check)
  std::string emit_directives;
  std::string emit_plan;  // --emit-plan FILE: the compiled Plan as JSON (compile/plan_io.h)
  std::string target = "megatron";  // which backend a strategy's directives are for
  bool verbose = false;
  bool json = false;
  PrecisionOptions precision;  // the stash, wire and dispatch bytes of the compiled plan
  // Instead of --directives FILE: a directive list already parsed (the Python module's builder), named
  // `directives_label` where a file would be named; needs `mesh` as a file does.
  bool has_directive_list = false;
  std::vector<ir::Directive> directive_list;
  std::string directives_label;
};

// The model, training setup, mesh and directives the options resolve to.
struct CompileInputs {
  ModelSpec model;
  TrainSpec train;
  ir::MeshInfo mesh;
  std::vector<ir::Directive> directives;
  std::string source;  // the strategy text or the file name
  bool tp_overlap = false;  // the strategy's tp_overlap (compile::CompileOptions::tp_overlap; a directive file: false)
};

// Checks the flag combination, loads the model (or takes `preloaded`, the Python module's Model; o.model is then not
// read) and resolves the directives: a strategy's for o.target, or the file's as written.
Result<CompileInputs> resolve_compile_inputs(const CompileCliOptions& o, const ModelSpec* preloaded = nullptr);

}  // namespace piper::cli
