// The one HALO traffic model: the messages the runtime's HALO MoE dispatch and combine (comm/algorithms/
// halo_dispatch.cc, moe_combine.cc, halo_engine.h) send for an expert-parallel group, in expectation over the
// routing. The simulator turns them into flows (sim/collectives.h add_halo_traffic) and the closed form prices
// them with its alpha-beta model (halo_traffic_time_s), so both value HALO from the same bytes and messages.
//
// Group: `nodes` x `ranks_per_node` ranks, node-major, split into `lanes` lanes per node (comm::NodeTopology: send
// proxy of (n -> m, lane l) = local l*W + m mod W, receive proxy = local l*W + n mod W, W = ranks_per_node / lanes).
// Experts: num_experts spread evenly and contiguously over the ranks (rank r holds experts [r E/P, (r+1) E/P)).
// Routing (expected, the same for every source rank and token): a token picks top_k distinct experts uniformly,
// or, with group-limited routing (DeepSeek-V3: num_groups = 8, topk_groups = 4), first topk_groups of num_groups
// contiguous expert groups uniformly, then top_k experts uniformly among the experts of those groups. Then
//   rows(s -> r)    = T k / P                     (every slot lands on each rank with probability 1/P)
//   hit(m)          = P(a token has a slot on node m)
//                   = 1 - C(E - E_m, k) / C(E, k)  with E_m = E / nodes experts per node (uniform routing);
//   group-limited:    1 - sum_{j,a} P(j chosen groups overlap node m with a experts) C(A - a, k) / C(A, k),
//                     A = topk_groups E / num_groups (a dynamic programme over the groups that overlap node m).
// Expected distinct destination nodes per token = sum_m hit(m) (unit-tested against enumeration of every routing).
//
// Dispatch (halo_dispatch: tokens of token_bytes, each deduplicated per destination node and followed by a
// ranks_per_node-byte multiplicity list), all posted at once:
//   phase I   kDirect  s -> every other rank h of its node: rows(s -> h) token_bytes
//             kGather  s -> its lane's send proxy for node m (when s is not that proxy): T hit(m) (token_bytes + G)
//   phase II  kBatch   send proxy (n -> m, l) -> receive proxy: the lane's pieces, after that proxy's gathers
//   phase III kScatter receive proxy -> every other rank h of node m: the rows of the lane's sources for h,
//                      after the batch
// Combine (halo_combine: rows of row_bytes; the slots of a token on a remote node m are reduced by the rank that
// scattered the token in the dispatch, the reducer of (s's node n, s's lane l) on m, before one partial per
// (token, node) goes back), every message point to point and posted at once but the partials:
//   kSlotMeta    s -> its reducer on each remote node m: T hit(m) top_k 8 bytes ((local rank, weight) per slot)
//   kToReducer   expert rank e -> the reducer on its node of each remote (node n, lane l): the W lane sources' rows
//                it holds, W rows(s -> e) row_bytes (contiguous in e's expert outputs: no packing)
//   kDirect      expert rank e -> each other source s of its node: rows(s -> e) row_bytes (raw rows, unreduced)
//   kPartial     reducer -> each source s of its group: T hit(m) row_bytes, after the group's kSlotMeta and
//                kToReducer messages (the reducer reduces a group as soon as they are in)
// Not modelled: the small count all-gathers before each exchange (metadata; latency only).
// Messages with no bytes are left out (the engine counts only non-empty messages, HaloExchangeStats).
// All functions are pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/status.h"

namespace piper::cost {

// The runtime's default direct-send threshold of the HALO all-to-all-v (comm::kDefaultHaloDirectPairBytes).
inline constexpr double kHaloDirectPairBytes = 64 * 1024;

struct HaloRouting {
  int num_experts = 1;
  int top_k = 1;
  int num_groups = 1;   // group-limited routing: experts in num_groups contiguous groups (1: none)
  int topk_groups = 1;  // groups a token may use
};

struct HaloGroupShape {
  int nodes = 1;
  int ranks_per_node = 1;
  int lanes = 1;  // divides ranks_per_node
  int size() const { return nodes * ranks_per_node; }
};

// Checks the shape and that the experts spread evenly (num_experts % size == 0, groups divide the experts,
// 1 <= top_k <= experts a token may use); errors name the value and the fix.
Status validate_halo(const HaloGroupShape& g, const HaloRouting& r);

// P(a token has at least one of its top_k slots on node m of g), for any source rank.
double halo_node_hit_probability(const HaloGroupShape& g, const HaloRouting& r, int node);
// Expected distinct nodes a token's slots reach (all nodes, the source's own included): sum_m hit(m).
double halo_expected_distinct_nodes(const HaloGroupShape& g, const HaloRouting& r);

enum class HaloStep {
  kDirect,        // phase I: to a rank of the same node
  kGather,        // phase I: to the lane's send proxy
  kBatch,         // phase II: send proxy -> receive proxy on another node
  kScatter,       // phase III: receive proxy -> ranks of its node
  kRemoteDirect,  // a large block between nodes sent straight (HALO all-to-all-v)
  kSlotMeta,      // combine: slot metadata to the reducers
  kToReducer,     // combine: expert rows to their reducer inside the node
  kPartial,       // combine: a reducer's partial sums to a source on another node
};
const char* to_string(HaloStep step);

struct HaloMessage {
  int src = 0, dst = 0;  // ranks of the group (node-major)
  double bytes = 0;
  HaloStep step = HaloStep::kDirect;
  std::vector<int> after;  // indices of earlier messages that must complete before this one is sent
};

struct HaloTraffic {
  std::vector<HaloMessage> messages;
  double bytes_inter = 0, bytes_intra = 0;  // totals over the group
  int64_t messages_inter = 0, messages_intra = 0;
};

// tokens_per_rank tokens of token_bytes each, dispatched by every rank of g.
Result<HaloTraffic> halo_dispatch_traffic(const HaloGroupShape& g, const HaloRouting& r, double tokens_per_rank,
                                          double token_bytes);
// The combine of those tokens' expert outputs, rows of row_bytes.
Result<HaloTraffic> halo_combine_traffic(const HaloGroupShape& g, const HaloRouting& r, double tokens_per_rank,
                                         double row_bytes);

// The HALO all-to-all-v of halo_all_to_all_v for a block matrix (bytes[i][j]: rank i to rank j), appended to
// `out`; every message waits for `after_of[src]` (may be empty). Exposed for tests and other exchanges.
void append_halo_all_to_all_v(const HaloGroupShape& g, const std::vector<std::vector<double>>& bytes,
                              double direct_pair_bytes, const std::vector<std::vector<int>>& after_of,
                              HaloTraffic* out);

// Alpha-beta time of the traffic (the closed form's): every message costs its sender alpha of its level, bytes
// move at intra_bw inside a node and at lane_bw through a lane's NIC (shared by the lane's ranks). A message
// starts when the messages it waits for are done; the time is the latest finish, where each rank sends its
// messages of one dependency level back to back: finish(msg) = max(ready, sender free) + alpha + bytes / bw,
// evaluated level by level (levels = longest chain of `after`), with link contention folded in per level as
// max(per-rank tx bytes, per-rank rx bytes) / intra_bw inside a node and per-lane NIC bytes / lane_bw.
struct HaloLinkModel {
  double intra_bw = 1, intra_alpha_s = 0;
  double lane_bw = 1, inter_alpha_s = 0;  // one lane's NIC bandwidth available to the group's ranks of the lane
};
double halo_traffic_time_s(const HaloGroupShape& g, const HaloTraffic& t, const HaloLinkModel& link);

}  // namespace piper::cost
