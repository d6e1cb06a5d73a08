// Fault injection at chosen points: a test hook, off by default, that kills or stops this process at a named
// point of a chosen training step on a chosen rank, so that failure handling can be tested deterministically
// (docs/reliability.md, "Faults").
//
//   PIPER_FAULT=POINT:RANK:STEP[:ACTION]
//     POINT   one of kFaultPoints: pp_send (a pipeline send), ep_a2a (an expert-parallel all-to-all, flat),
//             halo (a HALO exchange), migrate (an expert migration), ckpt_write (a checkpoint write)
//     RANK    world rank (process_rank(), check.h) that faults, >= 0
//     STEP    training step (1-based) during which it faults; for ckpt_write, the step being saved
//     ACTION  kill (SIGKILL itself, the default) or stop (SIGSTOP itself: a stalled rank)
//
// The variable is read and validated once per process (init_fault_injection(); a bad spec is an error naming
// the bad field and the valid values). fault_point() is cheap when no fault is armed (one atomic load) and fires
// at most once: the first time the armed point is reached on the armed rank during the armed step.
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "piper/base/status.h"

namespace piper {

inline constexpr const char* kFaultPoints[] = {"pp_send", "ep_a2a", "halo", "migrate", "ckpt_write"};

enum class FaultAction { kKill, kStop };

struct FaultSpec {
  std::string point;
  int rank = 0;
  int64_t step = 1;
  FaultAction action = FaultAction::kKill;
};

// Parses "POINT:RANK:STEP[:ACTION]"; InvalidArgument naming the bad field, its valid values and the format.
Result<FaultSpec> parse_fault_spec(std::string_view text);

// Reads PIPER_FAULT (once; later calls return the first result) and arms the fault it names. OK when unset or
// empty. Called by the trainer at create(), on every rank.
Status init_fault_injection();

// The training step now running on this process (the trainer sets it before each step and each save).
void set_fault_step(int64_t step);

// A fault point: kills or stops this process here when the armed fault names `point`, this rank and the
// current step. `point` must be one of kFaultPoints.
void fault_point(const char* point);

}  // namespace piper
