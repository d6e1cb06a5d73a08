#include "piper/sim/collectives.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

namespace piper::sim {
namespace {

Status check_group(const Network& net, const std::vector<int>& devices, const char* what) {
  if (devices.empty()) return invalid_argument(std::string(what) + ": the group is empty");
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= net.num_devices()) {
      return out_of_range(std::string(what) + ": device " + std::to_string(d) + " outside [0, " +
                          std::to_string(net.num_devices()) + ")");
    }
    if (!seen.insert(d).second) {
      return invalid_argument(std::string(what) + ": device " + std::to_string(d) + " appears twice in the group");
    }
  }
  return ok_status();
}

Status check_bytes(double bytes, const char* what) {
  if (!std::isfinite(bytes) || bytes < 0) {
    return invalid_argument(std::string(what) + ": bytes=" + std::to_string(bytes) + " must be finite and >= 0");
  }
  return ok_status();
}

Status check_matrix(const std::vector<std::vector<double>>& m, size_t rows, size_t cols, const char* what) {
  if (m.size() != rows) {
    return invalid_argument(std::string(what) + ": bytes matrix has " + std::to_string(m.size()) + " rows, expected " +
                            std::to_string(rows));
  }
  for (size_t i = 0; i < rows; ++i) {
    if (m[i].size() != cols) {
      return invalid_argument(std::string(what) + ": bytes matrix row " + std::to_string(i) + " has " +
                              std::to_string(m[i].size()) + " entries, expected " + std::to_string(cols));
    }
    for (double b : m[i]) PIPER_RETURN_IF_ERROR(check_bytes(b, what));
  }
  return ok_status();
}

Result<int> add_routed(const Network& net, FlowSim* sim, int src, int dst, double bytes, double release_s,
                       std::vector<int> after) {
  PIPER_ASSIGN_OR_RETURN(Route route, net.route(src, dst));
  FlowSpec f;
  for (int l : route.links) f.hops.push_back({l, 1.0});
  f.bytes = bytes;
  f.latency_s = route.latency_s;
  f.release_s = release_s;
  f.after = std::move(after);
  f.src_device = src;
  f.dst_device = dst;
  return sim->add(std::move(f));
}

// n-1 ring steps of bytes/n each; `prev` holds, per rank, the flow it received in the step before (or -1).
// Rings longer than kMaxRingStages steps are simulated in kMaxRingStages stages of consecutive steps (g steps
// each, the last one the remainder): in a stage every rank sends g * bytes/n to its successor and pays g times
// the path latency, once it received its predecessor's previous stage. On links whose rates stay constant this
// is the same time as the n-1 steps (each chain of steps crosses the ring's links with the same bytes and
// latency); it keeps the number of flow events of a ZeRO-3 all-gather over dp = 1,024 at 64 stages instead of
// 1,023 steps (docs/simulator.md "Long rings").
Status add_ring_steps(const Network& net, FlowSim* sim, const std::vector<int>& devices, double bytes,
                      const CollectiveStart& start, std::vector<int>* prev, CollectiveFlows* out) {
  const int n = static_cast<int>(devices.size());
  const int steps = n - 1;
  const int per_stage = (steps + kMaxRingStages - 1) / kMaxRingStages;  // g: 1 for rings of <= 64 steps
  for (int k = 0; k < steps; k += per_stage) {
    const int g = std::min(per_stage, steps - k);
    std::vector<int> sent(n);
    for (int i = 0; i < n; ++i) {
      std::vector<int> after = start.after;
      if ((*prev)[i] >= 0) after = {(*prev)[i]};  // what rank i forwards arrived in that flow
      PIPER_ASSIGN_OR_RETURN(Route route, net.route(devices[i], devices[(i + 1) % n]));
      FlowSpec f;
      for (int l : route.links) f.hops.push_back({l, 1.0});
      f.bytes = g * (bytes / n);
      f.latency_s = g * route.latency_s;
      f.release_s = start.release_s;
      f.after = std::move(after);
      f.src_device = devices[i];
      f.dst_device = devices[(i + 1) % n];
      PIPER_ASSIGN_OR_RETURN(sent[i], sim->add(std::move(f)));
    }
    for (int i = 0; i < n; ++i) (*prev)[(i + 1) % n] = sent[i];
    out->flows.insert(out->flows.end(), sent.begin(), sent.end());
    out->phases.push_back(std::move(sent));
  }
  return ok_status();
}

