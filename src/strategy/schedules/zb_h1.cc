// ZB-H1: the 1F1B shape (add_one_f_one_b_row) with every backward split into B (input grad) and W (weight
// grad); rank r defers each W by r B-steps (W of microbatch j right after the B of microbatch j+r), leftover Ws
// at the end (reference/schedules.md 3.4). With T_F = T_B = T_W the bubble is a third of 1F1B's.
#include "piper/strategy/schedules/schedule.h"

namespace piper::schedules {

Result<std::vector<ir::Directive>> zb_h1_schedule(const ScheduleParams& p) {
  ScheduleBuilder b(p.pp);
  for (int r = 0; r < p.pp; ++r) {
    b.place(r, r);
    int w = 0;
    add_one_f_one_b_row(b, p, r, [&](int mb) {
      b.add(r, r, ir::Pass::kB, mb);
      if (mb + 1 - w > r) b.add(r, r, ir::Pass::kW, w++);
    });
    while (w < p.microbatches) b.add(r, r, ir::Pass::kW, w++);
  }
  return b.finish();
}

}  // namespace piper::schedules
