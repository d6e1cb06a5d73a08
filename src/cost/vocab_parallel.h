// The vocabulary-parallel cross-entropy's exchange over tp, priced for the simulator.
//
// A head split over tp (vocabulary parallelism: Megatron's vocab_parallel_cross_entropy, the CPU runtime's
// model/chunks/head.cc) needs the whole vocabulary's max logit, sum of exponentials and the target's logit per
// token: the runtime all-gathers those 3 floats per token over the tp group once per head F (Megatron runs three
// all-reduces of one float per token, the same latency-bound size class). No plan instruction carries it; the
// simulator adds it to the head F's task time (sim/task_time.cc), as it blocks the compute stream.
#pragma once

#include "piper/cost/estimate.h"
#include "piper/strategy/strategy.h"

namespace piper::cost {

// Bytes one tensor rank contributes per token.
inline constexpr double kVocabStatsBytesPerToken = 3 * 4;

// Seconds of one exchange for a microbatch of `tokens` tokens on `s`'s tp group as the closed form lays it out
// (its mesh order); 0 when tp = 1.
double vocab_stats_exchange_s(const CostModel& cm, const Strategy& s, double tokens);

}  // namespace piper::cost
