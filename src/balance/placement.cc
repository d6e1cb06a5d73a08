#include "piper/balance/placement.h"

#include <algorithm>
#include <string>

#include "piper/base/check.h"

namespace piper::balance {

Status ExpertPlacement::validate() const {
  const std::string fix = "; describe the layer as num_ranks x slots_per_rank slots holding every expert once";
  if (num_experts <= 0)
    return invalid_argument("placement: num_experts=" + std::to_string(num_experts) + " must be positive" + fix);
  if (num_ranks <= 0 || slots_per_rank <= 0) {
    return invalid_argument("placement: num_ranks=" + std::to_string(num_ranks) +
                            " and slots_per_rank=" + std::to_string(slots_per_rank) + " must be positive" + fix);
  }
  if (ep_group_size <= 0 || num_ranks % ep_group_size != 0) {
    return invalid_argument("placement: ep_group_size=" + std::to_string(ep_group_size) +
                            " must be positive and divide num_ranks=" + std::to_string(num_ranks));
  }
  if (static_cast<int>(slot_expert.size()) != num_slots()) {
    return invalid_argument("placement: slot_expert has " + std::to_string(slot_expert.size()) +
                            " entries, expected num_ranks*slots_per_rank=" + std::to_string(num_slots()));
  }
  std::vector<int> seen(num_experts, -1);
  for (int s = 0; s < num_slots(); ++s) {
    const int e = slot_expert[s];
    if (e == kFreeSlot) continue;
    if (e < 0 || e >= num_experts) {
      return invalid_argument("placement: slot " + std::to_string(s) + " holds expert " + std::to_string(e) +
                              ", outside [0, " + std::to_string(num_experts) + "); use -1 for a free slot");
    }
    if (seen[e] != -1) {
      return invalid_argument("placement: expert " + std::to_string(e) + " sits in slots " + std::to_string(seen[e]) +
                              " and " + std::to_string(s) + "; replicas are not supported, keep one slot");
    }
    seen[e] = s;
  }
  for (int e = 0; e < num_experts; ++e) {
    if (seen[e] == -1) {
      return invalid_argument("placement: expert " + std::to_string(e) + " has no slot; every expert needs one");
    }
  }
  return ok_status();
}

std::vector<int> ExpertPlacement::expert_slot() const {
  std::vector<int> slot(num_experts, -1);
  for (int s = 0; s < num_slots(); ++s) {
    if (slot_expert[s] != kFreeSlot) slot[slot_expert[s]] = s;
  }
  return slot;
}

std::vector<int> ExpertPlacement::expert_rank() const {
  std::vector<int> rank = expert_slot();
  for (int& r : rank) r = rank_of_slot(r);
  return rank;
}

Result<ExpertPlacement> ExpertPlacement::contiguous(int num_experts, int num_ranks, int slots_per_rank,
                                                    int ep_group_size) {
  if (num_ranks <= 0 || num_experts <= 0 || num_experts % num_ranks != 0) {
    return invalid_argument("placement: num_ranks=" + std::to_string(num_ranks) +
                            " must divide num_experts=" + std::to_string(num_experts) + " for a contiguous layout");
  }
  const int per_rank = num_experts / num_ranks;
  if (per_rank > slots_per_rank) {
    return invalid_argument("placement: " + std::to_string(per_rank) +
                            " experts per rank do not fit in slots_per_rank=" + std::to_string(slots_per_rank));
  }
  ExpertPlacement p;
  p.num_experts = num_experts;
  p.num_ranks = num_ranks;
  p.slots_per_rank = slots_per_rank;
  p.ep_group_size = ep_group_size;
  p.slot_expert.assign(static_cast<size_t>(num_ranks) * slots_per_rank, kFreeSlot);
  for (int e = 0; e < num_experts; ++e) p.slot_expert[(e / per_rank) * slots_per_rank + e % per_rank] = e;
  PIPER_RETURN_IF_ERROR(p.validate());
  return p;
}

bool operator==(const ExpertPlacement& a, const ExpertPlacement& b) {
  return a.num_experts == b.num_experts && a.num_ranks == b.num_ranks && a.slots_per_rank == b.slots_per_rank &&
         a.ep_group_size == b.ep_group_size && a.slot_expert == b.slot_expert;
}

Result<std::vector<int64_t>> rank_tokens(const ExpertPlacement& placement, const std::vector<int64_t>& expert_tokens) {
  if (static_cast<int>(expert_tokens.size()) != placement.num_experts) {
    return invalid_argument("rank_tokens: got token counts for " + std::to_string(expert_tokens.size()) +
                            " experts, the placement has " + std::to_string(placement.num_experts));
  }
  std::vector<int64_t> load(placement.num_ranks, 0);
  for (int s = 0; s < placement.num_slots(); ++s) {
    const int e = placement.slot_expert[s];
    if (e == kFreeSlot) continue;
    if (expert_tokens[e] < 0) {
      return invalid_argument("rank_tokens: expert " + std::to_string(e) + " has a negative token count " +
                              std::to_string(expert_tokens[e]));
    }
    load[placement.rank_of_slot(s)] += expert_tokens[e];
  }
  return load;
}

double imbalance(const std::vector<int64_t>& rank_tokens) {
  if (rank_tokens.empty()) return 1.0;
  int64_t total = 0;
  int64_t max_load = 0;
  for (int64_t t : rank_tokens) {
    total += t;
    max_load = std::max(max_load, t);
  }
  if (total == 0) return 1.0;
  return static_cast<double>(max_load) * static_cast<double>(rank_tokens.size()) / static_cast<double>(total);
}

int count_moved_experts(const ExpertPlacement& before, const ExpertPlacement& after) {
  PIPER_CHECK(before.num_experts == after.num_experts, "placements of different layers");
  const std::vector<int> a = before.expert_rank();
  const std::vector<int> b = after.expert_rank();
  int moved = 0;
  for (int e = 0; e < before.num_experts; ++e) moved += a[e] != b[e] ? 1 : 0;
  return moved;
}

ExpertPlacement keep_stayers_in_place(const ExpertPlacement& before, const ExpertPlacement& after) {
  PIPER_CHECK(before.num_slots() == after.num_slots() && before.slots_per_rank == after.slots_per_rank,
              "placements of different shapes");
  const std::vector<int> before_rank = before.expert_rank();
  const std::vector<int> before_slot = before.expert_slot();
  ExpertPlacement out = after;
  std::fill(out.slot_expert.begin(), out.slot_expert.end(), kFreeSlot);
  const int spr = after.slots_per_rank;
  for (int r = 0; r < after.num_ranks; ++r) {
    std::vector<int> arrivals;
    for (int s = r * spr; s < (r + 1) * spr; ++s) {
      const int e = after.slot_expert[s];
      if (e == kFreeSlot) continue;
      if (before_rank[e] == r) {
        out.slot_expert[before_slot[e]] = e;
      } else {
        arrivals.push_back(e);
      }
    }
    size_t next = 0;
    for (int s = r * spr; s < (r + 1) * spr && next < arrivals.size(); ++s) {
      if (out.slot_expert[s] == kFreeSlot) out.slot_expert[s] = arrivals[next++];
    }
    PIPER_CHECK(next == arrivals.size(), "rank ", r, " has more experts than slots");
  }
  return out;
}

}  // namespace piper::balance
