// What the CPU runtime (`piper train`) executes today, stated once, so that the planner can be restricted to it
// (`piper plan --runnable`, `piper train --strategy auto`) instead of each caller hard-coding a strategy.
//
// Keep this in step with the executor: when the runtime learns a new dimension (expert parallelism, tensor
// parallelism, ZeRO-3, af-pipe), widen runtime_support() in the same change; tests/runtime/support_test.cc runs
// one step of a strategy per supported value, so a value listed here that the executor rejects fails there.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/strategy/strategy.h"

namespace piper::runtime {

struct RuntimeSupport {
  std::vector<std::string> schedules;  // pipeline schedules the executor runs
  std::vector<int> zero;               // ZeRO stages
  std::vector<Recompute> recompute;
  // 0: no runtime bound (the model's divisibility, Strategy::validate_for, is the only one); else the largest.
  int max_tp = 0;             // tensor parallelism (and etp, which divides it), with or without ep
  int max_ep = 0;             // expert parallelism; ep > 1 with a2a flat or halo
  bool disaggregate = false;  // attention/FFN disaggregation (af-pipe)
  // Compositions beyond the per-dimension lists are checked by check_runnable(), which refuses only what the
  // executor cannot run, each with its reason (tests/runtime/support_test.cc trains what it accepts).
};

RuntimeSupport runtime_support();

// OK when runtime_support() covers `strategy`; else Unimplemented naming the first dimension it does not and
// what the runtime runs instead.
Status check_runnable(const Strategy& strategy);

}  // namespace piper::runtime
