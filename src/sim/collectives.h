// Collectives decomposed into flows on a Network, added to a FlowSim.
//
// Every function validates the group (devices in range, no duplicates, sizes), adds the flows of one collective
// and returns their ids; the collective completes when its last flow does (finish_time_s). `start.after` lists
// flows every first-step flow waits for and `start.release_s` the earliest start, so collectives chain and
// overlap freely in one FlowSim (that is how contention between, say, EP all-to-all and DP all-reduce shows).
// Each flow pays its path's latency (alpha) once.
//
// Algorithms (n = group size, `bytes` = the per-rank buffer unless noted):
//   ring_reduce_scatter / ring_all_gather: n-1 steps; in step k rank i sends bytes/n to rank i+1 once it has
//     received step k-1 from rank i-1. ring_all_reduce = reduce-scatter then all-gather (2(n-1) steps), so on
//     uniform links it takes 2(n-1)/n * bytes/bw + 2(n-1) * alpha.
//   all_to_all_flat: every rank sends bytes_matrix[i][j] to every other rank j at once (pairwise, one flow each).
//   all_to_all_halo: the hierarchical all-to-all, for a group spread evenly over nodes (k members per node; the
//     member's local index is its position among its node's members). Phase I: same-node traffic directly.
//     Phase II (concurrent with I): member (node a, index i) sends everything it has for node b, batched, to the
//     member (node b, index i) of the same rail. Phase III (after all of that member's phase II arrivals): member
//     (b, i) scatters to each member (b, j) what came for it. Bytes on a pair are summed per phase.
//   m2n: senders[m] sends bytes_matrix[m][r] to receivers[r], all at once (attention -> expert groups).
//   p2p: one flow.
// A zero-byte entry adds no flow. Thread-safety: none (mutates the FlowSim).
#pragma once

#include <vector>

#include "piper/base/status.h"
#include "piper/sim/flow_sim.h"
#include "piper/sim/network.h"

namespace piper::sim {

struct CollectiveStart {
  double release_s = 0;
  std::vector<int> after;
};

struct CollectiveFlows {
  std::vector<int> flows;                // every flow of the collective
  std::vector<std::vector<int>> phases;  // HALO: flows of phases I, II, III; ring: one entry per step
};

// Latest completion among the collective's flows (its release time when it has none).
double finish_time_s(const std::vector<double>& completion_s, const CollectiveFlows& c, double release_s = 0);

Result<CollectiveFlows> add_p2p(const Network& net, FlowSim* sim, int src, int dst, double bytes,
                                const CollectiveStart& start = {});
Result<CollectiveFlows> add_ring_reduce_scatter(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                                double bytes, const CollectiveStart& start = {});
Result<CollectiveFlows> add_ring_all_gather(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            double bytes, const CollectiveStart& start = {});
Result<CollectiveFlows> add_ring_all_reduce(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            double bytes, const CollectiveStart& start = {});
// bytes_matrix[i][j]: bytes rank i sends to rank j (the diagonal stays local and adds no flow).
Result<CollectiveFlows> add_all_to_all_flat(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            const std::vector<std::vector<double>>& bytes_matrix,
                                            const CollectiveStart& start = {});
Result<CollectiveFlows> add_all_to_all_halo(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            const std::vector<std::vector<double>>& bytes_matrix,
                                            const CollectiveStart& start = {});
Result<CollectiveFlows> add_m2n(const Network& net, FlowSim* sim, const std::vector<int>& senders,
                                const std::vector<int>& receivers, const std::vector<std::vector<double>>& bytes_matrix,
                                const CollectiveStart& start = {});

// bytes_matrix for a uniform all-to-all: every rank sends bytes_per_rank / n to every rank (itself included).
std::vector<std::vector<double>> uniform_all_to_all(int n, double bytes_per_rank);

}  // namespace piper::sim
