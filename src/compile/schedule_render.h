// Text, JSON and SVG views of a simulated pipeline schedule (used by `piper schedule`).
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/compile/pipeline_schedule.h"
#include "piper/compile/schedule_sim.h"

namespace piper::compile {

// Multi-stage ranks print stage-qualified actions ("7F3"); single-stage schedules print "F3".
bool schedule_needs_stage_labels(const PipelineSchedule& s);

// One line per rank: "rank0: F0 F1 B0 W0 ...".
std::string format_action_lists(const PipelineSchedule& s);

// One row per rank, one cell per time quantum (the largest of 1, 0.5, 0.25, 0.2, 0.1, 0.05 dividing every
// cost), cells labelled with the running action ("F3", "B3", "W3"; a fused BW shows its B part then its W
// part), '.' when idle, '*' marking members of an overlapped slot. Errors if no quantum fits the costs.
Result<std::string> format_timeline(const PipelineSchedule& s, const ScheduleTimeline& t, const UnitCosts& costs);

// {"ranks": [{"rank", "stages", "actions", "timeline", "busy", "idle", "peak_inflight_microbatches"}],
//  "makespan", "bubble_fraction", "total_idle", "pp", "num_stages", "microbatches", "costs"}.
Json schedule_to_json(const PipelineSchedule& s, const ScheduleTimeline& t, const UnitCosts& costs);

// The pipeline picture: a row per rank, rectangles on a time axis coloured by task (F blue, B green,
// W orange), labelled with the microbatch (and stage on multi-stage ranks); members of an overlapped slot carry
// a dark bar over the slot.
std::string schedule_to_svg(const PipelineSchedule& s, const ScheduleTimeline& t, const UnitCosts& costs,
                            const std::string& title);

}  // namespace piper::compile
