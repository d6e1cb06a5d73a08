// ClusterSpec: devices, nodes, NICs and the fabric between nodes.
//
// Bandwidths are bytes per second per direction; latencies are seconds. A cluster is a preset
// (configs/clusters/) with num_nodes set from --nodes. Topology levels, innermost first:
//   device-to-device inside a node (intra_node link, or a per-pair matrix when links differ, as on Frontier),
//   device-to-device inside a scale-up domain of several nodes (GB200 NVL72: 18 trays of 4 GPUs behind one
//   NVLink switch fabric; ScaleUpSpec), node-to-node through the NICs, group-to-group through the (possibly
//   tapered) global links. Ranks are numbered node-major, so a domain holds consecutive ranks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
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
  // CPU nodes, whose devices are ranks (processes) sharing the node's cores: shared_cores = C cores serve all of
  // the node's devices (0, the default and every GPU cluster: each device computes alone at its own peak), and
  // device_cores = T, in (0, C], the cores one device's kernels use when it computes alone, whose throughput its
  // DeviceSpec peak FLOP/s and memory bandwidth describe. The simulator shares the C cores among the devices
  // computing at each moment (processor sharing, sim/plan_exec.h SimOptions::core_pool): a device computes at
  // min(1, C / (T busy)) of its peak while `busy` devices of its node compute. The closed form (cost::CostModel)
  // cannot follow who computes when; it prices every device at static_core_share() of its peak, the share with all
  // of the node's devices busy. `piper train` and `plan --local-ranks` set both (cli/train_report.h local_cluster);
  // a cluster file may give them as node.shared_cores and node.device_cores (docs/cluster_schema.md).
  double shared_cores = 0;
  double device_cores = 1;
  // With shared_cores: consecutive nodes that are hosts of one machine (network namespaces, as
  // scripts/two-node-emulation.sh makes them), each given shared_cores of its cores: the machine's
  // shared_cores x nodes_per_machine cores serve all of their ranks, so a rank of one node computes on cores that
  // the ranks of another leave idle (a pipeline's bubble). The simulator pools them so (sim/simulate.h core_pool_of);
  // `piper train` and `plan --local-ranks` set it from the hosts' machine names. 1 = each node its own machine.
  int nodes_per_machine = 1;
  // With shared_cores: what a synchronisation costs on top of its transfer, per collective (seconds; 0 = nothing),
  // all-to-alls, the other collectives and collectives of two ranks apart: measured by `piper calibrate --ranks R` with
  // this node's ranks (spec/comm_calibration.h, sim/plan_exec.h SyncCost); the simulator adds it to every collective of
  // the node.
  double sync_excess_all_to_all_s = 0;
  double sync_excess_other_s = 0;
  double sync_excess_pair_s = 0;  // any collective of two ranks (measured: all-reduce in pairs); 0 = as above
  // The CPU seconds each rank of a collective (p2p: each side of a transfer) takes from the node's compute while its
  // cores compute (`piper calibrate --ranks R`: threads spinning on every rank beside back-to-back collectives, their
  // lost work per call). The simulator adds it to the node's core pool as work of its own, so that the ranks' tasks
  // slow down beside communication on a full node.
  double busy_cpu_all_to_all_s = 0;
  double busy_cpu_other_s = 0;
  double busy_cpu_pair_s = 0;
  double busy_cpu_p2p_s = 0;
  // The same two kinds of figure for a collective among ranks of one node when the calibration spans nodes
  // (`piper calibrate` across hosts measures them over each node's own ranks, every node at once): the world's
  // figures above then carry the transport between nodes (the TCP stack's CPU), which a collective inside one node
  // does not pay. Taken (a measured 0 too) when node_figures is set; else the figures above (a calibration of one
  // node measures only those).
  bool node_figures = false;
  double sync_excess_node_all_to_all_s = 0;
  double sync_excess_node_other_s = 0;
  double busy_cpu_node_all_to_all_s = 0;
  double busy_cpu_node_other_s = 0;
  // The four figures inside a node by their cluster-file key (read, written and set from a calibration file alike).
  static constexpr std::pair<const char*, double NodeSpec::*> kNodeFigures[] = {
      {"sync_excess_node_all_to_all_s", &NodeSpec::sync_excess_node_all_to_all_s},
      {"sync_excess_node_other_s", &NodeSpec::sync_excess_node_other_s},
      {"busy_cpu_node_all_to_all_s", &NodeSpec::busy_cpu_node_all_to_all_s},
      {"busy_cpu_node_other_s", &NodeSpec::busy_cpu_node_other_s}};
  // With shared_cores: how much later than the others the last rank to arrive at an all-to-all leaves it, by the
  // length of the task the other ranks compute next (pairs {task_s, lag_s}, ascending task_s; empty = none),
  // measured by `piper calibrate --ranks R` as the exchange chain (comm/link_calibration.h ExchangeChain): the ranks
  // that left first wake their compute, which takes the shared cores from the last one's exchange until the
  // scheduler turns back to it. The simulator delays that rank's completion of every all-to-all by the lag at the
  // mean length of the other members' compute tasks (interpolated; clamped at the ends).
  std::vector<std::pair<double, double>> exchange_lag;
  // With shared_cores: the CPU seconds a rank's thread burns per second it waits in an all-to-all (its polls, and MPI's
  // progress inside them), measured by `piper calibrate --ranks R` as the rise of the exchange chain's CPU per
  // exchange with its wait (comm/link_calibration.h ExchangeChain::wait_cpu_share); the simulator adds that share of
  // each member's wait to its node's core pool when the all-to-all completes. 0 = none; in [0, 1].
  double a2a_wait_cpu_share = 0;
  // With shared_cores: one core's seconds per byte a rank's transfers carry while the cores compute (MPI's shared
  // memory copies each byte on both sides, and a reduction sums it), measured by `piper calibrate --ranks R` as the
  // rise of an all-reduce's own CPU from 4 KiB to 16 MiB beside computing threads (comm::copy_cpu_s_per_byte);
  // 0 = unmeasured: one copy at the intra-node rate, 1 / intra.bw_bytes_per_s (cost/copy_cost.h). A cost per byte of
  // the machine, applied whatever the ranks per node (unlike the synchronisation figures, which are the measured
  // ranks' waits).
  double copy_cpu_s_per_byte = 0;
  // The same for bytes a transfer gathers (all-gathers) and exchanges (all-to-alls, point-to-point and m2n
  // transfers), which MPI copies on both sides but does not sum: measured by `piper calibrate --ranks R` as the rise of
  // a 16 MiB all-gather's and all-to-all's own CPU beside computing threads (comm::gather_copy_cpu_s_per_byte,
  // exchange_copy_cpu_s_per_byte). 0 = unmeasured: copy_cpu_s_per_byte (cost/copy_cost.h CopyKind).
  double gather_copy_cpu_s_per_byte = 0;
  double exchange_copy_cpu_s_per_byte = 0;
  // The three figures above by their cluster-file key (read, written, checked and set from a link calibration alike).
  static constexpr std::pair<const char*, double NodeSpec::*> kCopyFigures[] = {
      {"copy_cpu_s_per_byte", &NodeSpec::copy_cpu_s_per_byte},
      {"gather_copy_cpu_s_per_byte", &NodeSpec::gather_copy_cpu_s_per_byte},
      {"exchange_copy_cpu_s_per_byte", &NodeSpec::exchange_copy_cpu_s_per_byte}};

  // min(1, shared_cores / (device_cores * devices_per_node)); exactly 1 without shared cores.
  double static_core_share() const;
  double pair_bw(int a, int b) const;         // bandwidth between two local devices
  double nic_bw_total() const;                // sum over NICs
  int nic_of_device(int local_device) const;  // index of the NIC nearest to a device (round-robin if unspecified)
};

