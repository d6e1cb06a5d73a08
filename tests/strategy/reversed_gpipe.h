// A schedule that is not a built-in, for the tests of registered schedules (planner search, simulation of
// directives, training on MPI ranks): GPipe with the backwards newest first (the newest activations freed first).
#pragma once

#include <vector>

#include "piper/strategy/schedules/schedule.h"

namespace piper::testing {

inline constexpr const char* kReversedGpipe = "test-reversed-gpipe";

inline Result<std::vector<ir::Directive>> reversed_gpipe(const schedules::ScheduleParams& p) {
  schedules::ScheduleBuilder b(p.pp);
  for (int r = 0; r < p.pp; ++r) {
    b.place(r, r);
    for (int i = 0; i < p.microbatches; ++i) b.add(r, r, ir::Pass::kF, i);
    for (int i = p.microbatches - 1; i >= 0; --i) b.add(r, r, ir::Pass::kBW, i);
  }
  return b.finish();
}

// Registers reversed_gpipe as schedule `kReversedGpipe` (one stage per pipeline rank).
inline void register_reversed_gpipe() {
  schedules::register_schedule({kReversedGpipe, "gpipe, backwards newest first",
                                [](const schedules::ScheduleParams&) { return 1; }, reversed_gpipe});
}

}  // namespace piper::testing
