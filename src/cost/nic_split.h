// af-pipe's NIC split (Strategy::attn_ports, ffn_ports), shared by the closed form (estimate_af.cc) and the
// simulator's network (sim/network.h), so that both price the split the disaggregation allocator chose.
//
// Ranks sit on devices in rank order (rank r on device r, attention ranks first: compile::Plan's layout), so each
// group's devices use the NICs of the nodes they occupy (NodeSpec::nic_of_device): its *natural* ports. DisagMoE
// spreads both groups over the nodes and splits every node's NICs between them, which gives a group any number of
// ports up to the cluster's (planner/af_model.h, placement `spread`). The split is priced as bandwidth: every NIC
// used by the attention group carries attn_ports / natural_attn times its bandwidth, every NIC of the FFN group
// ffn_ports / natural_ffn times. So a group's aggregate port bandwidth is what the allocator assumed; what spread
// placement would change besides (attention-FFN pairs on one node exchanging over NVLink instead of the NICs) is
// not modelled, as the allocator's roofline does not model it either.
//
// Only across nodes: on one node the groups exchange over the devices' own links, one port per GPU, so the split
// must equal the natural one (each group's GPU count). A NIC that serves devices of both groups cannot be split by
// this model and is an error (the attention group must end on a NIC boundary).
#pragma once

#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/spec/cluster_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::cost {

struct NicSplit {
  bool active = false;          // false: no split given (or one equal to the natural one on one node)
  int natural_attn = 0, natural_ffn = 0;  // ports each group's devices use without a split
  double attn_scale = 1, ffn_scale = 1;   // bandwidth factor of each group's NICs
  std::vector<double> nic_scale;          // [node * nics_per_node + nic]; empty when !active
};

// The split of `s` on `cluster` (s.world_size() devices, rank r on device r). Errors name the bad value and the
// fix: ports above the cluster's NICs, a split on one node that differs from the GPU counts, a NIC shared by both
// groups, a group with no NIC.
Result<NicSplit> nic_split(const Strategy& s, const ClusterSpec& cluster);

}  // namespace piper::cost
