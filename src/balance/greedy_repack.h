// Greedy repacking from scratch: the baseline the migration planner is measured against.
//
// Like DeepSeek's EPLB `balanced_packing` without replicas: inside each EP group, visit the group's experts by
// load, heaviest first (ties: lower expert index), and put each on the least-loaded rank that still has a free
// slot (ties: lower rank). The current placement only fixes the shape and which experts belong to which group;
// the result ignores where experts live now, so almost every expert moves.
// greedy_repack_min_moves keeps the same packs but gives each pack to the rank of its group that already holds
// most of its experts (greedy maximum-overlap matching, ties by index; the permutation step suggested in
// deepseek-ai/EPLB#25), so it is the from-scratch balance with fewer moves.
#pragma once

#include <cstdint>
#include <vector>

#include "piper/balance/placement.h"
#include "piper/base/status.h"

namespace piper::balance {

Result<ExpertPlacement> greedy_repack(const std::vector<int64_t>& expert_tokens, const ExpertPlacement& current);
Result<ExpertPlacement> greedy_repack_min_moves(const std::vector<int64_t>& expert_tokens,
                                                const ExpertPlacement& current);

}  // namespace piper::balance
