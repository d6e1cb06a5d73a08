#include "piper/balance/greedy_repack.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace piper::balance {
namespace {

Status check_inputs(const std::vector<int64_t>& expert_tokens, const ExpertPlacement& current) {
  PIPER_RETURN_IF_ERROR(current.validate());
  if (static_cast<int>(expert_tokens.size()) != current.num_experts) {
    return invalid_argument("greedy repack: got token counts for " + std::to_string(expert_tokens.size()) +
                            " experts, the placement has " + std::to_string(current.num_experts));
  }
  for (size_t e = 0; e < expert_tokens.size(); ++e) {
    if (expert_tokens[e] < 0) {
      return invalid_argument("greedy repack: expert " + std::to_string(e) + " has a negative token count");
    }
  }
  return ok_status();
}

// Packs of one group: pack_experts[p] lists the experts given to the group's p-th rank, in packing order.
std::vector<std::vector<int>> pack_group(const std::vector<int64_t>& expert_tokens, const ExpertPlacement& current,
                                         int group) {
  const int first_rank = group * current.ep_group_size;
  std::vector<int> experts;
  for (int s = first_rank * current.slots_per_rank; s < (first_rank + current.ep_group_size) * current.slots_per_rank;
       ++s) {
    if (current.slot_expert[s] != kFreeSlot) experts.push_back(current.slot_expert[s]);
  }
  std::stable_sort(experts.begin(), experts.end(), [&](int a, int b) {
    return expert_tokens[a] != expert_tokens[b] ? expert_tokens[a] > expert_tokens[b] : a < b;
  });
  std::vector<std::vector<int>> packs(current.ep_group_size);
  std::vector<int64_t> load(current.ep_group_size, 0);
  for (int e : experts) {
    int best = -1;
    for (int p = 0; p < current.ep_group_size; ++p) {
      if (static_cast<int>(packs[p].size()) >= current.slots_per_rank) continue;
      if (best == -1 || load[p] < load[best]) best = p;
    }
    packs[best].push_back(e);  // a slot is free somewhere: the group holds at most its slot count
    load[best] += expert_tokens[e];
  }
  return packs;
}

void write_pack(const std::vector<int>& pack, int rank, ExpertPlacement* out) {
  for (size_t i = 0; i < pack.size(); ++i) out->slot_expert[rank * out->slots_per_rank + i] = pack[i];
}

}  // namespace

Result<ExpertPlacement> greedy_repack(const std::vector<int64_t>& expert_tokens, const ExpertPlacement& current) {
  PIPER_RETURN_IF_ERROR(check_inputs(expert_tokens, current));
  ExpertPlacement out = current;
  std::fill(out.slot_expert.begin(), out.slot_expert.end(), kFreeSlot);
  for (int g = 0; g < current.num_groups(); ++g) {
    std::vector<std::vector<int>> packs = pack_group(expert_tokens, current, g);
    for (int p = 0; p < current.ep_group_size; ++p) write_pack(packs[p], g * current.ep_group_size + p, &out);
  }
  return out;
}

Result<ExpertPlacement> greedy_repack_min_moves(const std::vector<int64_t>& expert_tokens,
                                                const ExpertPlacement& current) {
  PIPER_RETURN_IF_ERROR(check_inputs(expert_tokens, current));
  const std::vector<int> rank_of = current.expert_rank();
  const int n = current.ep_group_size;
  ExpertPlacement out = current;
  std::fill(out.slot_expert.begin(), out.slot_expert.end(), kFreeSlot);
  for (int g = 0; g < current.num_groups(); ++g) {
    std::vector<std::vector<int>> packs = pack_group(expert_tokens, current, g);
    // overlap[p][r]: experts of pack p already on the group's rank r.
    std::vector<std::vector<int>> overlap(n, std::vector<int>(n, 0));
    for (int p = 0; p < n; ++p) {
      for (int e : packs[p]) ++overlap[p][rank_of[e] - g * n];
    }
    std::vector<int> pack_rank(n, -1);
    std::vector<bool> rank_taken(n, false);
    for (int round = 0; round < n; ++round) {
      int best_p = -1, best_r = -1;
      for (int p = 0; p < n; ++p) {
        if (pack_rank[p] != -1) continue;
        for (int r = 0; r < n; ++r) {
          if (rank_taken[r]) continue;
          if (best_p == -1 || overlap[p][r] > overlap[best_p][best_r]) best_p = p, best_r = r;
        }
      }
      pack_rank[best_p] = best_r;
      rank_taken[best_r] = true;
    }
    for (int p = 0; p < n; ++p) write_pack(packs[p], g * n + pack_rank[p], &out);
  }
  return keep_stayers_in_place(current, out);
}

}  // namespace piper::balance
