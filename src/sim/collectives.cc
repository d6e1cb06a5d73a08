#include "piper/sim/collectives.h"

#include <algorithm>
#include <cmath>
#include <map>
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
  return sim->add(std::move(f));
}

// n-1 ring steps of bytes/n each; `prev` holds, per rank, the flow it received in the step before (or -1).
Status add_ring_steps(const Network& net, FlowSim* sim, const std::vector<int>& devices, double bytes,
                      const CollectiveStart& start, std::vector<int>* prev, CollectiveFlows* out) {
  const int n = static_cast<int>(devices.size());
  for (int k = 0; k < n - 1; ++k) {
    std::vector<int> sent(n);
    for (int i = 0; i < n; ++i) {
      std::vector<int> after = start.after;
      if ((*prev)[i] >= 0) after = {(*prev)[i]};  // what rank i forwards arrived in that flow
      PIPER_ASSIGN_OR_RETURN(sent[i], add_routed(net, sim, devices[i], devices[(i + 1) % n], bytes / n, start.release_s,
                                                 std::move(after)));
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

Result<CollectiveFlows> add_ring_all_reduce(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            double bytes, const CollectiveStart& start) {
  return ring(net, sim, devices, bytes, start, 2, "ring all-reduce");
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

Result<CollectiveFlows> add_all_to_all_halo(const Network& net, FlowSim* sim, const std::vector<int>& devices,
                                            const std::vector<std::vector<double>>& bytes_matrix,
                                            const CollectiveStart& start) {
  const char* what = "HALO all-to-all";
  PIPER_RETURN_IF_ERROR(check_group(net, devices, what));
  PIPER_RETURN_IF_ERROR(check_matrix(bytes_matrix, devices.size(), devices.size(), what));
  // Members per node, by node, in device order: local index = position among the node's members.
  std::map<int, std::vector<int>> by_node;  // node -> member positions in `devices`
  std::vector<int> sorted_pos(devices.size());
  for (size_t p = 0; p < devices.size(); ++p) sorted_pos[p] = static_cast<int>(p);
  std::sort(sorted_pos.begin(), sorted_pos.end(), [&](int a, int b) { return devices[a] < devices[b]; });
  for (int p : sorted_pos) by_node[net.node_of(devices[p])].push_back(p);
  const size_t k = by_node.begin()->second.size();
  for (const auto& [node, members] : by_node) {
    if (members.size() != k) {
      return invalid_argument(std::string(what) + ": node " + std::to_string(node) + " has " +
                              std::to_string(members.size()) + " members of the group, node " +
                              std::to_string(by_node.begin()->first) + " has " + std::to_string(k) +
                              "; HALO needs the same number on every node (use the flat all-to-all)");
    }
  }
  std::vector<std::vector<int>> member;  // [node of the group][local index] -> position in devices
  for (const auto& entry : by_node) member.push_back(entry.second);
  const int num_nodes = static_cast<int>(member.size());
  CollectiveFlows out;
  out.phases.assign(3, {});
  // Phase I: same-node traffic, direct.
  for (int a = 0; a < num_nodes; ++a) {
    for (size_t i = 0; i < k; ++i) {
      for (size_t j = 0; j < k; ++j) {
        const int src = member[a][i], dst = member[a][j];
        if (i == j || bytes_matrix[src][dst] == 0) continue;
        PIPER_ASSIGN_OR_RETURN(int id, add_routed(net, sim, devices[src], devices[dst], bytes_matrix[src][dst],
                                                  start.release_s, start.after));
        out.phases[0].push_back(id);
      }
    }
  }
  // Phase II: rail-aligned, one batched message per (source member, destination node).
  std::vector<std::vector<int>> arrivals(devices.size());  // phase II flows into each member
  for (int a = 0; a < num_nodes; ++a) {
    for (int b = 0; b < num_nodes; ++b) {
      if (a == b) continue;
      for (size_t i = 0; i < k; ++i) {
        double batch = 0;
        for (size_t j = 0; j < k; ++j) batch += bytes_matrix[member[a][i]][member[b][j]];
        if (batch == 0) continue;
        const int src = member[a][i], relay = member[b][i];
        PIPER_ASSIGN_OR_RETURN(int id,
                               add_routed(net, sim, devices[src], devices[relay], batch, start.release_s, start.after));
        out.phases[1].push_back(id);
        arrivals[relay].push_back(id);
      }
    }
  }
  // Phase III: each relay scatters inside its node what arrived for its neighbours.
  for (int b = 0; b < num_nodes; ++b) {
    for (size_t i = 0; i < k; ++i) {
      const int relay = member[b][i];
      for (size_t j = 0; j < k; ++j) {
        if (i == j) continue;
        double forward = 0;
        for (int a = 0; a < num_nodes; ++a) {
          if (a != b) forward += bytes_matrix[member[a][i]][member[b][j]];
        }
        if (forward == 0) continue;
        std::vector<int> after = arrivals[relay];
        if (after.empty()) after = start.after;
        PIPER_ASSIGN_OR_RETURN(int id, add_routed(net, sim, devices[relay], devices[member[b][j]], forward,
                                                  start.release_s, std::move(after)));
        out.phases[2].push_back(id);
      }
    }
  }
  for (const auto& phase : out.phases) out.flows.insert(out.flows.end(), phase.begin(), phase.end());
  return out;
}

}  // namespace piper::sim
