// A directive file as the input of any command: `--directives FILE --mesh pp=P[,vpp=V,dp=D,ep=E,tp=T]` instead of
// `--strategy S` (compile, simulate, estimate, train, plan --candidate). The file is parsed, its mesh checked, and
// the strategy it stands for resolved (compile/directive_strategy.h): recognised when the file is what a strategy
// emits, else the strategy that prices its tasks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/compile/directive_strategy.h"
#include "piper/ir/directive.h"
#include "piper/ir/graph.h"
#include "piper/spec/model_spec.h"

namespace piper::cli {

// "pp=2,dp=4,ep=2" (vpp, dp, ep, tp default 1); errors name the item and the valid range.
Result<ir::MeshInfo> parse_mesh(const std::string& text);

struct DirectiveInput {
  std::string file;
  ir::MeshInfo mesh;
  std::vector<ir::Directive> directives;
  compile::DirectiveStrategy resolved;  // resolved.strategy.mbs: global_batch / (dp * microbatches)
};

// Checks the flag combination (exactly one of --strategy / --directives; --mesh with --directives only), loads
// the file and resolves its strategy. `global_batch` 0: one sequence per microbatch (mbs 1); otherwise it must
// be a multiple of dp * the split's microbatches. `world` > 0: the mesh must have that many ranks (the cluster's).
Result<DirectiveInput> load_directive_input(const ModelSpec& model, const std::string& strategy,
                                            const std::string& file, const std::string& mesh, int64_t global_batch,
                                            int world);

// The same for a directive list already parsed (the Python module's builder), named `label` in messages where a
// file would be named; the mesh is checked as for a file.
Result<DirectiveInput> resolve_directive_input(const ModelSpec& model, std::vector<ir::Directive> directives,
                                               const std::string& label, const std::string& mesh,
                                               int64_t global_batch, int world);

// "recognised as S" / "priced as S (the directives' own schedule)", for the commands' output.
std::string describe(const DirectiveInput& in);

}  // namespace piper::cli
