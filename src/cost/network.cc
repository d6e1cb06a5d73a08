#include "piper/cost/network.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace piper::cost {
namespace {

double ceil_div(double a, double b) { return std::ceil(a / b); }

}  // namespace

double expected_distinct_nodes(int nodes, double top_k, int max_nodes) {
  if (nodes <= 1) return 1.0;
  const double n = nodes;
  double d = n * (1.0 - std::pow(1.0 - 1.0 / n, top_k));
  if (max_nodes > 0) d = std::min(d, static_cast<double>(max_nodes));
  return d;
}

A2aTraffic flat_a2a_traffic_per_token(double token_bytes, double top_k, const GroupLayout& g) {
  A2aTraffic t;
  const double n = g.size, c = g.per_node;
  t.inter_node = token_bytes * top_k * (n - c) / n;
  t.intra_node = token_bytes * top_k * (c - 1) / n;
  return t;
}

Network::Network(const ClusterSpec& cluster) {
  const NodeSpec& node = cluster.node;
  devices_per_node_ = std::max(1, node.devices_per_node);
  nodes_per_group_ = cluster.fabric.nodes_per_group;
  const int domain_nodes = std::max(1, cluster.scale_up.domain_nodes());
  if (domain_nodes > 1 && node.pair_bw_bytes_per_s.empty()) {
    // The domain's switches reach every device of the domain at the node link's bandwidth: the domain is the
    // innermost level. Dragonfly groups are counted in domains.
    multi_node_domain_ = true;
    devices_per_node_ = std::max(1, cluster.devices_per_domain());
    if (nodes_per_group_ > 0) nodes_per_group_ = std::max(1, (nodes_per_group_ + domain_nodes - 1) / domain_nodes);
  }
  intra_bw_ = node.intra.bw_bytes_per_s;
  if (!node.pair_bw_bytes_per_s.empty() && devices_per_node_ > 1) {
    // Mean of the off-diagonal pairs: rings and all-to-alls use all of them (Frontier: 50-200 GB/s).
    double sum = 0;
    int count = 0;
    for (int a = 0; a < devices_per_node_ && a < static_cast<int>(node.pair_bw_bytes_per_s.size()); ++a) {
      const auto& row = node.pair_bw_bytes_per_s[a];
      for (int b = 0; b < devices_per_node_ && b < static_cast<int>(row.size()); ++b) {
        if (a != b) {
          sum += row[b];
          ++count;
        }
      }
    }
    if (count > 0) intra_bw_ = sum / count;
  }
  intra_latency_s_ = node.intra.latency_s;
  const int num_nics = static_cast<int>(node.nics.size());
  const int node_devices = std::max(1, node.devices_per_node);
  double share = 0;
  for (int i = 0; i < num_nics; ++i) {
    int attached = static_cast<int>(node.nics[i].near_devices.size());
    if (attached == 0) {  // round-robin attachment
      for (int d = 0; d < node_devices; ++d) attached += d % num_nics == i ? 1 : 0;
    }
    double s = node.nics[i].bw_bytes_per_s / std::max(1, attached);
    share = i == 0 ? s : std::min(share, s);
  }
  nic_bw_per_device_ = share;
  nic_latency_s_ = node.nic_latency_s;
  nics_per_node_ = num_nics;
  inter_group_taper_ = std::max(1.0, cluster.fabric.inter_group_taper);
  inter_group_latency_s_ = cluster.fabric.inter_group_latency_s;
}

GroupLayout Network::layout(int size, int stride) const {
  GroupLayout g;
  g.size = std::max(1, size);
  if (g.size == 1) return g;
  const int G = devices_per_node_;
  g.per_node = stride >= G ? 1 : std::min(g.size, std::max(1, G / std::max(1, stride)));
  if (multi_node_domain_ && stride < G) {
    const int span = static_cast<int>(std::min<int64_t>(int64_t{stride} * g.size, int64_t{1} << 30));
    g.per_node = std::min(g.size, std::max(1, std::gcd(G, span) / std::max(1, stride)));
  }
  g.nodes = static_cast<int>(ceil_div(g.size, g.per_node));
  const double span_nodes = ceil_div(static_cast<double>(stride) * g.size, G);
  g.crosses_groups = nodes_per_group_ > 0 && g.nodes > 1 && span_nodes > nodes_per_group_;
  return g;
}

