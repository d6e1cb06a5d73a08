// Shared helpers for the schedule tests: generate a named schedule, realize it and simulate it.
#pragma once

#include <string>

#include "piper/compile/pipeline_schedule.h"
#include "piper/compile/schedule_render.h"
#include "piper/compile/schedule_sim.h"
#include "piper/strategy/schedules/schedule.h"

namespace piper::compile::testing {

struct Run {
  PipelineSchedule schedule;
  ScheduleTimeline timeline;
};

inline Result<Run> run_schedule(const std::string& name, int p, int m, int v, UnitCosts costs = {},
                                bool ep_overlap = false) {
  schedules::ScheduleParams params{p, m, v, ep_overlap};
  PIPER_ASSIGN_OR_RETURN(auto directives, schedules::schedule_directives(name, params));
  PIPER_ASSIGN_OR_RETURN(int stages, schedules::schedule_num_stages(name, params));
  PIPER_ASSIGN_OR_RETURN(PipelineSchedule s, realize_schedule(directives, p, stages, m));
  PIPER_ASSIGN_OR_RETURN(ScheduleTimeline t, simulate_schedule(s, costs));
  return Run{std::move(s), std::move(t)};
}

}  // namespace piper::compile::testing
