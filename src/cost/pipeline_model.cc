#include "piper/cost/pipeline_model.h"

#include <algorithm>

namespace piper::cost {

int stage_of_chunk(ScheduleKind kind, int pp, int chunks_per_rank, int rank, int chunk) {
  if (kind == ScheduleKind::kDualPipeV) return chunk == 0 ? rank : 2 * pp - 1 - rank;
  (void)chunks_per_rank;
  return rank + chunk * pp;
}

double in_flight_units(ScheduleKind kind, int pp, int m, int v, int r) {
  switch (kind) {
    case ScheduleKind::kGPipe: return static_cast<double>(m) * v;
    case ScheduleKind::k1F1B: return std::min(pp - r, m);
    case ScheduleKind::kZBH1: return std::min(pp, m);
    case ScheduleKind::kInterleaved: return std::min(2 * (pp - r - 1) + (v - 1) * pp + 1, m * v);
    case ScheduleKind::kDualPipeV: return std::min(2 * pp + 1, 2 * m);
    case ScheduleKind::kAFPipe: return std::min(pp - r, m) + 1;
    case ScheduleKind::kCustom: return static_cast<double>(m) * v;  // unknown order: at most every microbatch
  }
  return m;
}

double chunk_in_flight_units(ScheduleKind kind, int pp, int m, int v, int r, int chunk) {
  if (kind == ScheduleKind::kDualPipeV) return chunk == 0 ? std::min(2 * pp - r, m) : std::min(r + 1, m);
  return in_flight_units(kind, pp, m, v, r) / v;
}

double deferred_w_units(ScheduleKind kind, int pp, int m, int r) {
  (void)pp;
  return kind == ScheduleKind::kZBH1 ? std::min(r + 1, m) : 0;
}

double bubble_time_s(ScheduleKind kind, int pp, int v, double t_f, double t_b, double t_w) {
  const double p1 = pp - 1;
  double b = 0;
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B: b = p1 * (t_f + t_b); break;
    case ScheduleKind::kInterleaved: b = p1 * (t_f + t_b) / v; break;
    case ScheduleKind::kZBH1: b = p1 * (t_f + t_b - 2 * t_w); break;
    case ScheduleKind::kDualPipeV: b = p1 * (t_f / 2 + t_b - 1.5 * t_w); break;
    case ScheduleKind::kAFPipe: b = p1 * (t_f + t_b) / 4; break;
    case ScheduleKind::kCustom: b = p1 * (t_f + t_b); break;  // estimate() refuses it; 1F1B's as a bound
  }
  return std::max(0.0, b);
}

double bubble_fraction(ScheduleKind kind, int pp, int m, int v, double t_f, double t_b, double t_w) {
  double bubble = bubble_time_s(kind, pp, v, t_f, t_b, t_w);
  double busy = m * (t_f + t_b);
  return bubble / (busy + bubble);
}

}  // namespace piper::cost