Result<CollectiveFlows> ring(const Network& net, FlowSim* sim, const std::vector<int>& devices, double bytes,
                             const CollectiveStart& start, int passes, const char* what) {
  PIPER_RETURN_IF_ERROR(check_group(net, devices, what));
  PIPER_RETURN_IF_ERROR(check_bytes(bytes, what));
  CollectiveFlows out;
  std::vector<int> prev(devices.size(), -1);
  for (int p = 0; p < passes; ++p) PIPER_RETURN_IF_ERROR(add_ring_steps(net, sim, devices, bytes, start, &prev, &out));
  return out;
}

}  // namespace

double finish_time_s(const std::vector<double>& completion_s, const CollectiveFlows& c, double release_s) {
  double t = release_s;
  for (int f : c.flows) t = std::max(t, completion_s[f]);
  return t;
}

std::vector<std::vector<double>> uniform_all_to_all(int n, double bytes_per_rank) {
  return std::vector<std::vector<double>>(n, std::vector<double>(n, bytes_per_rank / n));
}

Result<CollectiveFlows> add_p2p(const Network& net, FlowSim* sim, int src, int dst, double bytes,
                                const CollectiveStart& start) {
  PIPER_RETURN_IF_ERROR(check_group(net, {src}, "p2p"));
  PIPER_RETURN_IF_ERROR(check_group(net, {dst}, "p2p"));
  PIPER_RETURN_IF_ERROR(check_bytes(bytes, "p2p"));
  PIPER_ASSIGN_OR_RETURN(int id, add_routed(net, sim, src, dst, bytes, start.release_s, start.after));
  CollectiveFlows out;
  out.flows = {id};
  out.phases = {{id}};
  return out;
}

Result<CollectiveFlows> add_ring_reduce_scatter(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                                double bytes, const CollectiveStart& start) {
  return ring(net, sim, devices, bytes, start, 1, "ring reduce-scatter");
}

Result<CollectiveFlows> add_ring_all_gather(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            double bytes, const CollectiveStart& start) {
  return ring(net, sim, devices, bytes, start, 1, "ring all-gather");
}

Result<CollectiveFlows> add_ring_shift(const Network& net, FlowSim* sim, const std::vector<int>& devices, double bytes,
                                       const CollectiveStart& start) {
  PIPER_RETURN_IF_ERROR(check_group(net, devices, "ring shift"));
  PIPER_RETURN_IF_ERROR(check_bytes(bytes, "ring shift"));
  const int n = static_cast<int>(devices.size());
  CollectiveFlows out;
  if (n < 2) return out;
  std::vector<int> sent(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    PIPER_ASSIGN_OR_RETURN(sent[static_cast<size_t>(i)],
                           add_routed(net, sim, devices[static_cast<size_t>(i)],
                                      devices[static_cast<size_t>((i + 1) % n)], bytes, start.release_s, start.after));
  }
  out.flows = sent;
  out.phases = {std::move(sent)};
  return out;
}

Result<CollectiveFlows> add_ring_all_reduce(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            double bytes, const CollectiveStart& start) {
  return ring(net, sim, devices, bytes, start, 2, "ring all-reduce");
}

