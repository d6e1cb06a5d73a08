// Simulator refinement of the disaggregation allocator's answer (DisagMoE refines its MILP solution the same way):
// the roofline's best allocation, its best even one and a local search around the best, each compiled to the
// Strategy the compiler lowers and scored by the simulator.
//
// The compiler runs every pipeline rank of a plan on dp*tp ranks (compile/strategy_directives.h), so an
// allocation of `attn` attention GPUs (pp stages of dp_a) and `ffn` FFN GPUs runs as pp attention pipeline ranks
// and ffn / dp_a FFN pipeline ranks of dp_a ranks each, layers dealt round-robin to each side's ranks (an uneven
// split when ffn != attn). The experts of an FFN pipeline rank are sharded over ep' = gcd(ep, dp_a) of its ranks.
// The MILP's port (NIC) split is carried as Strategy::attn_ports / ffn_ports, which the simulator prices as each
// group's share of the NICs' bandwidth (cost/nic_split.h).
//
// Local search: from the best allocation, its neighbours are the candidates (AfModel::candidates) with the same
// pp and recomputation whose attention share is the next smaller or larger one, the same split with the other
// recomputation, and the same attention share with pp halved or doubled; the walk moves to the fastest simulated
// neighbour while it improves, until `max_simulations` have been spent. Each GPU-split neighbour runs at the port
// split the roofline prefers for it; the same GPU split with one node's NICs moved to the other group (each way)
// and with the natural split (each group the NICs of the nodes its GPUs fill) are neighbours too (not on one
// node, where the split is the GPUs' own links).
#pragma once

#include <string>
#include <vector>

#include "piper/planner/disaggregate.h"
#include "piper/planner/search.h"

namespace piper::planner {

// The Strategy the compiler lowers for `a` (see above), with mbs from the global batch; an error names why an
// allocation has none (ffn not a multiple of dp_a, the batch not a multiple of dp_a * microbatches).
Result<Strategy> compilable_af_strategy(const AfAllocation& a, const ModelSpec& model, const TrainSpec& train);

struct AfScored {
  std::string name;  // "best", "even", "local-search"
  AfAllocation alloc;
  Strategy strategy;
  double sim_step_s = 0;
  std::string why;  // not simulated: the reason
  bool simulated() const { return why.empty(); }
};

AfScored score_allocation(const std::string& name, const AfAllocation& a, const ModelSpec& model,
                          const ClusterSpec& cluster, const TrainSpec& train, const SearchOptions& options);

struct AfLocalSearch {
  AfScored best;        // the fastest simulated allocation the walk found (the start when none beat it)
  int simulations = 0;  // simulations spent (the start's included)
  int moves = 0;        // improving moves
  std::vector<AfScored> tried;
};

// The walk above from `start` (already scored). Candidates come from `model_af`.
AfLocalSearch af_local_search(const AfModel& model_af, const AfScored& start, const ModelSpec& model,
                              const ClusterSpec& cluster, const TrainSpec& train, const SearchOptions& options,
                              int max_simulations);

}  // namespace piper::planner
