#include "piper/spec/cluster_spec.h"

#include <string>

namespace piper {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

Status positive(const std::string& field, double value) {
  if (value > 0) return ok_status();
  return invalid_argument("cluster." + field + ": " + num(value) + " must be > 0");
}

Status non_negative(const std::string& field, double value) {
  if (value >= 0) return ok_status();
  return invalid_argument("cluster." + field + ": " + num(value) + " must be >= 0");
}

}  // namespace

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
  PIPER_RETURN_IF_ERROR(positive("device.peak_flops_fp32", device.peak_flops_fp32));
  PIPER_RETURN_IF_ERROR(positive("device.peak_flops_bf16", device.peak_flops_bf16));
  PIPER_RETURN_IF_ERROR(non_negative("device.peak_flops_fp8", device.peak_flops_fp8));
  PIPER_RETURN_IF_ERROR(positive("device.memory_bytes", static_cast<double>(device.memory_bytes)));
  PIPER_RETURN_IF_ERROR(positive("device.memory_bw_bytes_per_s", device.memory_bw_bytes_per_s));
  if (!(device.gemm_efficiency > 0 && device.gemm_efficiency <= 1)) {
    return invalid_argument("cluster.device.gemm_efficiency: " + num(device.gemm_efficiency) + " must be in (0, 1]");
  }
  const int n = node.devices_per_node;
  if (n < 1) return invalid_argument("cluster.node.devices_per_node: " + std::to_string(n) + " must be >= 1");
  if (n > 1) PIPER_RETURN_IF_ERROR(positive("node.intra.bw_bytes_per_s", node.intra.bw_bytes_per_s));
  PIPER_RETURN_IF_ERROR(non_negative("node.intra.latency_s", node.intra.latency_s));
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
                       node.pair_bw_bytes_per_s[a][b]));
        }
      }
    }
  }
  for (size_t i = 0; i < node.nics.size(); ++i) {
    const std::string field = "node.nics[" + std::to_string(i) + "]";
    PIPER_RETURN_IF_ERROR(positive(field + ".bw_bytes_per_s", node.nics[i].bw_bytes_per_s));
    for (int d : node.nics[i].near_devices) {
      if (d < 0 || d >= n) {
        return invalid_argument("cluster." + field + ".near_devices: device " + std::to_string(d) +
                                " is out of range; allowed 0.." + std::to_string(n - 1));
      }
    }
  }
  PIPER_RETURN_IF_ERROR(non_negative("node.nic_latency_s", node.nic_latency_s));
  if (fabric.nodes_per_group < 0) {
    return invalid_argument("cluster.fabric.nodes_per_group: " + std::to_string(fabric.nodes_per_group) +
                            " must be >= 0 (0 = one group)");
  }
  if (!(fabric.intra_group_taper >= 1) || !(fabric.inter_group_taper >= 1)) {
    return invalid_argument(
        "cluster.fabric: intra_group_taper and inter_group_taper must be >= 1 (1 = full bandwidth)");
  }
  PIPER_RETURN_IF_ERROR(non_negative("fabric.inter_group_latency_s", fabric.inter_group_latency_s));
  if (max_nodes < 0)
    return invalid_argument("cluster.max_nodes: " + std::to_string(max_nodes) + " must be >= 0 (0 = unbounded)");
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
