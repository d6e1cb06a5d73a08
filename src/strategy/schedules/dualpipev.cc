// DualPipeV (DeepSeek / Sea AI Lab "cut-in-half" DualPipe): rank r holds stage r (phase 0) and stage 2p-1-r
// (phase 1); the model runs down the ranks and back up, so rank 0 holds the first and the last stage.
// The eight-step table of reference/schedules.md 3.8 (from deepseek-ai/DualPipe dualpipev.py), with
// overlapped F&B pairs emitted as one "may overlap" slot [F, BW]. Backwards marked zero-bubble split into B
// (input grad) now and W later (FIFO); all other backwards stay fused (BW).
#include <deque>

#include "piper/strategy/schedules/schedule.h"

namespace piper::schedules {
namespace {

class RankRow {
 public:
  RankRow(ScheduleBuilder& b, int p, int r) : b_(b), r_(r), stage_{r, 2 * p - 1 - r} {}

  ir::TagFilter next_f(int phase) { return ir::stage_filter(stage_[phase], f_[phase]++, ir::Pass::kF); }
  // A fused backward (BW), or with zero-bubble only B (input grad) now and its W queued.
  ir::TagFilter next_b(int phase, bool zb) {
    int mb = b_count_[phase]++;
    if (!zb) return ir::stage_filter(stage_[phase], mb, ir::Pass::kBW);
    wq_.emplace_back(stage_[phase], mb);
    return ir::stage_filter(stage_[phase], mb, ir::Pass::kB);
  }
  void forward(int phase) { b_.add_overlap(r_, {next_f(phase)}); }
  void backward(int phase, bool zb = false) { b_.add_overlap(r_, {next_b(phase, zb)}); }
  void weight() {
    auto [stage, mb] = wq_.front();
    wq_.pop_front();
    b_.add(r_, stage, ir::Pass::kW, mb);
  }
  void forward_backward(int f_phase, int b_phase) {
    b_.add_overlap(r_, {next_f(f_phase), next_b(b_phase, false)});
  }

 private:
  ScheduleBuilder& b_;
  int r_;
  int stage_[2];
  int f_[2] = {0, 0};
  int b_count_[2] = {0, 0};
  std::deque<std::pair<int, int>> wq_;
};

}  // namespace

Result<std::vector<ir::Directive>> dualpipev_schedule(const ScheduleParams& params) {
  const int p = params.pp, m = params.microbatches;
  if (m < 2 * p) {
    return invalid_argument("dualpipev needs microbatches >= 2*pp (got m=" + std::to_string(m) + ", pp=" +
                            std::to_string(p) + "); raise microbatches to " + std::to_string(2 * p));
  }
  ScheduleBuilder b(p);
  for (int r = 0; r < p; ++r) {
    b.place(r, r);
    b.place(2 * p - 1 - r, r);
  }
  for (int r = 0; r < p; ++r) {
    RankRow row(b, p, r);
    const bool last = r == p - 1;
    for (int i = 0; i < 2 * (p - r - 1); ++i) row.forward(0);  // 1: nF0
    for (int i = 0; i < r + 1; ++i) {                           // 2: nF0F1
      row.forward(0);
      row.forward(1);
    }
    for (int i = 0; i < p - r - 1; ++i) {  // 3: nB1W1F1 (zero bubble)
      row.backward(1, true);
      row.weight();
      row.forward(1);
    }
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {  // 4: nF0B1F1B0 (main)
      if (i == 0 && last) {
        row.forward(0);  // the last rank runs its first F0 and B1 un-overlapped
        row.backward(1);
      } else {
        row.forward_backward(0, 1);
      }
      row.forward_backward(1, 0);
    }
    for (int i = 0; i < p - r - 1; ++i) {  // 5: nB1F1B0
      row.backward(1);
      row.forward_backward(1, 0);
    }
    bool zb = false;  // 6: nB1B0, the second half zero-bubble
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) zb = true;
      row.backward(1, zb);
      if (i == (r + 1) / 2 && r % 2 == 0) zb = true;
      row.backward(0, zb);
    }
    for (int i = 0; i < p - r - 1; ++i) {  // 7: nWB0 (zero bubble)
      row.weight();
      row.backward(0, true);
    }
    for (int i = 0; i < r + 1; ++i) row.weight();  // 8: nW
  }
  return b.finish();
}

}  // namespace piper::schedules
