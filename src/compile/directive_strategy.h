// directive_strategy: the Strategy a directive list stands for, so that what is built on Strategies (the
// simulator's task prices, the closed form, the runtime's checks, the planner's ranking) takes a directive file.
//
// strategy_of_directives() reads the mesh (pp, vpp, dp, ep, tp, fold) and the directives' own settings (split:
// microbatches; replicate: zero; shard tp: sp; shard ep: a2a; recompute: full, selective or modules; disaggregate:
// af-pipe) and then tries every schedule that `schedule=` accepts (built-in and registered, with and without
// ep_overlap) on that mesh. A candidate whose strategy_directives() equal the file's directives exactly, for the
// megatron or the cpu-runtime target, is the strategy the file was emitted from: `recognised`. Otherwise the
// first candidate that validates on the mesh prices the plan (its tp, ep, zero, mbs and recomputation are the
// file's, which is all the simulator's prices read); the schedule is the file's own order directives.
// `mbs` (sequences per microbatch) is not a directive: the caller derives it from the global batch.
// Thread-safety: a pure function of its inputs (registered schedules must be registered before).
#pragma once

#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/ir/directive.h"
#include "piper/ir/graph.h"
#include "piper/spec/model_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::compile {

struct DirectiveStrategy {
  Strategy strategy;        // the recognised strategy, or the one that prices the plan
  bool recognised = false;  // strategy_directives(strategy) == the directives
  std::string target;       // when recognised: "megatron" or "cpu-runtime" (compile::Target::name)
};

Result<DirectiveStrategy> strategy_of_directives(const ModelSpec& model, const ir::MeshInfo& mesh,
                                                 const std::vector<ir::Directive>& directives, int mbs);

// The microbatch count of a directive list: its split directive's, 1 without one.
int directive_microbatches(const std::vector<ir::Directive>& directives);

}  // namespace piper::compile