// NodeSpec::exchange_lag's rule: task lengths ascending, each in (0, 1] s, lags in [0, 1] s. InvalidArgument naming
// the first entry that breaks it.
Status check_exchange_lag(const std::vector<std::pair<double, double>>& lag);

enum class FabricTopology { kSingleNode, kFatTree, kDragonfly };
const char* to_string(FabricTopology t);

struct FabricSpec {
  FabricTopology topology = FabricTopology::kFatTree;
  int nodes_per_group = 0;         // dragonfly group (or fat-tree pod) size in nodes; 0 = one group
  double intra_group_taper = 1.0;  // injection bandwidth / bisection bandwidth inside a group (>= 1)
  double inter_group_taper = 1.0;  // injection bandwidth / global bandwidth between groups (Frontier ~1.75)
  double inter_group_latency_s = 0;
};

// A scale-up domain: nodes whose devices reach one another through one switched fabric (NVLink switches) at the
// node's intra bandwidth and latency, never through the NICs. GB200/GB300 NVL72: 18 compute trays of 4 GPUs.
// nodes_per_domain = 1: every node is its own domain (DGX H100, MI300X). A job may hold only some nodes of each
// domain (Slurm's --segment; NVIDIA schedules NVL72 racks in 16-tray segments so that 64 ranks share a
// domain): job_nodes_per_domain (from --domain-nodes, 0 = all of them) is how many of its nodes ranks fill
// before moving to the next domain. The last domain may hold fewer nodes.
struct ScaleUpSpec {
  std::string name;              // the fabric, for display: "NVLink 5 switch (NVL72)"
  int nodes_per_domain = 1;      // physical nodes per domain
  int job_nodes_per_domain = 0;  // nodes of each domain the job uses; 0 = nodes_per_domain

  int domain_nodes() const { return job_nodes_per_domain > 0 ? job_nodes_per_domain : nodes_per_domain; }
};

struct ClusterSpec {
  std::string name;
  DeviceSpec device;
  NodeSpec node;
  ScaleUpSpec scale_up;
  FabricSpec fabric;
  int num_nodes = 1;
  int max_nodes = 0;  // 0 = unbounded; presets of a fixed box (local-cpu) set it

  int world_size() const { return num_nodes * node.devices_per_node; }
  // Ranks of one scale-up domain as the job uses it (devices_per_node when nodes are their own domains).
  int devices_per_domain() const { return scale_up.domain_nodes() * node.devices_per_node; }
  int num_domains() const { return (num_nodes + scale_up.domain_nodes() - 1) / scale_up.domain_nodes(); }
  bool has_multi_node_domain() const { return scale_up.domain_nodes() > 1; }
  Status validate() const;
};

}  // namespace piper
