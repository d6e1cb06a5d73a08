// AF-Pipe (DisagMoE): attention and FFN/expert work live on disjoint worker groups. With g = p/2, ranks
// 0..g-1 are attention (A) workers and g..p-1 FFN (F) workers; the model is cut into p*v stages that alternate
// A, F, A, F, ... and are dealt round-robin to the groups (stage j on A rank (j/2) mod g when j is even, on
// F rank g + (j/2) mod g when odd), so every worker holds v stages of its own kind. The A->F and F->A hops are
// the M2N exchanges that the full IR lowers to m2n nodes on a communication stream.
// Order: the interleaved op sequence for the rank's position on the chain; in the steady state each
// (forward, backward) pair is one "may overlap" slot, since forward and backward run on their own streams.
//
// Unequal groups (ScheduleParams::attn_groups = a != p/2, DisagMoE's uneven GPU split with every pipeline rank
// of the same width): stage 2l on A rank l mod a, stage 2l+1 on F rank a + l mod (p - a). The chain no longer
// visits the ranks periodically, so each rank's row is the projection of one global order of whole-chain
// passes (also for equal groups when the microbatches are not whole rounds of pp, which the interleaved rule
// needs), w = min(m, p) forwards first, then (backward of k, forward of k + w) until the end: a linear extension
// of the dependencies, hence deadlock-free on every rank, with at most w microbatches in flight.
#include <algorithm>

#include "interleaved.h"

namespace piper::schedules {
namespace {

Result<std::vector<ir::Directive>> af_pipe_chain(const ScheduleParams& p) {
  const int a = p.attn_groups > 0 ? p.attn_groups : p.pp / 2, f = p.pp - a;
  const int stages = p.stages > 0 ? p.stages : p.pp * p.vpp;
  if (a < 1 || f < 1) {
    return invalid_argument("af-pipe: attn_groups=" + std::to_string(a) + " leaves " + std::to_string(f) +
                            " FFN ranks of pp=" + std::to_string(p.pp) + "; both groups need a rank");
  }
  if (stages % 2 != 0 || stages / 2 < std::max(a, f)) {
    return invalid_argument("af-pipe: " + std::to_string(stages) + " stages (attention and FFN of " +
                            std::to_string(stages / 2) + " layers) cannot give each of " + std::to_string(a) +
                            " attention and " + std::to_string(f) + " FFN ranks a layer; use fewer ranks");
  }
  auto rank_of = [&](int s) { return s % 2 == 0 ? (s / 2) % a : a + (s / 2) % f; };
  ScheduleBuilder b(p.pp);
  for (int s = 0; s < stages; ++s) b.place(s, rank_of(s));
  auto forward = [&](int mb) {
    for (int s = 0; s < stages; ++s) b.add(rank_of(s), s, ir::Pass::kF, mb);
  };
  auto backward = [&](int mb) {
    for (int s = stages - 1; s >= 0; --s) b.add(rank_of(s), s, ir::Pass::kBW, mb);
  };
  const int warm = std::min(p.microbatches, p.pp);
  for (int mb = 0; mb < warm; ++mb) forward(mb);
  for (int k = 0; k < p.microbatches; ++k) {
    backward(k);
    if (k + warm < p.microbatches) forward(k + warm);
  }
  return b.finish();
}

}  // namespace

Result<std::vector<ir::Directive>> af_pipe_schedule(const ScheduleParams& p) {
  if (p.attn_groups > 0 && 2 * p.attn_groups != p.pp) return af_pipe_chain(p);
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
    auto interleaved = interleaved_ops(p.pp, p.vpp, p.microbatches, q);
    // The interleaved rule needs the microbatches in whole rounds of pp; any other count runs the chain order.
    if (!interleaved.ok()) return af_pipe_chain(p);
    const auto& ops = *interleaved;
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