Result<CollectiveFlows> add_tree_all_reduce(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            double bytes, int chunks, const CollectiveStart& start) {
  PIPER_RETURN_IF_ERROR(check_group(net, devices, "tree all-reduce"));
  PIPER_RETURN_IF_ERROR(check_bytes(bytes, "tree all-reduce"));
  if (chunks < 1) return invalid_argument("tree all-reduce: chunks=" + std::to_string(chunks) + " must be >= 1");
  const int n = static_cast<int>(devices.size());
  CollectiveFlows out;
  out.phases.assign(2, {});  // reduce (up), broadcast (down)
  std::vector<std::vector<int>> up(n, std::vector<int>(chunks, -1)), down = up;
  auto children = [&](int i) {
    std::vector<int> c;
    for (int k : {2 * i + 1, 2 * i + 2}) {
      if (k < n) c.push_back(k);
    }
    return c;
  };
  // Ranks are visited leaves first (decreasing index), so every child's flow exists before its parent's.
  for (int j = 0; j < chunks; ++j) {
    for (int i = n - 1; i >= 1; --i) {
      std::vector<int> after;
      for (int c : children(i)) after.push_back(up[c][j]);
      if (j > 0) after.push_back(up[i][j - 1]);
      if (after.empty()) after = start.after;
      PIPER_ASSIGN_OR_RETURN(up[i][j], add_routed(net, sim, devices[i], devices[(i - 1) / 2], bytes / chunks,
                                                  start.release_s, std::move(after)));
      out.phases[0].push_back(up[i][j]);
    }
  }
  for (int j = 0; j < chunks; ++j) {
    for (int i = 1; i < n; ++i) {
      const int parent = (i - 1) / 2;
      std::vector<int> after;
      if (parent == 0) {
        for (int c : children(0)) after.push_back(up[c][j]);
      } else {
        after.push_back(down[parent][j]);
      }
      if (j > 0) after.push_back(down[i][j - 1]);
      PIPER_ASSIGN_OR_RETURN(down[i][j], add_routed(net, sim, devices[parent], devices[i], bytes / chunks,
                                                    start.release_s, std::move(after)));
      out.phases[1].push_back(down[i][j]);
    }
  }
  for (const auto& phase : out.phases) out.flows.insert(out.flows.end(), phase.begin(), phase.end());
  return out;
}

Result<CollectiveFlows> add_all_to_all_flat(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            const std::vector<std::vector<double>>& bytes_matrix,
                                            const CollectiveStart& start) {
  PIPER_RETURN_IF_ERROR(check_group(net, devices, "flat all-to-all"));
  PIPER_RETURN_IF_ERROR(check_matrix(bytes_matrix, devices.size(), devices.size(), "flat all-to-all"));
  CollectiveFlows out;
  for (size_t i = 0; i < devices.size(); ++i) {
    for (size_t j = 0; j < devices.size(); ++j) {
      if (i == j || bytes_matrix[i][j] == 0) continue;
      PIPER_ASSIGN_OR_RETURN(
          int id, add_routed(net, sim, devices[i], devices[j], bytes_matrix[i][j], start.release_s, start.after));
      out.flows.push_back(id);
    }
  }
  out.phases = {out.flows};
  return out;
}

Result<CollectiveFlows> add_m2n(const Network& net, FlowSim* sim, const std::vector<int>& senders,
                                const std::vector<int>& receivers, const std::vector<std::vector<double>>& bytes_matrix,
                                const CollectiveStart& start) {
  PIPER_RETURN_IF_ERROR(check_group(net, senders, "m2n senders"));
  PIPER_RETURN_IF_ERROR(check_group(net, receivers, "m2n receivers"));
  PIPER_RETURN_IF_ERROR(check_matrix(bytes_matrix, senders.size(), receivers.size(), "m2n"));
  CollectiveFlows out;
  for (size_t m = 0; m < senders.size(); ++m) {
    for (size_t r = 0; r < receivers.size(); ++r) {
      if (bytes_matrix[m][r] == 0) continue;
      PIPER_ASSIGN_OR_RETURN(
          int id, add_routed(net, sim, senders[m], receivers[r], bytes_matrix[m][r], start.release_s, start.after));
      out.flows.push_back(id);
    }
  }
  out.phases = {out.flows};
  return out;
}

Result<HaloLayout> HaloLayout::of_group(const Network& net, const std::vector<int>& devices, int lanes) {
  const char* what = "HALO all-to-all";
  PIPER_RETURN_IF_ERROR(check_group(net, devices, what));
  const int size = static_cast<int>(devices.size());
  int k = 1;
  while (k < size && net.node_of(devices[k]) == net.node_of(devices[0])) ++k;
  std::set<int> nodes;
  for (int r = 0; r < size; ++r) {
    const int node = net.node_of(devices[r]);
    if (size % k != 0 || node != net.node_of(devices[r - r % k]) || (r % k == 0 && !nodes.insert(node).second)) {
      return invalid_argument(std::string(what) +
                              ": the group must be node-major with the same number of ranks on "
                              "every node (ranks n*k .. n*k+k-1 on one node, k=" +
                              std::to_string(k) + "); rank " + std::to_string(r) + " (device " +
                              std::to_string(devices[r]) + ") breaks it; use the flat all-to-all");
    }
  }
  if (lanes < 1 || k % lanes != 0) {
    return invalid_argument(std::string(what) + ": lanes=" + std::to_string(lanes) + " must divide the " +
                            std::to_string(k) + " ranks per node (lanes = NICs per node, or ranks per node)");
  }
  HaloLayout layout;
  layout.ranks_per_node = k;
  layout.lanes = lanes;
  return layout;
}

