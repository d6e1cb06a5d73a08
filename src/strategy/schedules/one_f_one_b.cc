// 1F1B (PipeDream-flush): rank r runs p-1-r warm-up forwards, then alternates one forward and one (fused)
// backward until the forwards are issued, then the remaining backwards. Same order as torch Schedule1F1B
// and Megatron's non-interleaved schedule (reference/schedules.md 3.2).
#include <algorithm>

#include "piper/strategy/schedules/schedule.h"

namespace piper::schedules {

Result<std::vector<ir::Directive>> one_f_one_b_schedule(const ScheduleParams& p) {
  ScheduleBuilder b(p.pp);
  const int m = p.microbatches;
  for (int r = 0; r < p.pp; ++r) {
    b.place(r, r);
    int warmup = std::min(p.pp - 1 - r, m);
    int f = 0, bw = 0;
    while (f < warmup) b.add(r, r, ir::Pass::kF, f++);
    while (f < m) {
      b.add(r, r, ir::Pass::kF, f++);
      b.add(r, r, ir::Pass::kBW, bw++);
    }
    while (bw < m) b.add(r, r, ir::Pass::kBW, bw++);
  }
  return b.finish();
}

}  // namespace piper::schedules
