#include "piper/sim/network.h"

#include <cmath>
#include <string>

#include "piper/base/check.h"

namespace piper::sim {
namespace {

bool positive(double x) { return std::isfinite(x) && x > 0; }

Status check_cluster(const ClusterSpec& c) {
  const std::string where = "cluster '" + c.name + "': ";
  if (c.num_nodes < 1) return invalid_argument(where + "num_nodes=" + std::to_string(c.num_nodes) + " must be >= 1");
  const int g = c.node.devices_per_node;
  if (g < 1) return invalid_argument(where + "node.devices_per_node=" + std::to_string(g) + " must be >= 1");
  const auto& m = c.node.pair_bw_bytes_per_s;
  if (c.scale_up.domain_nodes() < 1 || (c.scale_up.domain_nodes() > 1 && !m.empty())) {
    return invalid_argument(where + "scale_up: " + std::to_string(c.scale_up.domain_nodes()) +
                            " nodes per domain needs >= 1 and a switched node (no pair_bw_bytes_per_s)");
  }
  if (!m.empty()) {
    if (static_cast<int>(m.size()) != g) {
      return invalid_argument(where + "node.pair_bw_bytes_per_s has " + std::to_string(m.size()) +
                              " rows, expected devices_per_node=" + std::to_string(g));
    }
    for (int a = 0; a < g; ++a) {
      if (static_cast<int>(m[a].size()) != g) {
        return invalid_argument(where + "node.pair_bw_bytes_per_s row " + std::to_string(a) + " has " +
                                std::to_string(m[a].size()) + " entries, expected " + std::to_string(g));
      }
      for (int b = 0; b < g; ++b) {
        if (!std::isfinite(m[a][b]) || m[a][b] < 0) {
          return invalid_argument(where + "node.pair_bw_bytes_per_s[" + std::to_string(a) + "][" + std::to_string(b) +
                                  "] must be finite and >= 0 (0 = no direct link)");
        }
      }
    }
  } else if (g > 1 && !positive(c.node.intra.bw_bytes_per_s)) {
    return invalid_argument(where + "node.intra.bw_bytes_per_s must be > 0 when a node has several devices");
  }
  if (!std::isfinite(c.node.intra.latency_s) || c.node.intra.latency_s < 0 || !std::isfinite(c.node.nic_latency_s) ||
      c.node.nic_latency_s < 0 || !std::isfinite(c.fabric.inter_group_latency_s) ||
      c.fabric.inter_group_latency_s < 0) {
    return invalid_argument(where + "latencies must be finite and >= 0");
  }
  if (c.num_nodes > 1) {
    if (c.fabric.topology == FabricTopology::kSingleNode) {
      return invalid_argument(where + "fabric.topology is single-node but num_nodes=" + std::to_string(c.num_nodes) +
                              "; use fat-tree or dragonfly, or one node");
    }
    if (c.node.nics.empty()) return invalid_argument(where + "node.nics is empty; a multi-node cluster needs a NIC");
  }
  for (size_t i = 0; i < c.node.nics.size(); ++i) {
    if (!positive(c.node.nics[i].bw_bytes_per_s)) {
      return invalid_argument(where + "node.nics[" + std::to_string(i) + "].bw_bytes_per_s must be > 0");
    }
    for (int d : c.node.nics[i].near_devices) {
      if (d < 0 || d >= g) {
        return invalid_argument(where + "node.nics[" + std::to_string(i) + "].near_devices lists device " +
                                std::to_string(d) + ", outside [0, " + std::to_string(g) + ")");
      }
    }
  }
  if (c.fabric.nodes_per_group < 0) return invalid_argument(where + "fabric.nodes_per_group must be >= 0");
  if (!(c.fabric.intra_group_taper >= 1) || !(c.fabric.inter_group_taper >= 1) ||
      !std::isfinite(c.fabric.intra_group_taper) || !std::isfinite(c.fabric.inter_group_taper)) {
    return invalid_argument(where + "fabric tapers must be finite and >= 1 (injection / bisection bandwidth)");
  }
  return ok_status();
}

}  // namespace

const char* to_string(LinkKind kind) {
  switch (kind) {
    case LinkKind::kPortOut:
      return "port_out";
    case LinkKind::kPortIn:
      return "port_in";
    case LinkKind::kPair:
      return "pair";
    case LinkKind::kNicTx:
      return "nic_tx";
    case LinkKind::kNicRx:
      return "nic_rx";
    case LinkKind::kGroupFabric:
      return "group_fabric";
    case LinkKind::kGlobalTx:
      return "global_tx";
    case LinkKind::kGlobalRx:
      return "global_rx";
  }
  return "?";
}

std::string Link::name() const {
  const std::string n = "node" + std::to_string(node);
  const std::string g = "group" + std::to_string(index);
  switch (kind) {
    case LinkKind::kPortOut:
      return n + ".dev" + std::to_string(index) + ".out";
    case LinkKind::kPortIn:
      return n + ".dev" + std::to_string(index) + ".in";
    case LinkKind::kPair:
      return n + ".dev" + std::to_string(index) + "->dev" + std::to_string(peer);
    case LinkKind::kNicTx:
      return n + ".nic" + std::to_string(index) + ".tx";
    case LinkKind::kNicRx:
      return n + ".nic" + std::to_string(index) + ".rx";
    case LinkKind::kGroupFabric:
      return g + ".fabric";
    case LinkKind::kGlobalTx:
      return g + ".global.tx";
    case LinkKind::kGlobalRx:
      return g + ".global.rx";
  }
  return "?";
}

int Network::add_link(Link link) {
  links_.push_back(link);
  return static_cast<int>(links_.size()) - 1;
}

std::vector<double> Network::link_bandwidths() const {
  std::vector<double> bw;
  bw.reserve(links_.size());
  for (const Link& l : links_) bw.push_back(l.bw_bytes_per_s);
  return bw;
}

Result<Network> Network::build(const ClusterSpec& c, const std::vector<double>& nic_scale) {
  PIPER_RETURN_IF_ERROR(check_cluster(c));
  const size_t nic_links = static_cast<size_t>(c.num_nodes) * c.node.nics.size();
  if (!nic_scale.empty() && nic_scale.size() != nic_links) {
    return invalid_argument("network: " + std::to_string(nic_scale.size()) + " NIC scales for " +
                            std::to_string(nic_links) + " NICs");
  }
  Network net;
  const int g = c.node.devices_per_node;
  net.num_nodes_ = c.num_nodes;
  net.devices_per_node_ = g;
  net.nodes_per_group_ = c.fabric.nodes_per_group == 0 ? c.num_nodes : c.fabric.nodes_per_group;
  net.domain_nodes_ = std::max(1, c.scale_up.domain_nodes());
  net.num_nics_ = static_cast<int>(c.node.nics.size());
  net.pair_matrix_ = !c.node.pair_bw_bytes_per_s.empty();
  net.nic_of_local_.assign(g, 0);
  for (int d = 0; d < g && net.num_nics_ > 0; ++d) net.nic_of_local_[d] = c.node.nic_of_device(d);
  const double nic_bw_total = c.node.nic_bw_total();

  for (int n = 0; n < c.num_nodes; ++n) {
    if (net.pair_matrix_) {
      std::vector<int> pairs(static_cast<size_t>(g) * g, -1);
      for (int a = 0; a < g; ++a) {
        for (int b = 0; b < g; ++b) {
          if (a == b || c.node.pair_bw_bytes_per_s[a][b] <= 0) continue;
          pairs[a * g + b] =
              net.add_link({LinkKind::kPair, c.node.pair_bw_bytes_per_s[a][b], c.node.intra.latency_s, n, a, b});
        }
      }
      net.pair_.push_back(std::move(pairs));
    } else if (g > 1 || net.domain_nodes_ > 1) {
      for (int a = 0; a < g; ++a) {
        net.port_out_.push_back(
            net.add_link({LinkKind::kPortOut, c.node.intra.bw_bytes_per_s, c.node.intra.latency_s, n, a, -1}));
        net.port_in_.push_back(net.add_link({LinkKind::kPortIn, c.node.intra.bw_bytes_per_s, 0, n, a, -1}));
      }
    }
    for (int i = 0; i < net.num_nics_; ++i) {
      const double bw = c.node.nics[i].bw_bytes_per_s *
                        (nic_scale.empty() ? 1.0 : nic_scale[static_cast<size_t>(n) * net.num_nics_ + i]);
      net.nic_tx_.push_back(net.add_link({LinkKind::kNicTx, bw, c.node.nic_latency_s, n, i, -1}));
      net.nic_rx_.push_back(net.add_link({LinkKind::kNicRx, bw, 0, n, i, -1}));
    }
  }
  if (c.num_nodes > 1) {
    for (int grp = 0; grp < net.num_groups(); ++grp) {
      const int nodes = std::min(net.nodes_per_group_, c.num_nodes - grp * net.nodes_per_group_);
      const double injection = nodes * nic_bw_total;
      net.fabric_.push_back(
          net.add_link({LinkKind::kGroupFabric, injection / c.fabric.intra_group_taper, 0, -1, grp, -1}));
      if (net.num_groups() > 1) {
        const double global = injection / c.fabric.inter_group_taper;
        net.global_tx_.push_back(
            net.add_link({LinkKind::kGlobalTx, global, c.fabric.inter_group_latency_s, -1, grp, -1}));
        net.global_rx_.push_back(net.add_link({LinkKind::kGlobalRx, global, 0, -1, grp, -1}));
      }
    }
  }
  return net;
}

Result<Route> Network::route(int src, int dst) const {
  if (src < 0 || src >= num_devices() || dst < 0 || dst >= num_devices()) {
    return out_of_range("network: route " + std::to_string(src) + " -> " + std::to_string(dst) +
                        ": devices are in [0, " + std::to_string(num_devices()) + ")");
  }
  Route r;
  const int g = devices_per_node_;
  const int na = node_of(src), nb = node_of(dst);
  if (src == dst) return r;
  if (na == nb) {
    if (pair_matrix_) {
      const int link = pair_[na][(src % g) * g + dst % g];
      if (link < 0) {
        return invalid_argument("network: node " + std::to_string(na) + " has no direct link from local device " +
                                std::to_string(src % g) + " to " + std::to_string(dst % g) +
                                " (pair_bw_bytes_per_s is 0); give it a bandwidth");
      }
      r.links = {link};
    } else {
      r.links = {port_out_[src], port_in_[dst]};
    }
  } else if (!pair_matrix_ && domain_of_node(na) == domain_of_node(nb)) {
    r.links = {port_out_[src], port_in_[dst]};  // one scale-up (NVLink switch) domain spans both nodes
  } else {
    const int ga = group_of_node(na), gb = group_of_node(nb);
    r.links.push_back(nic_tx_[na * num_nics_ + nic_of(src)]);
    r.links.push_back(fabric_[ga]);
    if (ga != gb) {
      r.links.push_back(global_tx_[ga]);
      r.links.push_back(global_rx_[gb]);
      r.links.push_back(fabric_[gb]);
    }
    r.links.push_back(nic_rx_[nb * num_nics_ + nic_of(dst)]);
  }
  for (int l : r.links) r.latency_s += links_[l].latency_s;
  return r;
}

}  // namespace piper::sim
