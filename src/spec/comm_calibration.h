// Measured alpha-beta figures of the communication links (written by `piper bench comm --calibration-out F`,
// see docs/comm.md) applied to a ClusterSpec, so that the network model (sim/network.h) and everything built
// on it uses the measured latency and bandwidth instead of the preset's datasheet figures.
//
// File format (every field optional, those absent leave the cluster unchanged):
//   {"source": "...", "ranks": R, "ranks_per_node": G,
//    "node": {"intra": {"latency_s": a, "bw_bytes_per_s": b},   -> node.intra
//             "nic_latency_s": a,                                -> node.nic_latency_s
//             "nic_bw_bytes_per_s": b},                          -> bw of every NIC of node.nics
//    "measured": {...}}   what `piper calibrate --ranks R` measured (comm/link_calibration.h); of it only
//                         sync_all_to_all, sync_all_reduce and sync_all_reduce_pairs .excess_s are applied, to
//                         node.sync_excess_all_to_all_s / _other_s / _pair_s, and contended_all_to_all,
//                         contended_all_reduce, contended_all_reduce_pairs and contended_p2p .cpu_s to
//                         node.busy_cpu_all_to_all_s / _other_s / _pair_s / _p2p_s (their excess_s, the time per
//                         call beside compute, is not applied: docs/calibration.md), and only when the cluster's
//                         node has ranks_per_node devices (the excess depends on how many ranks share the cores).
// Bandwidths must be > 0 and latencies >= 0, finite; unknown keys are errors (likely typos).
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/spec/cluster_spec.h"

namespace piper {

// What a file held beyond the link figures, for the reports.
struct CommCalibrationInfo {
  bool sync_measured = false;   // measured.sync_* or contended_* present
  bool sync_applied = false;    // ... and applied (the node has the measured ranks)
  int sync_ranks_per_node = 0;  // the file's ranks_per_node
};

// `what` names the source in errors (a path). The cluster is validated afterwards. `info` may be null.
Status apply_comm_calibration(const Json& json, const std::string& what, ClusterSpec* cluster,
                              CommCalibrationInfo* info = nullptr);
Status load_comm_calibration(const std::string& path, ClusterSpec* cluster, CommCalibrationInfo* info = nullptr);

}  // namespace piper
