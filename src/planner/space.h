// The strategy space the planner searches, and the rules that prune it.
//
// A candidate is one point of the cross product of these dimensions (outermost first):
//   tp  ∈ divisors of the world, <= max_tp (default: devices per node, so TP never crosses the NICs)
//   pp  ∈ divisors of world/tp, <= num_layers           dp = world / (tp * pp)
//   ep  ∈ divisors of num_experts ({1} for a dense model)
//   etp ∈ {1, tp}   sp ∈ {0, 1}   mbs ∈ space.mbs      microbatches = global_batch / (dp * mbs)
//   (schedule, vpp) ∈ {1f1b, gpipe, zb-h1, dualpipev} x {1}  ∪  {interleaved} x space.vpp
//   zero ∈ space.zero   recompute ∈ space.recompute   a2a ∈ {flat, halo}   order ∈ space.orders
// The (tp, pp, ep) triples are the work items the threads share. Inside an item the remaining dimensions form
// a fixed-size block, so every candidate has a stable index (item, offset) that breaks ties deterministically.
//
// Rules reject candidates that Strategy::validate_for would reject (each names the broken constraint) and
// candidates that are exact duplicates of an earlier one (a2a or mesh order that cannot matter because the axis
// has size 1). They never reject a valid, distinct strategy, so the search returns the same optimum as
// scoring every candidate (tests/planner/search_test.cc checks this against brute_force()).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "piper/spec/cluster_spec.h"
#include "piper/spec/model_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::planner {

struct SearchSpace {
  std::vector<int> mbs = {1, 2, 4, 8};
  std::vector<int> vpp = {2, 4};  // virtual stages tried with schedule=interleaved
  std::vector<std::string> schedules = {"1f1b", "gpipe", "interleaved", "zb-h1", "dualpipev"};
  std::vector<int> zero = {0, 1, 2, 3};
  std::vector<Recompute> recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  std::vector<std::string> a2a = {"flat", "halo"};
  // Mesh orders, innermost first. TP stays innermost (its collectives are on the critical path every layer);
  // the others are the six placements of ep, dp and pp around it.
  std::vector<std::vector<std::string>> orders = {{"tp", "ep", "dp", "pp"}, {"tp", "ep", "pp", "dp"},
                                                  {"tp", "dp", "ep", "pp"}, {"tp", "dp", "pp", "ep"},
                                                  {"tp", "pp", "ep", "dp"}, {"tp", "pp", "dp", "ep"}};
  int max_tp = 0;          // 0 = devices per node
  int max_ep = 0;          // 0 = num_experts (every divisor of the expert count)
  bool search_etp = true;  // also try etp = tp (experts tensor-sliced) when tp > 1
};

// Rule names, in the order they are checked. kMemory is the memory model's verdict (the largest pipeline rank
// does not fit in device memory); kInvalid counts anything validate_for still rejects (should stay 0: a rule
// is missing if not).
enum class Rule {
  kTpDividesHeads,
  kEpDividesDp,
  kSpNeedsTp,
  kMoeTpNeedsSp,
  kStagesExceedLayers,
  kBatchDivisibility,
  kMicrobatchesLtPp,
  kDualPipeVMicrobatches,
  kInterleavedMicrobatches,
  kDuplicateA2a,
  kDuplicateOrder,
  kEpOutsideDomain,  // a multi-node scale-up domain (NVL72) could hold the EP groups, this mesh order spreads them
  kMemory,
  kInvalid,
};
inline constexpr int kNumRules = 14;
const char* to_string(Rule rule);
using RuleCounts = std::array<int64_t, kNumRules>;

// The dimension lists resolved for one model, cluster and global batch.
struct ResolvedSpace {
  struct Item {
    int tp, pp, ep;
  };
  struct ScheduleChoice {
    std::string schedule;
    int vpp;
  };
  std::vector<Item> items;  // (tp, pp, ep) work items, in enumeration order
  std::vector<ScheduleChoice> schedules;
  std::vector<int> sp = {0, 1};
  SearchSpace space;
  int world = 1;
  int64_t global_batch = 1;

  // Candidates in one item (the etp list depends on tp) and in the whole space.
  int64_t etp_count(int tp) const { return tp > 1 && space.search_etp ? 2 : 1; }
  int64_t inner_block() const;  // candidates per (etp) value: sp x mbs x schedules x zero x recompute x a2a x order
  int64_t item_size(const Item& item) const { return etp_count(item.tp) * inner_block(); }
  int64_t total() const;
};

// Checks the space (non-empty lists, known schedules, positive values, orders that are permutations).
Result<ResolvedSpace> resolve_space(const SearchSpace& space, const ModelSpec& model, const ClusterSpec& cluster,
                                    int64_t global_batch);

}  // namespace piper::planner
