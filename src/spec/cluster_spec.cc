#include "piper/spec/cluster_spec.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "piper/spec/limits.h"

namespace piper {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// Every number of a cluster is finite and bounded (limits.h): a bandwidth of 1e300 or a NaN latency would make
// every simulated time 0 or NaN without a word.
Status positive(const std::string& field, double value, double max_value, const char* why) {
  if (std::isfinite(value) && value > 0 && value <= max_value) return ok_status();
  return invalid_argument("cluster." + field + ": " + num(value) + " is out of range; allowed (0, " + num(max_value) +
                          "] (" + why + ")");
}

Status non_negative(const std::string& field, double value, double max_value, const char* why) {
  if (std::isfinite(value) && value >= 0 && value <= max_value) return ok_status();
  return invalid_argument("cluster." + field + ": " + num(value) + " is out of range; allowed [0, " + num(max_value) +
                          "] (" + why + ")");
}

constexpr const char* kFlopsWhy = "FLOP/s per device; B200's fp8 dense peak is 4.5e15";
constexpr const char* kBwWhy = "bytes/s; HBM3e gives 8e12, NVLink 5 9e11 per direction";
constexpr const char* kLatencyWhy = "seconds per message; links take 1e-6..1e-5";

// node.shared_cores (0: off) and, with it, node.device_cores in (0, shared_cores].
Status validate_shared_cores(const NodeSpec& node) {
  PIPER_RETURN_IF_ERROR(non_negative("node.shared_cores", node.shared_cores, kMaxSharedCores,
                                     "cores the node's CPU ranks share; 0 = devices that do not share"));
  for (auto [name, v] :
       {std::pair{"node.sync_excess_all_to_all_s", node.sync_excess_all_to_all_s},
        std::pair{"node.sync_excess_other_s", node.sync_excess_other_s},
        std::pair{"node.sync_excess_pair_s", node.sync_excess_pair_s},
        std::pair{"node.busy_cpu_all_to_all_s", node.busy_cpu_all_to_all_s},
        std::pair{"node.busy_cpu_other_s", node.busy_cpu_other_s},
        std::pair{"node.busy_cpu_pair_s", node.busy_cpu_pair_s}, std::pair{"node.busy_cpu_p2p_s", node.busy_cpu_p2p_s},
        std::pair{"node.sync_excess_node_all_to_all_s", node.sync_excess_node_all_to_all_s},
        std::pair{"node.sync_excess_node_other_s", node.sync_excess_node_other_s},
        std::pair{"node.busy_cpu_node_all_to_all_s", node.busy_cpu_node_all_to_all_s},
        std::pair{"node.busy_cpu_node_other_s", node.busy_cpu_node_other_s}}) {
    PIPER_RETURN_IF_ERROR(non_negative(name, v, 1.0, "seconds a collective takes on top of its transfer (measured)"));
  }
  PIPER_RETURN_IF_ERROR(non_negative("node.a2a_wait_cpu_share", node.a2a_wait_cpu_share, 1.0,
                                     "CPU seconds per second a rank waits in an all-to-all (measured)"));
  if (Status st = check_exchange_lag(node.exchange_lag); !st.ok()) {
    return invalid_argument("cluster.node.exchange_lag: " + st.message());
  }
  for (auto [key, field] : NodeSpec::kCopyFigures) {
    PIPER_RETURN_IF_ERROR(non_negative(std::string("node.") + key, node.*field, 1e-6,
                                       "one core's seconds per byte a transfer carries (measured)"));
  }
  if (node.shared_cores == 0) return ok_status();
  if (!(std::isfinite(node.device_cores) && node.device_cores > 0 && node.device_cores <= node.shared_cores)) {
    return invalid_argument("cluster.node.device_cores: " + num(node.device_cores) + " is out of range; allowed (0, " +
                            num(node.shared_cores) +
                            "] (the cores one rank's kernels use alone, at most node.shared_cores)");
  }
  return ok_status();
}

// node.nodes_per_machine: 1, or with shared_cores a divisor of the nodes.
Status validate_nodes_per_machine(const ClusterSpec& c) {
  const int k = c.node.nodes_per_machine;
  if (k == 1) return ok_status();
  if (c.node.shared_cores == 0) {
    return invalid_argument("cluster.node.nodes_per_machine: " + std::to_string(k) +
                            " needs node.shared_cores (hosts of one machine share its cores); set it to 1");
  }
  if (k < 1 || c.num_nodes % k != 0) {
    return invalid_argument("cluster.node.nodes_per_machine: " + std::to_string(k) + " does not divide the " +
                            std::to_string(c.num_nodes) + " nodes; give 1 or a divisor of the node count");
  }
  return ok_status();
}

Status validate_counts(const ClusterSpec& c) {
  const int n = c.node.devices_per_node;
  if (n < 1 || n > kMaxDevicesPerNode) {
    return invalid_argument("cluster.node.devices_per_node: " + std::to_string(n) + " is out of range; allowed 1.." +
                            std::to_string(kMaxDevicesPerNode) + " (the largest published box has 72)");
  }
  if (c.max_nodes < 0 || c.max_nodes > kMaxNodes) {
    return invalid_argument("cluster.max_nodes: " + std::to_string(c.max_nodes) + " is out of range; allowed 0.." +
                            std::to_string(kMaxNodes) + " (0 = unbounded)");
  }
  if (c.fabric.nodes_per_group < 0 || c.fabric.nodes_per_group > kMaxNodes) {
    return invalid_argument("cluster.fabric.nodes_per_group: " + std::to_string(c.fabric.nodes_per_group) +
                            " is out of range; allowed 0.." + std::to_string(kMaxNodes) + " (0 = one group)");
  }
  const int per_domain = c.scale_up.nodes_per_domain;
  if (per_domain < 1 || per_domain > kMaxNodesPerDomain) {
    return invalid_argument("cluster.scale_up.nodes_per_domain: " + std::to_string(per_domain) +
                            " is out of range; allowed 1.." + std::to_string(kMaxNodesPerDomain) +
                            " (1 = each node is its own NVLink domain; GB200 NVL72 has 18 trays)");
  }
  if (c.scale_up.job_nodes_per_domain < 0 || c.scale_up.job_nodes_per_domain > per_domain) {
    return invalid_argument("cluster " + c.name + ": --domain-nodes " +
                            std::to_string(c.scale_up.job_nodes_per_domain) + " is out of range; allowed 1.." +
                            std::to_string(per_domain) + " (nodes of one scale-up domain; the domain has " +
                            std::to_string(per_domain) + ")");
  }
  if (static_cast<int64_t>(per_domain) * n > kMaxDevicesPerDomain) {
    return invalid_argument("cluster.scale_up.nodes_per_domain: " + std::to_string(per_domain) + " x " +
                            std::to_string(n) + " devices is out of range; allowed <= " +
                            std::to_string(kMaxDevicesPerDomain) + " devices per domain (NVL576 is the largest)");
  }
  if (per_domain > 1 && !c.node.pair_bw_bytes_per_s.empty()) {
    return invalid_argument("cluster.scale_up.nodes_per_domain: " + std::to_string(per_domain) +
                            " needs a switched node (node.intra); a per-pair matrix (node.pair_bw_bytes_per_s) "
                            "describes direct links inside one node only; drop one of them");
  }
  if (per_domain > 1 && !(c.node.intra.bw_bytes_per_s > 0)) {
    return invalid_argument("cluster.scale_up.nodes_per_domain: " + std::to_string(per_domain) +
                            " needs node.intra.bw_bytes_per_s > 0 (the domain's links)");
  }
  const int64_t world = static_cast<int64_t>(c.num_nodes) * n;
  if (c.num_nodes > kMaxNodes || world > kMaxWorldSize) {
    return invalid_argument("cluster " + c.name + ": --nodes " + std::to_string(c.num_nodes) + " x " +
                            std::to_string(n) + " devices = " + std::to_string(world) + " ranks is out of range; " +
                            "allowed up to " + std::to_string(kMaxNodes) + " nodes and " +
                            std::to_string(kMaxWorldSize) + " ranks (per-rank state is held for every rank)");
  }
  return ok_status();
}

}  // namespace