GroupLayout Network::combine(const GroupLayout& inner, const GroupLayout& outer, int outer_stride) const {
  GroupLayout g;
  g.size = inner.size * outer.size;
  g.per_node = std::min(g.size, std::min(devices_per_node_, inner.per_node * outer.per_node));
  g.nodes = static_cast<int>(ceil_div(g.size, g.per_node));
  g.crosses_groups = inner.crosses_groups || outer.crosses_groups;
  (void)outer_stride;
  return g;
}

double Network::cross_bw(const GroupLayout& g) const {
  double bw = g.per_node * nic_bw_per_device_;
  return g.crosses_groups ? bw / inter_group_taper_ : bw;
}

double Network::cross_latency(const GroupLayout& g) const {
  return nic_latency_s_ + (g.crosses_groups ? inter_group_latency_s_ : 0.0);
}

double Network::ring_bw(const GroupLayout& g) const {
  return g.nodes <= 1 ? intra_bw_ : std::min(intra_bw_, cross_bw(g));
}

double Network::step_latency(const GroupLayout& g) const {
  return g.nodes <= 1 ? intra_latency_s_ : cross_latency(g);
}

double Network::all_reduce_s(double bytes, const GroupLayout& g, AllReduceAlgo algo) const {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double n = g.size, bw = ring_bw(g), a = step_latency(g);
  const double ring = 2 * (n - 1) / n * bytes / bw + 2 * (n - 1) * a;
  const double tree = 2 * bytes / bw + 2 * std::ceil(std::log2(n)) * a;
  switch (algo) {
    case AllReduceAlgo::kRing: return ring;
    case AllReduceAlgo::kTree: return tree;
    case AllReduceAlgo::kAuto: break;
  }
  return std::min(ring, tree);
}

double Network::reduce_scatter_s(double bytes, const GroupLayout& g) const {
  if (g.size <= 1 || bytes <= 0) return 0;
  const double n = g.size;
  return (n - 1) / n * bytes / ring_bw(g) + (n - 1) * step_latency(g);
}

double Network::all_gather_s(double bytes, const GroupLayout& g) const { return reduce_scatter_s(bytes, g); }

double Network::all_to_all_flat_s(double bytes_per_rank, const GroupLayout& g) const {
  if (g.size <= 1 || bytes_per_rank <= 0) return 0;
  const double n = g.size, c = g.per_node;
  const double remote = bytes_per_rank * (n - c) / n;
  const double local = bytes_per_rank * (c - 1) / n;
  // Every member sends its own remote share through its own NIC share (all members of the node send at once).
  double nic = g.crosses_groups ? nic_bw_per_device_ / inter_group_taper_ : nic_bw_per_device_;
  double t_remote = remote > 0 ? remote / nic : 0;
  double t_local = local > 0 ? local / intra_bw_ : 0;
  return (n - 1) * step_latency(g) + std::max(t_remote, t_local);
}

HaloGroupShape Network::halo_shape(const GroupLayout& g) const {
  HaloGroupShape h;
  h.nodes = std::max(1, g.nodes);
  h.ranks_per_node = std::max(1, g.per_node);
  h.lanes = nics_per_node_ > 0 && h.ranks_per_node % nics_per_node_ == 0 ? nics_per_node_ : 1;
  return h;
}

HaloLinkModel Network::halo_link(const GroupLayout& g) const {
  const HaloGroupShape h = halo_shape(g);
  HaloLinkModel link;
  link.intra_bw = intra_bw_;
  link.intra_alpha_s = intra_latency_s_;
  link.lane_bw = cross_bw(g) / h.lanes;  // per_node NIC shares, split over the lanes
  link.inter_alpha_s = cross_latency(g);
  return link;
}

double Network::m2n_s(double bytes_per_sender, int senders, int receivers) const {
  if (senders <= 0 || receivers <= 0 || bytes_per_sender <= 0) return 0;
  const double send = bytes_per_sender / nic_bw_per_device_;
  const double recv = bytes_per_sender * senders / receivers / nic_bw_per_device_;
  return receivers * nic_latency_s_ + std::max(send, recv);
}

double Network::p2p_s(double bytes, bool cross_node) const {
  if (bytes <= 0) return 0;
  return cross_node ? nic_latency_s_ + bytes / nic_bw_per_device_ : intra_latency_s_ + bytes / intra_bw_;
}

}  // namespace piper::cost
