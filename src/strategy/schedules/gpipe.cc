// GPipe: every rank runs all forwards, then all (fused) backwards in microbatch order.
#include "piper/strategy/schedules/schedule.h"

namespace piper::schedules {

Result<std::vector<ir::Directive>> gpipe_schedule(const ScheduleParams& p) {
  ScheduleBuilder b(p.pp);
  for (int r = 0; r < p.pp; ++r) {
    b.place(r, r);
    for (int i = 0; i < p.microbatches; ++i) b.add(r, r, ir::Pass::kF, i);
    for (int i = 0; i < p.microbatches; ++i) b.add(r, r, ir::Pass::kBW, i);
  }
  return b.finish();
}

}  // namespace piper::schedules
