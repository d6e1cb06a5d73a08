#include "piper/spec/cluster_loader.h"

#include "piper/spec/limits.h"
#include "piper/spec/model_loader.h"
#include "piper/spec/presets.h"

namespace piper {
namespace {

Status read_device(const Json& json, DeviceSpec* d) {
  JsonReader r(json, "cluster.device");
  PIPER_RETURN_IF_ERROR(r.get_string("name", &d->name, true));
  PIPER_RETURN_IF_ERROR(r.get_double("peak_flops_fp32", &d->peak_flops_fp32, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_double("peak_flops_bf16", &d->peak_flops_bf16, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_double("peak_flops_fp8", &d->peak_flops_fp8, true, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("memory_bytes", &d->memory_bytes, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_double("memory_bw_bytes_per_s", &d->memory_bw_bytes_per_s, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_double("gemm_efficiency", &d->gemm_efficiency, false, 1e-6, 1));
  return r.check_no_unknown_keys();
}

Status read_link(const Json& json, const std::string& path, LinkSpec* link) {
  JsonReader r(json, path);
  PIPER_RETURN_IF_ERROR(r.get_double("bw_bytes_per_s", &link->bw_bytes_per_s, true, 0));
  PIPER_RETURN_IF_ERROR(r.get_double("latency_s", &link->latency_s, true, 0));
  return r.check_no_unknown_keys();
}

// node.exchange_lag: [[task_s, lag_s], ...] (NodeSpec::exchange_lag).
Status read_exchange_lag(JsonReader& r, NodeSpec* n) {
  const Json* lag = r.find("exchange_lag");
  if (lag == nullptr) return ok_status();
  const std::string path = r.field_path("exchange_lag");
  if (!lag->is_array()) return invalid_argument(path + ": expected an array of [task_s, lag_s] pairs");
  for (const Json& point : *lag) {
    if (!point.is_array() || point.size() != 2 || !point[0].is_number() || !point[1].is_number()) {
      return invalid_argument(path + ": expected an array of [task_s, lag_s] pairs (numbers, seconds)");
    }
    n->exchange_lag.emplace_back(point[0].get<double>(), point[1].get<double>());
  }
  if (Status st = check_exchange_lag(n->exchange_lag); !st.ok()) return invalid_argument(path + ": " + st.message());
  return ok_status();
}

Status read_node(const Json& json, NodeSpec* n) {
  JsonReader r(json, "cluster.node");
  PIPER_RETURN_IF_ERROR(r.get_int("devices_per_node", &n->devices_per_node, true, 1, kMaxDevicesPerNode));
  const Json* intra = r.find("intra");
  if (intra == nullptr) return invalid_argument("cluster.node.intra: required object {bw_bytes_per_s, latency_s}");
  PIPER_RETURN_IF_ERROR(read_link(*intra, "cluster.node.intra", &n->intra));
  if (const Json* pairs = r.find("pair_bw_bytes_per_s")) {
    if (!pairs->is_array()) return invalid_argument("cluster.node.pair_bw_bytes_per_s: expected an array of arrays");
    for (const Json& row : *pairs) {
      if (!row.is_array()) return invalid_argument("cluster.node.pair_bw_bytes_per_s: expected an array of arrays");
      std::vector<double> values;
      for (const Json& v : row) {
        if (!v.is_number())
          return invalid_argument("cluster.node.pair_bw_bytes_per_s: expected numbers, got " + v.dump());
        values.push_back(v.get<double>());
      }
      n->pair_bw_bytes_per_s.push_back(values);
    }
  }
  const Json* nics = r.find("nics");
  if (nics == nullptr || !nics->is_array()) {
    return invalid_argument("cluster.node.nics: required array of {bw_bytes_per_s, near_devices} ([] for none)");
  }
  for (size_t i = 0; i < nics->size(); ++i) {
    JsonReader nr((*nics)[i], "cluster.node.nics[" + std::to_string(i) + "]");
    NicSpec nic;
    PIPER_RETURN_IF_ERROR(nr.get_double("bw_bytes_per_s", &nic.bw_bytes_per_s, true, 0));
    if (const Json* near = nr.find("near_devices")) {
      if (!near->is_array())
        return invalid_argument(nr.field_path("near_devices") + ": expected an array of device indices");
      for (const Json& d : *near) {
        if (!d.is_number_integer()) return invalid_argument(nr.field_path("near_devices") + ": expected integers");
        const int64_t device = d.get<int64_t>();  // checked before narrowing: 2^32 must not wrap to device 0
        if (device < 0 || device >= n->devices_per_node) {
          return invalid_argument(nr.field_path("near_devices") + ": device " + std::to_string(device) +
                                  " is out of range; allowed 0.." + std::to_string(n->devices_per_node - 1));
        }
        nic.near_devices.push_back(static_cast<int>(device));
      }
    }
    PIPER_RETURN_IF_ERROR(nr.check_no_unknown_keys());
    n->nics.push_back(nic);
  }
  PIPER_RETURN_IF_ERROR(r.get_double("nic_latency_s", &n->nic_latency_s, !n->nics.empty(), 0));
  PIPER_RETURN_IF_ERROR(r.get_double("shared_cores", &n->shared_cores, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_double("device_cores", &n->device_cores, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("nodes_per_machine", &n->nodes_per_machine, false, 1));
  PIPER_RETURN_IF_ERROR(r.get_double("sync_excess_all_to_all_s", &n->sync_excess_all_to_all_s, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_double("sync_excess_other_s", &n->sync_excess_other_s, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_double("sync_excess_pair_s", &n->sync_excess_pair_s, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_double("busy_cpu_all_to_all_s", &n->busy_cpu_all_to_all_s, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_double("busy_cpu_other_s", &n->busy_cpu_other_s, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_double("busy_cpu_pair_s", &n->busy_cpu_pair_s, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_double("busy_cpu_p2p_s", &n->busy_cpu_p2p_s, false, 0));
  for (auto [key, field] : NodeSpec::kNodeFigures) {
    n->node_figures = n->node_figures || r.find(key) != nullptr;
    PIPER_RETURN_IF_ERROR(r.get_double(key, &(n->*field), false, 0));
  }
  for (auto [key, field] : NodeSpec::kCopyFigures) PIPER_RETURN_IF_ERROR(r.get_double(key, &(n->*field), false, 0));
  PIPER_RETURN_IF_ERROR(read_exchange_lag(r, n));
  PIPER_RETURN_IF_ERROR(r.get_double("a2a_wait_cpu_share", &n->a2a_wait_cpu_share, false, 0));
  return r.check_no_unknown_keys();
}

Status read_fabric(const Json& json, FabricSpec* f) {
  JsonReader r(json, "cluster.fabric");
  std::string topo;
  PIPER_RETURN_IF_ERROR(r.get_enum("topology", &topo, {"single-node", "fat-tree", "dragonfly"}, true));
  f->topology = topo == "dragonfly"     ? FabricTopology::kDragonfly
                : topo == "single-node" ? FabricTopology::kSingleNode
                                        : FabricTopology::kFatTree;
  PIPER_RETURN_IF_ERROR(r.get_int("nodes_per_group", &f->nodes_per_group, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_double("intra_group_taper", &f->intra_group_taper, false, 1));
  PIPER_RETURN_IF_ERROR(r.get_double("inter_group_taper", &f->inter_group_taper, false, 1));
  PIPER_RETURN_IF_ERROR(r.get_double("inter_group_latency_s", &f->inter_group_latency_s, false, 0));
  if (f->topology == FabricTopology::kDragonfly && f->nodes_per_group < 1) {
    return invalid_argument("cluster.fabric.nodes_per_group: required (>= 1) for topology=dragonfly");
  }
  return r.check_no_unknown_keys();
}

Status read_scale_up(const Json& json, ScaleUpSpec* u) {
  JsonReader r(json, "cluster.scale_up");
  PIPER_RETURN_IF_ERROR(r.get_string("name", &u->name, false));
  PIPER_RETURN_IF_ERROR(r.get_int("nodes_per_domain", &u->nodes_per_domain, true, 1, kMaxNodesPerDomain));
  return r.check_no_unknown_keys();
}

}  // namespace

Result<ClusterSpec> cluster_from_json(const Json& json, int num_nodes, const std::string& what) {
  if (!json.is_object()) return invalid_argument(what + ": a cluster must be a JSON object");
  ClusterSpec c;
  c.num_nodes = num_nodes;
  JsonReader r(json, "cluster");
  Status s = [&]() -> Status {
    PIPER_RETURN_IF_ERROR(r.get_string("name", &c.name, true));
    std::string source;
    PIPER_RETURN_IF_ERROR(r.get_string("source", &source, false));
    PIPER_RETURN_IF_ERROR(r.get_int("max_nodes", &c.max_nodes, false, 0, kMaxNodes));
    const Json* device = r.find("device");
    const Json* node = r.find("node");
    const Json* fabric = r.find("fabric");
    if (device == nullptr || node == nullptr || fabric == nullptr) {
      return invalid_argument("cluster: the objects device, node and fabric are required");
    }
    PIPER_RETURN_IF_ERROR(read_device(*device, &c.device));
    PIPER_RETURN_IF_ERROR(read_node(*node, &c.node));
    if (const Json* scale_up = r.find("scale_up")) PIPER_RETURN_IF_ERROR(read_scale_up(*scale_up, &c.scale_up));
    PIPER_RETURN_IF_ERROR(read_fabric(*fabric, &c.fabric));
    PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
    return c.validate();
  }();
  if (!s.ok()) return s.with_context(what);
  return c;
}

Result<ClusterSpec> load_cluster(const std::string& name_or_path, int num_nodes) {
  std::string text, what;
  if (looks_like_path(name_or_path)) {
    PIPER_ASSIGN_OR_RETURN(text, read_text_file(name_or_path));
    what = name_or_path;
  } else {
    PIPER_ASSIGN_OR_RETURN(text, cluster_preset_text(name_or_path));
    what = "preset " + name_or_path;
  }
  PIPER_ASSIGN_OR_RETURN(Json json, parse_json(text, what));
  return cluster_from_json(json, num_nodes, what);
}

OrderedJson to_json(const ClusterSpec& c) {
  OrderedJson j;
  j["name"] = c.name;
  j["max_nodes"] = c.max_nodes;
  j["device"] = {{"name", c.device.name},
                 {"peak_flops_fp32", c.device.peak_flops_fp32},
                 {"peak_flops_bf16", c.device.peak_flops_bf16},
                 {"peak_flops_fp8", c.device.peak_flops_fp8},
                 {"memory_bytes", c.device.memory_bytes},
                 {"memory_bw_bytes_per_s", c.device.memory_bw_bytes_per_s},
                 {"gemm_efficiency", c.device.gemm_efficiency}};
  OrderedJson node;
  node["devices_per_node"] = c.node.devices_per_node;
  node["intra"] = {{"bw_bytes_per_s", c.node.intra.bw_bytes_per_s}, {"latency_s", c.node.intra.latency_s}};
  if (!c.node.pair_bw_bytes_per_s.empty()) node["pair_bw_bytes_per_s"] = c.node.pair_bw_bytes_per_s;
  node["nics"] = OrderedJson::array();
  for (const auto& nic : c.node.nics) {
    node["nics"].push_back({{"bw_bytes_per_s", nic.bw_bytes_per_s}, {"near_devices", nic.near_devices}});
  }
  node["nic_latency_s"] = c.node.nic_latency_s;
  if (c.node.shared_cores > 0) {
    node["shared_cores"] = c.node.shared_cores;
    node["device_cores"] = c.node.device_cores;
    if (c.node.nodes_per_machine != 1) node["nodes_per_machine"] = c.node.nodes_per_machine;
  }
  if (c.node.sync_excess_all_to_all_s > 0 || c.node.sync_excess_other_s > 0 || c.node.sync_excess_pair_s > 0) {
    node["sync_excess_all_to_all_s"] = c.node.sync_excess_all_to_all_s;
    node["sync_excess_other_s"] = c.node.sync_excess_other_s;
    node["sync_excess_pair_s"] = c.node.sync_excess_pair_s;
  }
  if (c.node.busy_cpu_all_to_all_s > 0 || c.node.busy_cpu_other_s > 0 || c.node.busy_cpu_pair_s > 0 ||
      c.node.busy_cpu_p2p_s > 0) {
    node["busy_cpu_all_to_all_s"] = c.node.busy_cpu_all_to_all_s;
    node["busy_cpu_other_s"] = c.node.busy_cpu_other_s;
    node["busy_cpu_pair_s"] = c.node.busy_cpu_pair_s;
    node["busy_cpu_p2p_s"] = c.node.busy_cpu_p2p_s;
  }
  for (auto [key, field] : NodeSpec::kNodeFigures) {
    if (c.node.node_figures) node[key] = c.node.*field;
  }
  for (auto [key, field] : NodeSpec::kCopyFigures) {
    if (c.node.*field > 0) node[key] = c.node.*field;
  }
  if (c.node.a2a_wait_cpu_share > 0) node["a2a_wait_cpu_share"] = c.node.a2a_wait_cpu_share;
  if (!c.node.exchange_lag.empty()) {
    node["exchange_lag"] = OrderedJson::array();
    for (auto [task_s, lag_s] : c.node.exchange_lag) node["exchange_lag"].push_back({task_s, lag_s});
  }
  j["node"] = node;
  if (c.scale_up.nodes_per_domain > 1) {
    j["scale_up"] = {{"name", c.scale_up.name}, {"nodes_per_domain", c.scale_up.nodes_per_domain}};
  }
  j["fabric"] = {{"topology", to_string(c.fabric.topology)},
                 {"nodes_per_group", c.fabric.nodes_per_group},
                 {"intra_group_taper", c.fabric.intra_group_taper},
                 {"inter_group_taper", c.fabric.inter_group_taper},
                 {"inter_group_latency_s", c.fabric.inter_group_latency_s}};
  return j;
}

}  // namespace piper
