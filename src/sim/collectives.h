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
//     uniform links it takes 2(n-1)/n * bytes/bw + 2(n-1) * alpha. Rings of more than kMaxRingStages steps run
//     as kMaxRingStages stages of g = ceil((n-1) / kMaxRingStages) consecutive steps (g * bytes/n and g * alpha
//     per flow): the same time on constant-rate links, ~16x fewer flow events for n = 1,024.
//   all_to_all_flat: every rank sends bytes_matrix[i][j] to every other rank j at once (pairwise, one flow each).
//   halo_traffic: the messages of the runtime's hierarchical all-to-all (comm/algorithms/halo_engine.h) as the
//     one HALO model computes them (cost/halo_traffic.h: MoE dispatch and combine with node deduplication, or a
//     plain all-to-all-v), for a group laid out node-major (ranks n*k .. n*k+k-1 on one node). Phase I: same-node
//     blocks go directly, and each rank sends its piece for remote node m to its lane's send proxy for m (gather).
//     Phase II: each send proxy sends one batch to the receive proxy on m once its gather is complete. Phase III:
//     the receive proxy sends each other rank of m its part of the batch once the batch has arrived. Proxies
//     follow HaloLayout (= comm::NodeTopology).
//   tree_all_reduce: a binary tree over the group order (parent of i is (i-1)/2, root devices[0]), the buffer cut
//     into `chunks` pieces that are pipelined: a rank sends chunk j up once chunk j arrived from all its children
//     (and after its chunk j-1); the root sends chunk j down once it has all of it, every rank forwards it down
//     once received (in chunk order). One tree, not NCCL's double tree: inner ranks' ports carry both directions.
//   m2n: senders[m] sends bytes_matrix[m][r] to receivers[r], all at once (attention -> expert groups).
//   ring_shift: every rank sends `bytes` to its ring successor at once (one step of a ring; the all-gather
//     pieces of tp_overlap's ring exchange, compile/lower.h, algorithm "ring_step").
//   p2p: one flow.
// A zero-byte entry adds no flow. Thread-safety: none (mutates the FlowSim).
#pragma once

#include <vector>

#include "piper/base/status.h"
#include "piper/cost/halo_traffic.h"
#include "piper/sim/flow_sim.h"
#include "piper/sim/network.h"

namespace piper::sim {

// Ring collectives with more steps than this are simulated in this many stages (see above).
inline constexpr int kMaxRingStages = 64;

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
Result<CollectiveFlows> add_ring_shift(const Network& net, FlowSim* sim, const std::vector<int>& devices, double bytes,
                                       const CollectiveStart& start = {});
Result<CollectiveFlows> add_tree_all_reduce(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            double bytes, int chunks, const CollectiveStart& start = {});
// bytes_matrix[i][j]: bytes rank i sends to rank j (the diagonal stays local and adds no flow).
Result<CollectiveFlows> add_all_to_all_flat(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            const std::vector<std::vector<double>>& bytes_matrix,
                                            const CollectiveStart& start = {});
// The proxies of a HALO group; the same formulas as the runtime's comm::NodeTopology (a test checks it).
struct HaloLayout {
  int ranks_per_node = 1;
  int lanes = 1;
  int lane_width() const { return ranks_per_node / lanes; }
  int lane_of(int local) const { return local / lane_width(); }
  int send_proxy(int src_node, int dst_node, int lane) const { return lane * lane_width() + dst_node % lane_width(); }
  int recv_proxy(int src_node, int dst_node, int lane) const { return lane * lane_width() + src_node % lane_width(); }
  // Checks that `devices` is node-major with the same count k per node and that lanes divides k.
  static Result<HaloLayout> of_group(const Network& net, const std::vector<int>& devices, int lanes);
};
// The messages of a HALO traffic model (cost/halo_traffic.h: the runtime's MoE dispatch or combine, in
// expectation over the routing) as flows, one per message: message rank i runs on devices[i] (node-major, as
// HaloLayout::of_group checks), a flow waits for the flows of its message's `after` list, and a message with none
// waits for start.after. phases: [0] phase I and the combine's steps before its exchange (direct, gather,
// remote_direct, slot_meta, to_reducer), [1] batches, [2] scatters.
Result<CollectiveFlows> add_halo_traffic(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                         const cost::HaloTraffic& traffic, const CollectiveStart& start = {});
Result<CollectiveFlows> add_m2n(const Network& net, FlowSim* sim, const std::vector<int>& senders,
                                const std::vector<int>& receivers, const std::vector<std::vector<double>>& bytes_matrix,
                                const CollectiveStart& start = {});

// Uniform all-to-all (every rank sends bytes_per_rank / n to every rank) simulated by one representative rank,
// devices[0]: one aggregate flow per class of identical flows, class = (node offset, local offset) in the
// node-major group. Inside a node a class flow crosses the representative's own ports (weight 1); across nodes it
// crosses the representative's NIC tx and rx (weight c = group ranks per used NIC) and the group fabric (weight
// n, all members). Needs: the same local devices on every node of the group, the same c on every used NIC, NICs
// of equal bandwidth, one fabric group, no per-pair matrix. Then every rank finishes when the representative
// does, and the time equals add_all_to_all_flat(uniform_all_to_all(...)) with n - 1 flows instead of n(n - 1).
Result<CollectiveFlows> add_all_to_all_uniform_aggregate(const Network& net, FlowSim* sim,
                                                         const std::vector<int>& devices, double bytes_per_rank,
                                                         const CollectiveStart& start = {});

// Parallel ring all-reduces, one per local device index in `locals`, each over the same `nodes` (the usual DP
// all-reduce: rank (node, g) talks to (next node, g)), simulated by the ring of locals[0] alone: one aggregate
// flow per ring step, waiting for its previous step, with weight c (rings per used NIC) on the NIC tx/rx and
// nodes x locals on the group fabric. Needs at least 2 nodes, the same c on every used NIC, NICs of equal
// bandwidth, one fabric group. Every ring finishes when the representative does; the time equals adding
// add_ring_all_reduce for every ring into one FlowSim, with 2(N-1) flows instead of 2(N-1) N |locals|.
Result<CollectiveFlows> add_parallel_rings_all_reduce_aggregate(const Network& net, FlowSim* sim,
                                                                const std::vector<int>& nodes,
                                                                const std::vector<int>& locals, double bytes,
                                                                const CollectiveStart& start = {});

// bytes_matrix for a uniform all-to-all: every rank sends bytes_per_rank / n to every rank (itself included).
std::vector<std::vector<double>> uniform_all_to_all(int n, double bytes_per_rank);

}  // namespace piper::sim
