// ExpertPlacement: where every logical expert of one MoE layer lives (logical expert -> physical slot -> rank).
//
// Slots are numbered rank-major: slot s lives on rank s / slots_per_rank. A slot holds one logical expert or is
// free (-1). Ranks are grouped into EP groups of ep_group_size consecutive ranks; an expert belongs to the group
// that holds it and never leaves it (migration runs point-to-point inside the EP group). Every logical expert
// appears exactly once (no replicas). When several EP groups replicate the same experts (dp > ep), all replicas
// keep one table: plan with the table of one group and the tokens summed over the replicas.
//
// Rank loads are token counts (int64) so that comparisons, ties and the planner are exact and deterministic.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <vector>

#include "piper/base/status.h"

namespace piper::balance {

inline constexpr int kFreeSlot = -1;

struct ExpertPlacement {
  int num_experts = 0;
  int num_ranks = 0;
  int slots_per_rank = 0;
  int ep_group_size = 0;         // ranks per EP group; must divide num_ranks
  std::vector<int> slot_expert;  // [num_ranks * slots_per_rank]: logical expert in each slot, kFreeSlot if free

  int num_slots() const { return num_ranks * slots_per_rank; }
  int rank_of_slot(int slot) const { return slot / slots_per_rank; }
  int group_of_rank(int rank) const { return rank / ep_group_size; }
  int num_groups() const { return num_ranks / ep_group_size; }

  // Checks the shape and that every expert in [0, num_experts) sits in exactly one slot.
  Status validate() const;
  // Inverse table: slot of every logical expert. Precondition: validate() is OK.
  std::vector<int> expert_slot() const;
  // Rank of every logical expert. Precondition: validate() is OK.
  std::vector<int> expert_rank() const;

  // num_experts / num_ranks experts per rank in index order (expert e on rank e / (E/R)), the remaining slots of
  // every rank free. Errors when num_ranks does not divide num_experts or the experts do not fit.
  static Result<ExpertPlacement> contiguous(int num_experts, int num_ranks, int slots_per_rank, int ep_group_size);
};

bool operator==(const ExpertPlacement& a, const ExpertPlacement& b);

// Tokens received by every rank: the sum of its experts' tokens. Errors when sizes disagree or a count is negative.
Result<std::vector<int64_t>> rank_tokens(const ExpertPlacement& placement, const std::vector<int64_t>& expert_tokens);

// max / mean over ranks; 1.0 (balanced) when every rank received nothing or the list is empty.
double imbalance(const std::vector<int64_t>& rank_tokens);

// Number of experts whose rank differs between two placements of the same shape (a move inside one rank costs no
// transfer and is not counted). Precondition: both valid, same num_experts.
int count_moved_experts(const ExpertPlacement& before, const ExpertPlacement& after);

// Returns `after` with every expert that stays on its rank put back into its slot of `before`, and the experts
// that arrive on a rank filling its remaining slots in their order in `after`. Same ranks, so the same moves,
// but no slot shuffles inside a rank. Precondition: both valid, same shape.
ExpertPlacement keep_stayers_in_place(const ExpertPlacement& before, const ExpertPlacement& after);

}  // namespace piper::balance
