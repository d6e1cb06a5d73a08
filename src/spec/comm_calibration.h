// Measured alpha-beta figures of the communication links (written by `piper bench comm --calibration-out F`,
// see docs/comm.md) applied to a ClusterSpec, so that the network model (sim/network.h) and everything built
// on it uses the measured latency and bandwidth instead of the preset's datasheet figures.
//
// File format (every field optional, those absent leave the cluster unchanged):
//   {"source": "...", "ranks": R, "ranks_per_node": G,
//    "node": {"intra": {"latency_s": a, "bw_bytes_per_s": b},   -> node.intra
//             "nic_latency_s": a,                                -> node.nic_latency_s
//             "nic_bw_bytes_per_s": b}}                          -> bw of every NIC of node.nics
// Bandwidths must be > 0 and latencies >= 0, finite; unknown keys are errors (likely typos).
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/spec/cluster_spec.h"

namespace piper {

// `what` names the source in errors (a path). The cluster is validated afterwards.
Status apply_comm_calibration(const Json& json, const std::string& what, ClusterSpec* cluster);
Status load_comm_calibration(const std::string& path, ClusterSpec* cluster);

}  // namespace piper
