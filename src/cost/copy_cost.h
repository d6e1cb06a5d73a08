// What a transfer's bytes cost the cores of a CPU node whose ranks share them (NodeSpec::shared_cores): MPI's
// shared-memory transport (and the TCP stack between emulated nodes) copies every byte with those cores: the CPU per
// byte `piper calibrate --ranks R` measures beside computing threads (NodeSpec::copy_cpu_s_per_byte), or without it
// one copy at the rate the node's intra-node link is measured at with idle cores. The simulator adds it to
// the node's core pool per transfer (sim::SyncCost::cpu_per_byte_s), the closed form to each kind of a rank's
// communication at its static share of the cores (estimate.cc). docs/simulator.md "The bytes themselves".
#pragma once

#include "piper/spec/cluster_spec.h"

namespace piper::cost {

// One core's seconds per byte carried: the measured NodeSpec::copy_cpu_s_per_byte, else 1 / the intra-node
// bandwidth; 0 on a node that does not share its cores or has neither.
inline double copy_seconds_per_byte(const NodeSpec& node) {
  if (!(node.shared_cores > 0)) return 0.0;
  if (node.copy_cpu_s_per_byte > 0) return node.copy_cpu_s_per_byte;
  return node.intra.bw_bytes_per_s > 0 ? 1.0 / node.intra.bw_bytes_per_s : 0.0;
}

}  // namespace piper::cost
