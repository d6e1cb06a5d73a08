// Dependency and unit-cost simulation of a PipelineSchedule (no communication cost).
//
// Each rank runs its slots in order. A slot starts when its rank is free and every chunk its members depend on
// (graph data edges, outside the slot) has finished; an overlapped slot thus waits for all its inputs, as
// DualPipe's fused F&B chunk does, and its members then run one after the other in the listed order (an
// overlapped pair costs F + B: no credit is taken for real overlap). If some rank can never
// proceed the schedule deadlocks under blocking point-to-point semantics, and the error names every blocked
// rank, its next action and the action it waits for.
#pragma once

#include <vector>

#include "piper/base/status.h"
#include "piper/compile/pipeline_schedule.h"

namespace piper::compile {

// Time of one task of one stage for one microbatch; a fused backward (BW) costs b + w.
struct UnitCosts {
  double f = 1;
  double b = 1;
  double w = 1;
};

struct TimedAction {
  ScheduleAction action;
  int slot = 0;             // index into RankSchedule::slots
  bool overlapped = false;  // member of a multi-action slot
  double start = 0;
  double end = 0;
};

struct RankTimeline {
  std::vector<TimedAction> actions;  // in execution order
  double busy = 0;
  // Most (stage, microbatch) activations alive at once on the rank: F started and its last backward task (W or
  // BW) not finished. Units are stages of this rank (a V-schedule stage is half a 1F1B stage).
  int peak_inflight_microbatches = 0;
};

struct ScheduleTimeline {
  std::vector<RankTimeline> ranks;
  double makespan = 0;
  double total_idle = 0;        // sum over ranks of makespan - busy
  double bubble_fraction = 0;   // total_idle / (ranks * makespan)
};

Result<ScheduleTimeline> simulate_schedule(const PipelineSchedule& schedule, const UnitCosts& costs);

double action_cost(ir::Pass pass, const UnitCosts& costs);

}  // namespace piper::compile