Result<CollectiveFlows> add_halo_traffic(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                         const cost::HaloTraffic& traffic, const CollectiveStart& start) {
  PIPER_RETURN_IF_ERROR(HaloLayout::of_group(net, devices, 1).status());
  const int size = static_cast<int>(devices.size());
  CollectiveFlows out;
  out.phases.assign(3, {});
  std::vector<int> ids;  // flow of each message
  ids.reserve(traffic.messages.size());
  for (const cost::HaloMessage& m : traffic.messages) {
    if (m.src < 0 || m.dst < 0 || m.src >= size || m.dst >= size) {
      return invalid_argument("HALO traffic: a message between ranks " + std::to_string(m.src) + " and " +
                              std::to_string(m.dst) + " is outside the group of " + std::to_string(size));
    }
    std::vector<int> after;
    for (int a : m.after) after.push_back(ids.at(static_cast<size_t>(a)));
    if (after.empty()) after = start.after;
    PIPER_ASSIGN_OR_RETURN(int id, add_routed(net, sim, devices[m.src], devices[m.dst], m.bytes, start.release_s, after));
    ids.push_back(id);
    const int phase = m.step == cost::HaloStep::kBatch ? 1 : m.step == cost::HaloStep::kScatter ? 2 : 0;
    out.phases[static_cast<size_t>(phase)].push_back(id);
    out.flows.push_back(id);
  }
  return out;
}

Result<CollectiveFlows> add_all_to_all_uniform_aggregate(const Network& net, FlowSim* sim,
                                                         const std::vector<int>& devices, double bytes_per_rank,
                                                         const CollectiveStart& start) {
  const std::string what = "aggregate all-to-all";
  PIPER_ASSIGN_OR_RETURN(HaloLayout layout, HaloLayout::of_group(net, devices, 1));
  PIPER_RETURN_IF_ERROR(check_bytes(bytes_per_rank, "aggregate all-to-all"));
  const int n = static_cast<int>(devices.size()), k = layout.ranks_per_node, nodes = n / k;
  const int g = net.devices_per_node();
  auto fail = [&](const std::string& why) {
    return invalid_argument(what + ": " + why + "; the group is not symmetric, use add_all_to_all_flat");
  };
  std::vector<int> per_nic;  // group ranks per NIC on a node
  for (int r = 0; r < n; ++r) {
    if (devices[r] % g != devices[r % k] % g)
      return fail("node " + std::to_string(r / k) + " uses other local devices");
    if (net.group_of_node(net.node_of(devices[r])) != net.group_of_node(net.node_of(devices[0]))) {
      return fail("the group spans several fabric groups");
    }
  }
  if (nodes > 1) {
    for (int i = 0; i < k; ++i) {
      const int nic = net.nic_of(devices[i]);
      if (nic >= static_cast<int>(per_nic.size())) per_nic.resize(nic + 1, 0);
      ++per_nic[nic];
    }
  }
  int c = 0;
  for (int count : per_nic) {
    if (count == 0) continue;
    if (c != 0 && count != c) return fail("NICs serve different numbers of group ranks");
    c = count;
  }
  const int rep = devices[0];
  CollectiveFlows out;
  // The representative's receive-side links: its in-port and its NIC rx, found from routes into it.
  int in_port = -1, nic_rx = -1;
  if (k > 1) {
    PIPER_ASSIGN_OR_RETURN(Route r, net.route(devices[1], rep));
    if (r.links.size() != 2) return fail("nodes with a per-pair link matrix");
    in_port = r.links[1];
  }
  if (nodes > 1) {
    PIPER_ASSIGN_OR_RETURN(Route r, net.route(devices[k], rep));
    nic_rx = r.links.back();
    const double bw = net.links()[nic_rx].bw_bytes_per_s;
    for (const Link& l : net.links()) {
      if (l.kind == LinkKind::kNicRx && l.bw_bytes_per_s != bw) return fail("NICs of different bandwidths");
    }
  }
  for (int dst = 1; dst < n; ++dst) {
    PIPER_ASSIGN_OR_RETURN(Route r, net.route(rep, devices[dst]));
    FlowSpec f;
    if (dst < k) {
      f.hops = {{r.links[0], 1.0}, {in_port, 1.0}};
    } else {
      f.hops = {
          {r.links[0], static_cast<double>(c)}, {r.links[1], static_cast<double>(n)}, {nic_rx, static_cast<double>(c)}};
    }
    f.bytes = bytes_per_rank / n;
    f.latency_s = r.latency_s;
    f.release_s = start.release_s;
    f.after = start.after;
    if (f.bytes == 0) continue;
    PIPER_ASSIGN_OR_RETURN(int id, sim->add(std::move(f)));
    out.flows.push_back(id);
  }
  out.phases = {out.flows};
  return out;
}

