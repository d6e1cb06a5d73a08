// AF-Pipe (DisagMoE): attention and FFN/expert work live on disjoint worker groups. With g = p/2, ranks
// 0..g-1 are attention (A) workers and g..p-1 FFN (F) workers; the model is cut into p*v stages that alternate
// A, F, A, F, ... and are dealt round-robin to the groups (stage j on A rank (j/2) mod g when j is even, on
// F rank g + (j/2) mod g when odd), so every worker holds v stages of its own kind. The A->F and F->A hops are
// the M2N exchanges that the full IR lowers to m2n nodes on a communication stream.
// Order: the interleaved op sequence for the rank's position on the chain; in the steady state each
// (forward, backward) pair is one "may overlap" slot, since forward and backward run on their own streams.
#include "interleaved.h"

namespace piper::schedules {

Result<std::vector<ir::Directive>> af_pipe_schedule(const ScheduleParams& p) {
  if (p.pp < 2 || p.pp % 2 != 0) {
    return invalid_argument("af-pipe needs an even pp >= 2 (half attention, half FFN workers); got pp=" +
                            std::to_string(p.pp));
  }
  const int g = p.pp / 2;
  // Position q on the chain (stage j has position j mod p) -> rank.
  auto rank_of_pos = [&](int q) { return q % 2 == 0 ? q / 2 : g + q / 2; };
  ScheduleBuilder b(p.pp);
  for (int s = 0; s < p.pp * p.vpp; ++s) b.place(s, rank_of_pos(s % p.pp));
  for (int q = 0; q < p.pp; ++q) {
    const int r = rank_of_pos(q);
    PIPER_ASSIGN_OR_RETURN(auto ops, interleaved_ops(p.pp, p.vpp, p.microbatches, q));
    for (const auto& o : ops) {
      int fs = o.f_local * p.pp + q, bs = o.b_local * p.pp + q;
      if (o.f_local >= 0 && o.b_local >= 0) {
        b.add_overlap(r, {ir::stage_filter(fs, o.f_mb, ir::Pass::kF), ir::stage_filter(bs, o.b_mb, ir::Pass::kBW)});
      } else if (o.f_local >= 0) {
        b.add(r, fs, ir::Pass::kF, o.f_mb);
      } else {
        b.add(r, bs, ir::Pass::kBW, o.b_mb);
      }
    }
  }
  return b.finish();
}

}  // namespace piper::schedules
