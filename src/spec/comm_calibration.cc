#include "piper/spec/comm_calibration.h"

#include <cmath>
#include <utility>
#include <vector>

namespace piper {
namespace {

constexpr double kTiny = 1e-300;

Status prefixed(Status s, const std::string& what) {
  if (s.ok()) return s;
  return invalid_argument(what + ": " + s.message() + " (a file written by `piper bench comm --calibration-out`)");
}

// The measured excesses a calibration file applies (piper calibrate --ranks R): measured.<key>.excess_s -> a node
// field.
struct ExcessKey {
  const char* key;
  const char* value;  // the figure inside it
  double NodeSpec::*field;
};
constexpr ExcessKey kExcessKeys[] = {
    {"sync_all_to_all", "excess_s", &NodeSpec::sync_excess_all_to_all_s},
    {"sync_all_reduce", "excess_s", &NodeSpec::sync_excess_other_s},
    {"sync_all_reduce_pairs", "excess_s", &NodeSpec::sync_excess_pair_s},
    {"contended_all_to_all", "cpu_s", &NodeSpec::busy_cpu_all_to_all_s},
    {"contended_all_reduce", "cpu_s", &NodeSpec::busy_cpu_other_s},
    {"contended_all_reduce_pairs", "cpu_s", &NodeSpec::busy_cpu_pair_s},
    {"contended_p2p", "cpu_s", &NodeSpec::busy_cpu_p2p_s},
    {"node_sync_all_to_all", "excess_s", &NodeSpec::sync_excess_node_all_to_all_s},
    {"node_sync_all_reduce", "excess_s", &NodeSpec::sync_excess_node_other_s},
    {"node_contended_all_to_all", "cpu_s", &NodeSpec::busy_cpu_node_all_to_all_s},
    {"node_contended_all_reduce", "cpu_s", &NodeSpec::busy_cpu_node_other_s},
};

bool is_node_field(double NodeSpec::*field) {
  for (auto [key, node_field] : NodeSpec::kNodeFigures) {
    if (field == node_field) return true;
  }
  return false;
}

// measured.exchange_chain.points[i].{task_s, lag_s} (ascending task_s > 0, lag in [0, 1]) -> NodeSpec::exchange_lag,
// and measured.exchange_chain.wait_cpu_share (in [0, 1]) -> NodeSpec::a2a_wait_cpu_share.
Result<std::vector<std::pair<double, double>>> read_exchange_lag(const Json& measured, const std::string& what,
                                                                 double* wait_cpu_share) {
  std::vector<std::pair<double, double>> lag;
  *wait_cpu_share = 0;
  auto it = measured.find("exchange_chain");
  if (it == measured.end()) return lag;
  const std::string field = "calibration.measured.exchange_chain.points";
  if (!it->is_object() || !it->contains("points") || !(*it)["points"].is_array()) {
    return invalid_argument(what + ": " + field + " must be an array of {task_s, lag_s}");
  }
  for (const Json& point : (*it)["points"]) {
    if (!point.is_object() || !point.contains("task_s") || !point.contains("lag_s") || !point["task_s"].is_number() ||
        !point["lag_s"].is_number()) {
      return invalid_argument(what + ": " + field + " entries need numbers task_s and lag_s");
    }
    lag.emplace_back(point["task_s"].get<double>(), point["lag_s"].get<double>());
  }
  if (Status st = check_exchange_lag(lag); !st.ok()) return invalid_argument(what + ": " + field + ": " + st.message());
  if (it->contains("wait_cpu_share")) {
    const Json& share = (*it)["wait_cpu_share"];
    if (!share.is_number() || !(share.get<double>() >= 0 && share.get<double>() <= 1)) {
      return invalid_argument(what + ": calibration.measured.exchange_chain.wait_cpu_share = " + share.dump() +
                              " is out of range; allowed a number in [0, 1] (CPU seconds per second waited)");
    }
    *wait_cpu_share = share.get<double>();
  }
  return lag;
}

// measured.<kExcessKeys key>.<value>: applied to a node of the measured number of ranks only (the excess depends on how
// many ranks share the cores).
Status apply_sync_excess(const Json& measured, const std::string& what, int ranks_per_node, ClusterSpec* cluster,
                         CommCalibrationInfo* info) {
  if (!measured.is_object()) return invalid_argument(what + ": calibration.measured must be an object");
  std::vector<std::pair<double NodeSpec::*, double>> found;
  for (const ExcessKey& k : kExcessKeys) {
    auto it = measured.find(k.key);
    if (it == measured.end()) continue;
    const std::string field = std::string("calibration.measured.") + k.key + "." + k.value;
    if (!it->is_object() || !it->contains(k.value) || !(*it)[k.value].is_number()) {
      return invalid_argument(what + ": " + field + " must be a number");
    }
    const double excess = (*it)[k.value].get<double>();
    if (!std::isfinite(excess) || excess < 0 || excess > 1) {
      return invalid_argument(what + ": " + field + " = " + std::to_string(excess) +
                              " is out of range; allowed [0, 1]");
    }
    found.emplace_back(k.field, excess);
  }
  double wait_cpu_share = 0;
  PIPER_ASSIGN_OR_RETURN(auto lag, read_exchange_lag(measured, what, &wait_cpu_share));
  if (found.empty() && lag.empty() && wait_cpu_share == 0) return ok_status();
  if (info != nullptr) {
    info->sync_measured = true;
    info->sync_ranks_per_node = ranks_per_node;
  }
  if (ranks_per_node != cluster->node.devices_per_node) return ok_status();
  // The file's figures replace the node's whole set: figures inside a node left from another calibration go.
  NodeSpec& n = cluster->node;
  n.node_figures = false;
  for (auto [key, field] : NodeSpec::kNodeFigures) n.*field = 0;
  n.exchange_lag = std::move(lag);
  n.a2a_wait_cpu_share = wait_cpu_share;
  for (auto [field, excess] : found) {
    n.*field = excess;
    n.node_figures = n.node_figures || is_node_field(field);
  }
  if (info != nullptr) info->sync_applied = true;
  return ok_status();
}

}  // namespace

Status apply_comm_calibration(const Json& json, const std::string& what, ClusterSpec* cluster,
                              CommCalibrationInfo* info) {
  if (info != nullptr) *info = {};
  if (!json.is_object()) return invalid_argument(what + ": a communication calibration must be a JSON object");
  JsonReader top(json, "calibration");
  std::string source;
  int64_t ranks = 0, ranks_per_node = 0;
  PIPER_RETURN_IF_ERROR(prefixed(top.get_string("source", &source, false), what));
  PIPER_RETURN_IF_ERROR(prefixed(top.get_int("ranks", &ranks, false, 1), what));
  PIPER_RETURN_IF_ERROR(prefixed(top.get_int("ranks_per_node", &ranks_per_node, false, 1), what));
  if (const Json* measured = top.find("measured")) {
    PIPER_RETURN_IF_ERROR(apply_sync_excess(*measured, what, static_cast<int>(ranks_per_node), cluster, info));
  }
  if (const Json* node = top.find("node")) {
    if (!node->is_object()) return invalid_argument(what + ": calibration.node must be an object");
    JsonReader n(*node, "calibration.node");
    if (const Json* intra = n.find("intra")) {
      if (!intra->is_object()) return invalid_argument(what + ": calibration.node.intra must be an object");
      JsonReader i(*intra, "calibration.node.intra");
      PIPER_RETURN_IF_ERROR(prefixed(i.get_double("latency_s", &cluster->node.intra.latency_s, false, 0), what));
      PIPER_RETURN_IF_ERROR(
          prefixed(i.get_double("bw_bytes_per_s", &cluster->node.intra.bw_bytes_per_s, false, kTiny), what));
      PIPER_RETURN_IF_ERROR(prefixed(i.check_no_unknown_keys(), what));
    }
    PIPER_RETURN_IF_ERROR(prefixed(n.get_double("nic_latency_s", &cluster->node.nic_latency_s, false, 0), what));
    for (auto [key, field] : NodeSpec::kCopyFigures) {
      PIPER_RETURN_IF_ERROR(prefixed(n.get_double(key, &(cluster->node.*field), false, 0, 1e-6), what));
    }
    double nic_bw = 0;
    PIPER_RETURN_IF_ERROR(prefixed(n.get_double("nic_bw_bytes_per_s", &nic_bw, false, kTiny), what));
    if (nic_bw > 0) {
      if (cluster->node.nics.empty()) {
        return invalid_argument(what + ": calibration.node.nic_bw_bytes_per_s is set but cluster '" + cluster->name +
                                "' has no NICs (node.nics); calibrate a multi-node cluster");
      }
      for (NicSpec& nic : cluster->node.nics) nic.bw_bytes_per_s = nic_bw;
    }
    PIPER_RETURN_IF_ERROR(prefixed(n.check_no_unknown_keys(), what));
  }
  PIPER_RETURN_IF_ERROR(prefixed(top.check_no_unknown_keys(), what));
  return cluster->validate();
}

Status load_comm_calibration(const std::string& path, ClusterSpec* cluster, CommCalibrationInfo* info) {
  PIPER_ASSIGN_OR_RETURN(Json json, load_json_file(path));
  return apply_comm_calibration(json, path, cluster, info);
}

}  // namespace piper
