// Interleaved 1F1B (virtual pipeline): rank r holds stages r, r+p, ..., r+(v-1)p. The op sequence follows
// torch's ScheduleInterleaved1F1B ("flex" rule), which reproduces Megatron's interleaved order when m is a
// multiple of p (reference/schedules.md 3.3). The backward is fused (BW). With ep_overlap (Megatron's
// --overlap-moe-expert-parallel-comm) one more warm-up forward, and each steady (F, BW) op is a may-overlap slot.
#include "interleaved.h"

#include <algorithm>
#include <map>

namespace piper::schedules {

Result<std::vector<InterleavedOp>> interleaved_ops(int p, int v, int m, int pos, int extra_warmup) {
  if (m < p) {
    return invalid_argument("interleaved orders need microbatches >= pp (got m=" + std::to_string(m) +
                            ", pp=" + std::to_string(p) + "); raise microbatches");
  }
  const int rounds = std::max(1, m / p);
  if (m % rounds != 0) {
    return invalid_argument("microbatches=" + std::to_string(m) + " must be a multiple of " + std::to_string(rounds) +
                            " (= microbatches / pp rounds); pick m as a multiple of pp");
  }
  const int per_round = m / rounds;
  const int total = m * v;
  const int warmup = std::min((v - 1) * per_round + 2 * (p - 1 - pos) + extra_warmup, total);
  auto fwd_local = [&](int step) { return (step / per_round) % v; };
  auto bwd_local = [&](int step) { return v - 1 - ((step - warmup) / per_round) % v; };
  std::vector<int> fcount(static_cast<size_t>(v), 0), bcount(static_cast<size_t>(v), 0);
  std::vector<InterleavedOp> ops;
  const int steady = total - warmup;
  for (int op = 0; op < warmup + steady + warmup; ++op) {
    InterleavedOp o;
    if (op < warmup + steady) {
      o.f_local = fwd_local(op);
      o.f_mb = fcount[static_cast<size_t>(o.f_local)]++;
    }
    if (op >= warmup) {
      o.b_local = bwd_local(op);
      o.b_mb = bcount[static_cast<size_t>(o.b_local)]++;
    }
    ops.push_back(o);
  }
  for (int c = 0; c < v; ++c) {
    if (fcount[static_cast<size_t>(c)] != m || bcount[static_cast<size_t>(c)] != m) {
      return internal_error("interleaved rule produced an unbalanced order (local stage " + std::to_string(c) + ")");
    }
  }
  return ops;
}

Result<std::vector<ir::Directive>> interleaved_schedule(const ScheduleParams& p) {
  ScheduleBuilder b(p.pp);
  for (int s = 0; s < p.pp * p.vpp; ++s) b.place(s, s % p.pp);
  for (int r = 0; r < p.pp; ++r) {
    PIPER_ASSIGN_OR_RETURN(auto ops, interleaved_ops(p.pp, p.vpp, p.microbatches, r, p.ep_overlap ? 1 : 0));
    for (const auto& o : ops) {
      if (p.ep_overlap && o.f_local >= 0 && o.b_local >= 0) {  // combined 1F1B: the pair may overlap
        b.add_overlap(r, {ir::stage_filter(o.f_local * p.pp + r, o.f_mb, ir::Pass::kF),
                          ir::stage_filter(o.b_local * p.pp + r, o.b_mb, ir::Pass::kBW)});
        continue;
      }
      if (o.f_local >= 0) b.add(r, o.f_local * p.pp + r, ir::Pass::kF, o.f_mb);
      if (o.b_local >= 0) b.add(r, o.b_local * p.pp + r, ir::Pass::kBW, o.b_mb);
    }
  }
  return b.finish();
}

}  // namespace piper::schedules
