// What a transfer's bytes cost the cores of a CPU node whose ranks share them (NodeSpec::shared_cores): MPI's
// shared-memory transport (and the TCP stack between emulated nodes) copies every byte with those cores, at the rate
// the node's intra-node link is measured at with idle cores (`piper calibrate --ranks R`). The simulator adds it to
// the node's core pool per transfer (sim::SyncCost::cpu_per_byte_s), the closed form to each kind of a rank's
// communication at its static share of the cores (estimate.cc). docs/simulator.md "The bytes themselves".
#pragma once

#include "piper/spec/cluster_spec.h"

namespace piper::cost {

// One core's seconds per byte copied; 0 on a node that does not share its cores or has no intra-node bandwidth.
inline double copy_seconds_per_byte(const NodeSpec& node) {
  return node.shared_cores > 0 && node.intra.bw_bytes_per_s > 0 ? 1.0 / node.intra.bw_bytes_per_s : 0.0;
}

}  // namespace piper::cost