Status check_exchange_lag(const std::vector<std::pair<double, double>>& lag) {
  for (size_t i = 0; i < lag.size(); ++i) {
    const auto [task_s, lag_s] = lag[i];
    const std::string at = "entry " + std::to_string(i) + " {task_s " + num(task_s) + ", lag_s " + num(lag_s) + "}";
    if (!(task_s > 0 && task_s <= 1) || !(lag_s >= 0 && lag_s <= 1)) {
      return invalid_argument(at + " is out of range; allowed task_s in (0, 1], lag_s in [0, 1] (seconds, measured)");
    }
    if (i > 0 && !(task_s > lag[i - 1].first)) {
      return invalid_argument(at + ": task lengths must ascend (remeasure with `piper calibrate --ranks R`)");
    }
  }
  return ok_status();
}

const char* to_string(DType d) {
  switch (d) {
    case DType::kFP32:
      return "fp32";
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
    case DType::kFP8:
      return "fp8";
  }
  return "?";
}

int dtype_bytes(DType d) {
  switch (d) {
    case DType::kFP32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kFP16:
      return 2;
    case DType::kFP8:
      return 1;
  }
  return 0;
}

Result<DType> parse_dtype(const std::string& text, const std::string& what) {
  if (text == "fp32" || text == "float32") return DType::kFP32;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  if (text == "fp16" || text == "float16") return DType::kFP16;
  if (text == "fp8") return DType::kFP8;
  return invalid_argument(what + ": '" + text + "' is not a dtype; pick one of {fp32, bf16, fp16, fp8}");
}

