// ClusterSpec: devices, nodes, NICs and the fabric between nodes.
//
// Bandwidths are bytes per second per direction; latencies are seconds. A cluster is a preset
// (configs/clusters/) with num_nodes set from --nodes. Topology levels, innermost first:
//   device-to-device inside a node (intra_node link, or a per-pair matrix when links differ, as on Frontier),
//   node-to-node inside a group through the NICs, group-to-group through the (possibly tapered) global links.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"

namespace piper {

enum class DType { kFP32, kBF16, kFP16, kFP8 };
const char* to_string(DType d);
int dtype_bytes(DType d);
Result<DType> parse_dtype(const std::string& text, const std::string& what);

struct LinkSpec {
  double bw_bytes_per_s = 0;  // per direction
  double latency_s = 0;
};

struct DeviceSpec {
  std::string name;
  double peak_flops_fp32 = 0;  // FLOP/s, dense
  double peak_flops_bf16 = 0;
  double peak_flops_fp8 = 0;  // 0 when unsupported
  int64_t memory_bytes = 0;
  double memory_bw_bytes_per_s = 0;
  // Fraction of peak a large, square GEMM reaches; shape-dependent efficiency is derated from this (cost/).
  double gemm_efficiency = 0.8;
  double peak_flops(DType d) const;
};

struct NicSpec {
  double bw_bytes_per_s = 0;      // per direction
  std::vector<int> near_devices;  // local device indices attached closest to this NIC
};

struct NodeSpec {
  int devices_per_node = 1;
  LinkSpec intra;  // device-to-device link used when no per-pair matrix is given
  // Optional [devices_per_node][devices_per_node] per-pair bandwidth (bytes/s, per direction); empty = uniform.
  std::vector<std::vector<double>> pair_bw_bytes_per_s;
  std::vector<NicSpec> nics;
  double nic_latency_s = 0;  // one inter-node hop, software + wire

  double pair_bw(int a, int b) const;         // bandwidth between two local devices
  double nic_bw_total() const;                // sum over NICs
  int nic_of_device(int local_device) const;  // index of the NIC nearest to a device (round-robin if unspecified)
};

enum class FabricTopology { kSingleNode, kFatTree, kDragonfly };
const char* to_string(FabricTopology t);

struct FabricSpec {
  FabricTopology topology = FabricTopology::kFatTree;
  int nodes_per_group = 0;         // dragonfly group (or fat-tree pod) size in nodes; 0 = one group
  double intra_group_taper = 1.0;  // injection bandwidth / bisection bandwidth inside a group (>= 1)
  double inter_group_taper = 1.0;  // injection bandwidth / global bandwidth between groups (Frontier ~1.75)
  double inter_group_latency_s = 0;
};

struct ClusterSpec {
  std::string name;
  DeviceSpec device;
  NodeSpec node;
  FabricSpec fabric;
  int num_nodes = 1;
  int max_nodes = 0;  // 0 = unbounded; presets of a fixed box (local-cpu) set it

  int world_size() const { return num_nodes * node.devices_per_node; }
  Status validate() const;
};

}  // namespace piper
