// Communication cost: alpha-beta per topology level, for the collectives Piper emits.
//
// Levels (ClusterSpec): the intra-node device link (which, on a cluster with a multi-node scale-up domain such
// as GB200 NVL72, reaches every device of the domain: the model's "node" is then the domain as the job uses it,
// ClusterSpec::devices_per_domain() ranks), the NICs (each device's share of the NIC it is attached
// to: NIC bandwidth / devices attached, the worst NIC counts), and the global links between dragonfly groups
// (NIC share / inter_group_taper, extra latency). A communication group is described by its GroupLayout: how
// many members share a node and how many nodes it spans. Every group of the same kind runs at the same time
// (all DP groups reduce together), so a node's NICs are shared by all the groups on it; a group with c
// members per node therefore sees c NIC shares for its node-crossing traffic.
//
// Formulas (n members, S bytes; docs/resource_model.md has the derivations and sources):
//   ring all-reduce     2(n-1)/n * S / bw + 2(n-1) * alpha          bw = intra, or min(intra, c * nic) across nodes
//   tree all-reduce     2 * S / bw + 2 * ceil(log2 n) * alpha       (NCCL double binary tree)
//   reduce-scatter      (n-1)/n * S / bw + (n-1) * alpha            (S = the full, unsharded buffer)
//   all-gather          same as reduce-scatter                      (S = the gathered size)
//   flat all-to-all     (n-1) * alpha + max(remote / nic, local / intra)  per-rank payload split evenly
//   HALO all-to-all     the runtime's messages (halo_traffic.h, shared with the simulator) priced by
//                       halo_traffic_time_s with halo_link(): phase I overlapped with phases II + III
//   M2N                 senders -> receivers over NICs: receivers * alpha + max(send side, receive side)
//   P2P                 alpha + S / bw of the level crossed
// All functions are pure and allocation-free; thread-safe after construction.
#pragma once

#include "piper/cost/halo_traffic.h"
#include "piper/spec/cluster_spec.h"

namespace piper::cost {

struct GroupLayout {
  int size = 1;      // members
  int per_node = 1;  // members on one node
  int nodes = 1;     // nodes spanned = size / per_node
  bool crosses_groups = false;  // spans more than one dragonfly group (tapered global links)
};

enum class AllReduceAlgo { kAuto, kRing, kTree };

// Expected number of distinct nodes hit by one token routed to k experts spread uniformly over N nodes:
// N * (1 - (1 - 1/N)^k); capped by node-limited routing (max_nodes > 0, DeepSeek-V3 routes to <= 4 nodes).
double expected_distinct_nodes(int nodes, double top_k, int max_nodes = 0);

// Bytes one token moves in a flat dispatch (the combine moves the same back), at each level: every (token,
// expert) pair is its own message; a fraction (N-1)/N of them leaves the node.
struct A2aTraffic {
  double inter_node = 0;  // over the NICs
  double intra_node = 0;  // over the device links
};
A2aTraffic flat_a2a_traffic_per_token(double token_bytes, double top_k, const GroupLayout& g);

class Network {
 public:
  explicit Network(const ClusterSpec& cluster);

  // Devices that share the innermost (device-link) level: a node, or a scale-up domain when it spans nodes.
  int devices_per_node() const { return devices_per_node_; }
  bool multi_node_domain() const { return multi_node_domain_; }
  double intra_bw() const { return intra_bw_; }
  double nic_bw_per_device() const { return nic_bw_per_device_; }

  // Layout of a group of `size` members whose ranks are `stride` apart (ranks numbered node-major), or of a
  // group made of several mesh axes: members per node multiply (see GroupLayout). With a multi-node domain
  // (72 ranks, say) a group whose span does not divide the domain straddles two of them: it is given the
  // members per domain of its worst-aligned copy, gcd(domain, stride * size) / stride.
  GroupLayout layout(int size, int stride) const;
  GroupLayout combine(const GroupLayout& inner, const GroupLayout& outer, int outer_stride) const;

  double all_reduce_s(double bytes, const GroupLayout& g, AllReduceAlgo algo = AllReduceAlgo::kAuto) const;
  double reduce_scatter_s(double bytes, const GroupLayout& g) const;
  double all_gather_s(double bytes, const GroupLayout& g) const;
  // bytes_per_rank: what one rank sends in total (tokens * k * token bytes for a dispatch).
  double all_to_all_flat_s(double bytes_per_rank, const GroupLayout& g) const;
  // HALO (halo_traffic.h): the group's shape (lanes = NICs per node when they divide g.per_node, else 1, as the
  // simulator picks them) and the alpha-beta links its messages cross (a lane's NIC: W members' NIC shares).
  HaloGroupShape halo_shape(const GroupLayout& g) const;
  HaloLinkModel halo_link(const GroupLayout& g) const;
  double m2n_s(double bytes_per_sender, int senders, int receivers) const;
  double p2p_s(double bytes, bool cross_node) const;

 private:
  // Bandwidth and per-message latency for traffic of group g that crosses nodes, per member.
  double cross_bw(const GroupLayout& g) const;
  double cross_latency(const GroupLayout& g) const;
  double ring_bw(const GroupLayout& g) const;
  double step_latency(const GroupLayout& g) const;

  int devices_per_node_ = 1;
  bool multi_node_domain_ = false;
  int nodes_per_group_ = 0;
  double intra_bw_ = 0;
  double intra_latency_s_ = 0;
  double nic_bw_per_device_ = 0;
  double nic_latency_s_ = 0;
  double inter_group_taper_ = 1;
  double inter_group_latency_s_ = 0;
  int nics_per_node_ = 0;
};

}  // namespace piper::cost