const char* to_string(FabricTopology t) {
  switch (t) {
    case FabricTopology::kSingleNode:
      return "single-node";
    case FabricTopology::kFatTree:
      return "fat-tree";
    case FabricTopology::kDragonfly:
      return "dragonfly";
  }
  return "?";
}

double DeviceSpec::peak_flops(DType d) const {
  switch (d) {
    case DType::kFP32:
      return peak_flops_fp32;
    case DType::kBF16:
    case DType::kFP16:
      return peak_flops_bf16;
    case DType::kFP8:
      return peak_flops_fp8;
  }
  return 0;
}

double NodeSpec::static_core_share() const {
  if (!(shared_cores > 0)) return 1.0;
  return std::min(1.0, shared_cores / (device_cores * static_cast<double>(devices_per_node)));
}

double NodeSpec::pair_bw(int a, int b) const {
  if (pair_bw_bytes_per_s.empty()) return intra.bw_bytes_per_s;
  return pair_bw_bytes_per_s[a][b];
}

double NodeSpec::nic_bw_total() const {
  double total = 0;
  for (const auto& nic : nics) total += nic.bw_bytes_per_s;
  return total;
}

int NodeSpec::nic_of_device(int local_device) const {
  if (nics.empty()) return -1;
  for (size_t i = 0; i < nics.size(); ++i) {
    for (int d : nics[i].near_devices) {
      if (d == local_device) return static_cast<int>(i);
    }
  }
  return local_device % static_cast<int>(nics.size());
}