Result<CollectiveFlows> add_parallel_rings_all_reduce_aggregate(const Network& net, FlowSim* sim,
                                                                const std::vector<int>& nodes,
                                                                const std::vector<int>& locals, double bytes,
                                                                const CollectiveStart& start) {
  const std::string what = "aggregate ring all-reduce";
  PIPER_RETURN_IF_ERROR(check_bytes(bytes, "aggregate ring all-reduce"));
  auto fail = [&](const std::string& why) { return invalid_argument(what + ": " + why); };
  if (nodes.size() < 2) return fail("needs at least 2 nodes (a ring inside one node: use add_ring_all_reduce)");
  if (locals.empty()) return fail("no local device index given");
  std::set<int> seen_nodes(nodes.begin(), nodes.end()), seen_locals(locals.begin(), locals.end());
  if (seen_nodes.size() != nodes.size() || seen_locals.size() != locals.size()) return fail("repeated node or index");
  for (int n : nodes) {
    if (n < 0 || n >= net.num_nodes()) return fail("node " + std::to_string(n) + " outside the cluster");
    if (net.group_of_node(n) != net.group_of_node(nodes[0])) return fail("the nodes span several fabric groups");
  }
  std::vector<int> per_nic;
  for (int g : locals) {
    if (g < 0 || g >= net.devices_per_node()) return fail("local index " + std::to_string(g) + " outside the node");
    const int nic = net.nic_of(g);
    if (nic >= static_cast<int>(per_nic.size())) per_nic.resize(nic + 1, 0);
    ++per_nic[nic];
  }
  int c = 0;
  for (int count : per_nic) {
    if (count == 0) continue;
    if (c != 0 && count != c) return fail("NICs serve different numbers of rings; the rings are not symmetric");
    c = count;
  }
  const int dpn = net.devices_per_node();
  const int rep = nodes[0] * dpn + locals[0];
  PIPER_ASSIGN_OR_RETURN(Route into_rep, net.route(nodes.back() * dpn + locals[0], rep));
  const int nic_rx = into_rep.links.back();
  for (const Link& l : net.links()) {
    if (l.kind == LinkKind::kNicRx && l.bw_bytes_per_s != net.links()[nic_rx].bw_bytes_per_s) {
      return fail("NICs of different bandwidths; the rings are not symmetric");
    }
  }
  PIPER_ASSIGN_OR_RETURN(Route out_of_rep, net.route(rep, nodes[1] * dpn + locals[0]));
  const int n = static_cast<int>(nodes.size());
  const double members = static_cast<double>(n) * static_cast<double>(locals.size());
  CollectiveFlows out;
  int prev = -1;
  for (int k = 0; k < 2 * (n - 1); ++k) {
    FlowSpec f;
    f.hops = {{out_of_rep.links[0], static_cast<double>(c)},
              {out_of_rep.links[1], members},
              {nic_rx, static_cast<double>(c)}};
    f.bytes = bytes / n;
    f.latency_s = out_of_rep.latency_s;
    f.release_s = start.release_s;
    f.after = prev >= 0 ? std::vector<int>{prev} : start.after;
    PIPER_ASSIGN_OR_RETURN(prev, sim->add(std::move(f)));
    out.flows.push_back(prev);
    out.phases.push_back({prev});
  }
  return out;
}

}  // namespace piper::sim
