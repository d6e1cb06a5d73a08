#include "piper/spec/comm_calibration.h"

namespace piper {
namespace {

constexpr double kTiny = 1e-300;

Status prefixed(Status s, const std::string& what) {
  if (s.ok()) return s;
  return invalid_argument(what + ": " + s.message() + " (a file written by `piper bench comm --calibration-out`)");
}

}  // namespace

Status apply_comm_calibration(const Json& json, const std::string& what, ClusterSpec* cluster) {
  if (!json.is_object()) return invalid_argument(what + ": a communication calibration must be a JSON object");
  JsonReader top(json, "calibration");
  std::string source;
  int64_t ranks = 0, ranks_per_node = 0;
  PIPER_RETURN_IF_ERROR(prefixed(top.get_string("source", &source, false), what));
  PIPER_RETURN_IF_ERROR(prefixed(top.get_int("ranks", &ranks, false, 1), what));
  PIPER_RETURN_IF_ERROR(prefixed(top.get_int("ranks_per_node", &ranks_per_node, false, 1), what));
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

Status load_comm_calibration(const std::string& path, ClusterSpec* cluster) {
  PIPER_ASSIGN_OR_RETURN(Json json, load_json_file(path));
  return apply_comm_calibration(json, path, cluster);
}

}  // namespace piper