Status ClusterSpec::validate() const {
  if (name.empty()) return invalid_argument("cluster.name: required, a non-empty string");
  PIPER_RETURN_IF_ERROR(positive("device.peak_flops_fp32", device.peak_flops_fp32, kMaxFlops, kFlopsWhy));
  PIPER_RETURN_IF_ERROR(positive("device.peak_flops_bf16", device.peak_flops_bf16, kMaxFlops, kFlopsWhy));
  PIPER_RETURN_IF_ERROR(non_negative("device.peak_flops_fp8", device.peak_flops_fp8, kMaxFlops, kFlopsWhy));
  PIPER_RETURN_IF_ERROR(positive("device.memory_bytes", static_cast<double>(device.memory_bytes),
                                 static_cast<double>(kMaxMemoryBytes), "1 PiB; devices hold <= 288 GB"));
  PIPER_RETURN_IF_ERROR(positive("device.memory_bw_bytes_per_s", device.memory_bw_bytes_per_s, kMaxBandwidth, kBwWhy));
  if (!(device.gemm_efficiency > 0 && device.gemm_efficiency <= 1)) {
    return invalid_argument("cluster.device.gemm_efficiency: " + num(device.gemm_efficiency) + " must be in (0, 1]");
  }
  PIPER_RETURN_IF_ERROR(validate_counts(*this));
  const int n = node.devices_per_node;
  if (n > 1)
    PIPER_RETURN_IF_ERROR(positive("node.intra.bw_bytes_per_s", node.intra.bw_bytes_per_s, kMaxBandwidth, kBwWhy));
  PIPER_RETURN_IF_ERROR(non_negative("node.intra.latency_s", node.intra.latency_s, kMaxLatency, kLatencyWhy));
  if (!node.pair_bw_bytes_per_s.empty()) {
    if (static_cast<int>(node.pair_bw_bytes_per_s.size()) != n) {
      return invalid_argument("cluster.node.pair_bw_bytes_per_s: needs " + std::to_string(n) +
                              " rows (devices_per_node), got " + std::to_string(node.pair_bw_bytes_per_s.size()));
    }
    for (int a = 0; a < n; ++a) {
      if (static_cast<int>(node.pair_bw_bytes_per_s[a].size()) != n) {
        return invalid_argument("cluster.node.pair_bw_bytes_per_s[" + std::to_string(a) + "]: needs " +
                                std::to_string(n) + " columns");
      }
      for (int b = 0; b < n; ++b) {
        if (a != b) {
          PIPER_RETURN_IF_ERROR(
              positive("node.pair_bw_bytes_per_s[" + std::to_string(a) + "][" + std::to_string(b) + "]",
                       node.pair_bw_bytes_per_s[a][b], kMaxBandwidth, kBwWhy));
        }
      }
    }
  }
  for (size_t i = 0; i < node.nics.size(); ++i) {
    const std::string field = "node.nics[" + std::to_string(i) + "]";
    PIPER_RETURN_IF_ERROR(positive(field + ".bw_bytes_per_s", node.nics[i].bw_bytes_per_s, kMaxBandwidth, kBwWhy));
    for (int d : node.nics[i].near_devices) {
      if (d < 0 || d >= n) {
        return invalid_argument("cluster." + field + ".near_devices: device " + std::to_string(d) +
                                " is out of range; allowed 0.." + std::to_string(n - 1));
      }
    }
  }
  PIPER_RETURN_IF_ERROR(non_negative("node.nic_latency_s", node.nic_latency_s, kMaxLatency, kLatencyWhy));
  PIPER_RETURN_IF_ERROR(validate_shared_cores(node));
  PIPER_RETURN_IF_ERROR(validate_nodes_per_machine(*this));
  for (const auto& [field, taper] : {std::pair{"intra_group_taper", fabric.intra_group_taper},
                                     std::pair{"inter_group_taper", fabric.inter_group_taper}}) {
    if (!(taper >= 1 && taper <= kMaxTaper)) {
      return invalid_argument(std::string("cluster.fabric.") + field + ": " + num(taper) +
                              " is out of range; allowed [1, " + num(kMaxTaper) +
                              "] (1 = full bandwidth; published fabrics taper 1..4)");
    }
  }
  PIPER_RETURN_IF_ERROR(
      non_negative("fabric.inter_group_latency_s", fabric.inter_group_latency_s, kMaxLatency, kLatencyWhy));
  if (num_nodes < 1 || (max_nodes > 0 && num_nodes > max_nodes)) {
    std::string allowed = max_nodes > 0 ? "1.." + std::to_string(max_nodes) : ">= 1";
    return invalid_argument("cluster " + name + ": --nodes " + std::to_string(num_nodes) +
                            " is out of range; allowed " + allowed);
  }
  if (num_nodes > 1 && node.nics.empty()) {
    return invalid_argument("cluster " + name + ": " + std::to_string(num_nodes) +
                            " nodes need node.nics (the cluster has no inter-node network)");
  }
  return ok_status();
}

}  // namespace piper
