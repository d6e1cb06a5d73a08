// 1F1B (PipeDream-flush): rank r runs p-1-r warm-up forwards, then alternates one forward and one (fused)
// backward until the forwards are issued, then the remaining backwards. Same order as torch Schedule1F1B
// and Megatron's non-interleaved schedule (reference/schedules.md 3.2). The skeleton is shared with zb-h1.
#include <algorithm>

#include "piper/strategy/schedules/schedule.h"

namespace piper::schedules {

void add_one_f_one_b_row(ScheduleBuilder& b, const ScheduleParams& p, int rank,
                         const std::function<void(int)>& backward_step) {
  const int m = p.microbatches;
  const int warmup = std::min(p.pp - 1 - rank, m);
  int f = 0, bw = 0;
  while (f < warmup) b.add(rank, rank, ir::Pass::kF, f++);
  while (f < m) {
    b.add(rank, rank, ir::Pass::kF, f++);
    backward_step(bw++);
  }
  while (bw < m) backward_step(bw++);
}

Result<std::vector<ir::Directive>> one_f_one_b_schedule(const ScheduleParams& p) {
  ScheduleBuilder b(p.pp);
  for (int r = 0; r < p.pp; ++r) {
    b.place(r, r);
    if (!p.ep_overlap) {
      add_one_f_one_b_row(b, p, r, [&](int mb) { b.add(r, r, ir::Pass::kBW, mb); });
      continue;
    }
    // ep_overlap (Megatron's combined 1F1B; with pp = 1 its combined_1f1b_schedule_for_no_pipelining): one more
    // warm-up forward, then F of microbatch f and BW of microbatch f - warmup in one may-overlap slot.
    const int m = p.microbatches;
    const int warmup = std::min(p.pp - r, m);
    int f = 0, bw = 0;
    while (f < warmup) b.add(r, r, ir::Pass::kF, f++);
    while (f < m) b.add_overlap(r, {ir::stage_filter(r, f++, ir::Pass::kF), ir::stage_filter(r, bw++, ir::Pass::kBW)});
    while (bw < m) b.add(r, r, ir::Pass::kBW, bw++);
  }
  return b.finish();
}

}  // namespace piper::schedules
