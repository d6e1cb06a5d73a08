// The interleaved-1F1B op sequence shared by `interleaved` and `af-pipe` (internal to piper_schedules).
#pragma once

#include <vector>

#include "piper/base/status.h"
#include "piper/strategy/schedules/schedule.h"

namespace piper::schedules {

// One op of a rank's interleaved sequence: a forward, a backward, or a steady-state (forward, backward) pair.
// Stages are *local* indices 0..v-1 (global stage = local * p + position) and microbatches are per stage.
struct InterleavedOp {
  int f_local = -1, f_mb = -1;  // forward part, -1 when absent
  int b_local = -1, b_mb = -1;  // backward part, -1 when absent
};

// torch's "flex" interleaved rule (reference/schedules.md 3.3) for the rank at chain position `pos`:
// rounds = max(1, m / p), mb_per_round = m / rounds, warm-up = min((v-1) * mb_per_round + 2 (p-1-pos) +
// extra_warmup, m v). extra_warmup = 1 under ep_overlap (ScheduleParams), as Megatron's combined 1F1B.
Result<std::vector<InterleavedOp>> interleaved_ops(int p, int v, int m, int pos, int extra_warmup = 0);

}  // namespace piper::schedules
