// Pipeline schedules in closed form: which stages a rank holds, how many microbatch activations it keeps in
// flight, and the bubble (idle time) of one step. Sources: /work/shared/reference/schedules.md §1, §3.
//
// Notation: p = pp ranks, m = microbatches, v = chunks per rank, r = rank (0 = first). t_f, t_b = t_i + t_w
// are one microbatch's forward and backward times on a rank (all its chunks together).
//   schedule     stages of rank r         in flight (chunk-microbatch units)          bubble
//   gpipe        r                         m                                          (p-1)(t_f+t_b)
//   1f1b         r                         min(p-r, m)                                (p-1)(t_f+t_b)
//   interleaved  r, r+p, ..., r+(v-1)p     min(2(p-r-1) + (v-1)p + 1, m v)  (Megatron) (p-1)(t_f+t_b)/v
//   zb-h1        r                         min(p, m) + W-deferred min(r+1, m)         (p-1)(t_f+t_b-2t_w)
//   dualpipev    r, 2p-1-r                 min(2p+1, 2m) half-stage units             (p-1)(t_f/2+t_b-3t_w/2)
//   af-pipe      r                         min(p-r, m) + 1 (the M2N stage's slot)     (p-1)(t_f+t_b)/4
// The interleaved count gives the 1F1B peak times (1 + (p-1)/(p v)); dualpipev's is DualPipe's "PP+1" with
// PP = 2p half-size stages. The dualpipev bubble is DualPipe's (PP/2-1)(T_F&B + T_B - 3T_W) with half-stage
// times (T_F&B = (t_f+t_b)/2, T_B = t_b/2, T_W = t_w/2). The af-pipe bubble is DisagMoE's "about a quarter of
// the 1F1B warm-up" [secondary]. Negative bubbles (W larger than F + I) clamp to 0.
// ZB-H1 rank r runs W of microbatch j after B of j+r (reference/schedules.md 3.4), so a microbatch's stash lives
// until its W: at rank r's first W, p forwards are done and none released (the schedule simulator's
// peak_inflight_microbatches; schedules.md §1's p·M_B), and r+1 microbatches hold their B -> W gradients.
#pragma once

#include "piper/strategy/strategy.h"

namespace piper::cost {

// Stage index (0 .. p*v-1) of chunk c (0 .. v-1) on rank r.
int stage_of_chunk(ScheduleKind kind, int pp, int chunks_per_rank, int rank, int chunk);

// Chunk-microbatch activation units rank r keeps at its peak (see the table above).
double in_flight_units(ScheduleKind kind, int pp, int microbatches, int chunks_per_rank, int rank);

// The share of those units that chunk c (0 .. v-1) of rank r holds. DualPipeV is asymmetric: rank r runs
// 2(p-r-1) + (r+1) forwards of its first chunk before its second chunk's first backward, so chunk 0 holds
// 2p-r units (one of them the overlapped F&B pair) and chunk 1 holds r+1 (rank 0's head chunk: one). The
// other schedules spread their units evenly over the chunks.
double chunk_in_flight_units(ScheduleKind kind, int pp, int microbatches, int chunks_per_rank, int rank, int chunk);

// Microbatches of rank r whose W is deferred (B done, W not) at the rank's peak: zb-h1 min(r+1, m); 0 for the
// schedules with a fused backward. DualPipeV's zero-bubble steps are not at its activation peak; the estimate
// takes the maximum over its phases (docs/resource_model.md).
double deferred_w_units(ScheduleKind kind, int pp, int microbatches, int rank);

// Idle time of one step on the bottleneck rank.
double bubble_time_s(ScheduleKind kind, int pp, int chunks_per_rank, double t_f, double t_b, double t_w);

// bubble / (m (t_f + t_b) + bubble): the fraction of a step spent idle.
double bubble_fraction(ScheduleKind kind, int pp, int microbatches, int chunks_per_rank, double t_f, double t_b,
                       double t_w);

}  // namespace piper::cost
