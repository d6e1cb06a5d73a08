// A compile target: what one backend executes, stated once instead of as flags scattered over its callers.
//
// compile_strategy() lowers a Strategy the way its target runs it. Two targets exist:
//   - megatron_target(): the Megatron-Core-like GPU system the closed form, the simulator and the planner model
//     (vocabulary-parallel embedding and head; ZeRO-1/2 parameters gathered by the next forward, as
//     --overlap-param-gather);
//   - cpu_runtime_target(): Piper's CPU runtime (runtime/), which runs what megatron_target() lowers: the embedding
//     and the head vocabulary parallel under tp, and ZeRO-1/2 parameters gathered by the next forward (the runtime
//     completes the deferred gathers before a checkpoint and at the end of a run, Executor::complete_param_gathers).
// `piper train` compiles for cpu_runtime_target() and its prediction simulates that very plan.
#pragma once

#include <string>

namespace piper::compile {

struct Target {
  std::string name;
  bool vocab_parallel = true;        // DirectiveOptions::vocab_parallel
  bool overlap_param_gather = true;  // DirectiveOptions::overlap_param_gather
};

Target megatron_target();
Target cpu_runtime_target();

}  // namespace piper::compile
