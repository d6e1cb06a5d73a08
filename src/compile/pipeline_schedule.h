// A pipeline schedule made concrete: per-rank action lists read back from the graph after the directives ran.
//
// realize_schedule() builds a chain of num_stages layers (one per stage), splits it into microbatches,
// tags layer s with stage s, applies the schedule's directives (place + order, or a user's file) through the
// ordinary ir passes, and reads every rank's order back. So what `piper schedule` prints is what the
// directives produce, never a second copy of the rules.
#pragma once

#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/ir/directive.h"
#include "piper/ir/graph.h"

namespace piper::compile {

struct ScheduleAction {
  int stage = -1;
  int mb = -1;
  ir::Pass pass = ir::Pass::kF;
  ir::NodeId node = ir::kNoNode;
};

// One slot of a rank's order; more than one action means "may overlap".
struct ScheduleSlot {
  std::vector<ScheduleAction> actions;
};

struct RankSchedule {
  int rank = 0;
  std::vector<int> stages;  // stages placed on this rank, ascending
  std::vector<ScheduleSlot> slots;
};

struct PipelineSchedule {
  int pp = 1;
  int num_stages = 1;
  int microbatches = 1;
  std::vector<RankSchedule> ranks;
  ir::Graph graph;  // the chain graph after the directives (for dependencies)
};

// `directives` must place every stage and order every chunk; a directive list that contains its own split is
// used as is, otherwise split(microbatches) is prepended. Errors name the directive or the unordered node.
Result<PipelineSchedule> realize_schedule(const std::vector<ir::Directive>& directives, int pp, int num_stages,
                                          int microbatches);

// "F3" (or "7F3" with the stage), "BW2"; a multi-action slot is "(0F7;7B3;7W3)".
std::string action_text(const ScheduleAction& a, bool with_stage);
std::string slot_text(const ScheduleSlot& s, bool with_stage);

}  // namespace piper::compile
