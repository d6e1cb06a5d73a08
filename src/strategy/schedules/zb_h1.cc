// ZB-H1: the 1F1B shape with every backward split into B (input grad) and W (weight grad); rank r defers each
// W by r B-steps (W of microbatch j right after the B of microbatch j+r), leftover Ws at the end
// (reference/schedules.md 3.4). With T_F = T_B = T_W the bubble is a third of 1F1B's.
#include <algorithm>

#include "piper/strategy/schedules/schedule.h"

namespace piper::schedules {

Result<std::vector<ir::Directive>> zb_h1_schedule(const ScheduleParams& p) {
  ScheduleBuilder b(p.pp);
  const int m = p.microbatches;
  for (int r = 0; r < p.pp; ++r) {
    b.place(r, r);
    int warmup = std::min(p.pp - 1 - r, m);
    int f = 0, bi = 0, w = 0;
    auto backward = [&] {
      b.add(r, r, ir::Pass::kB, bi++);
      if (bi - w > r) b.add(r, r, ir::Pass::kW, w++);
    };
    while (f < warmup) b.add(r, r, ir::Pass::kF, f++);
    while (f < m) {
      b.add(r, r, ir::Pass::kF, f++);
      backward();
    }
    while (bi < m) backward();
    while (w < m) b.add(r, r, ir::Pass::kW, w++);
  }
  return b.finish();
}

}  // namespace piper::schedules
