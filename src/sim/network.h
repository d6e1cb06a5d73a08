// Network: the links of a ClusterSpec and the path (list of links) a flow from device a to device b takes.
//
// Devices are numbered globally: device = node * devices_per_node + local index. Links are one-directional with a
// bandwidth in bytes/s and a latency in s (a path's alpha is the sum over its links). Link model, innermost first:
//   - inside a node, uniform (no per-pair matrix): a switched fabric (NVSwitch-like). Every device has an egress
//     port and an ingress port of node.intra bandwidth; a -> b crosses port_out(a), port_in(b). Latency
//     node.intra.latency_s on the egress port.
//   - inside a node, per-pair matrix: direct links (Infinity-Fabric-like), one per ordered pair with
//     pair_bw_bytes_per_s[a][b] bandwidth (pairs with 0 have no direct link and are an error to route).
//   - inside a scale-up domain of several nodes (ClusterSpec::scale_up, e.g. GB200 NVL72's 18 trays): the same
//     egress/ingress ports as inside a node; a -> b in another node of the domain crosses port_out(a), port_in(b)
//     (one NVLink switch fabric), never the NICs. Domains hold scale_up.domain_nodes() consecutive nodes.
//   - across nodes: NIC transmit and receive links per NIC (node.nics[i].bw per direction). A device uses its
//     nearest NIC (NodeSpec::nic_of_device: the first NIC whose near_devices lists it, else local index mod
//     NICs). The device-to-NIC hop (PCIe) is not modelled. Latency node.nic_latency_s on the transmit link.
//   - groups of fabric.nodes_per_group nodes (0 = one group; the last group may be smaller) share an intra-group
//     fabric link of capacity (nodes in group * sum of NIC bandwidths) / intra_group_taper that every
//     inter-node flow touching the group crosses (a switch with tapered bisection, one aggregate link).
//   - between groups (dragonfly global links, or the spine of a fat tree) every group has a global transmit and
//     a global receive link of capacity (nodes in group * sum of NIC bandwidths) / inter_group_taper; latency
//     fabric.inter_group_latency_s on the transmit side.
// Paths: same node or domain: [port_out(a), port_in(b)] or [pair(a,b)]; same group: [nic_tx, fabric(g), nic_rx];
// other group: [nic_tx, fabric(ga), global_tx(ga), global_rx(gb), fabric(gb), nic_rx]. a == b: empty path.
// Thread-safety: immutable after build(); share freely.
#pragma once

#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/spec/cluster_spec.h"

namespace piper::sim {

enum class LinkKind { kPortOut, kPortIn, kPair, kNicTx, kNicRx, kGroupFabric, kGlobalTx, kGlobalRx };
const char* to_string(LinkKind kind);

struct Link {
  LinkKind kind = LinkKind::kPortOut;
  double bw_bytes_per_s = 0;  // one direction
  double latency_s = 0;
  int node = -1;             // node of a port, pair or NIC link; -1 for fabric and global links
  int index = -1;            // local device (ports, source of a pair), NIC index, or group (fabric, global)
  int peer = -1;             // destination local device of a pair link
  std::string name() const;  // "node1.dev2.out", "node0.dev1->dev3", "node3.nic1.tx", "group0.fabric", ...
};

struct Route {
  std::vector<int> links;  // link ids in order
  double latency_s = 0;    // sum of the links' latencies
};

class Network {
 public:
  // Errors name the ClusterSpec field that is missing or out of range. nic_scale (empty: all 1) multiplies each
  // NIC's bandwidth, [node * nics_per_node + nic] (af-pipe's NIC split, cost/nic_split.h).
  static Result<Network> build(const ClusterSpec& cluster, const std::vector<double>& nic_scale = {});

  int num_devices() const { return num_nodes_ * devices_per_node_; }
  int num_nodes() const { return num_nodes_; }
  int devices_per_node() const { return devices_per_node_; }
  int node_of(int device) const { return device / devices_per_node_; }
  int group_of_node(int node) const { return node / nodes_per_group_; }
  int domain_of_node(int node) const { return node / domain_nodes_; }
  int num_groups() const { return (num_nodes_ + nodes_per_group_ - 1) / nodes_per_group_; }
  int nic_of(int device) const { return nic_of_local_[device % devices_per_node_]; }
  const std::vector<Link>& links() const { return links_; }
  std::vector<double> link_bandwidths() const;

  // OutOfRange for a device outside [0, num_devices()); InvalidArgument for two devices of a node with no link.
  Result<Route> route(int src, int dst) const;

 private:
  int add_link(Link link);

  int num_nodes_ = 0;
  int devices_per_node_ = 0;
  int nodes_per_group_ = 1;
  int domain_nodes_ = 1;  // nodes per scale-up domain as the job uses it
  int num_nics_ = 0;
  bool pair_matrix_ = false;
  std::vector<int> nic_of_local_;
  std::vector<Link> links_;
  std::vector<int> port_out_, port_in_;              // [device]
  std::vector<std::vector<int>> pair_;               // [node][a * G + b], -1 when no link
  std::vector<int> nic_tx_, nic_rx_;                 // [node * num_nics + nic]
  std::vector<int> fabric_, global_tx_, global_rx_;  // [group]
};

}  // namespace piper::sim
