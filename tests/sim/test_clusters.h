// Small ClusterSpecs for the network tests, built field by field (no preset files needed).
#pragma once

#include <vector>

#include "piper/spec/cluster_spec.h"

namespace piper::sim::testing {

// `nodes` nodes of `gpus` devices on a uniform switch of intra_bw; `nics` NICs of nic_bw per node (no affinity
// lists: device d uses NIC d mod nics); one fat-tree group without taper unless changed by the caller.
inline ClusterSpec make_cluster(int nodes, int gpus, double intra_bw, int nics, double nic_bw, double intra_lat = 0,
                                double nic_lat = 0) {
  ClusterSpec c;
  c.name = "test";
  c.num_nodes = nodes;
  c.node.devices_per_node = gpus;
  c.node.intra = {intra_bw, intra_lat};
  c.node.nics.assign(nics, NicSpec{nic_bw, {}});
  c.node.nic_latency_s = nic_lat;
  c.fabric.topology = nodes > 1 ? FabricTopology::kFatTree : FabricTopology::kSingleNode;
  return c;
}

}  // namespace piper::sim::testing
