#include "piper/comm/algorithms/topology.h"

#include <string>

namespace piper::comm {

Result<NodeTopology> NodeTopology::create(int group_size, int ranks_per_node, int lanes) {
  if (group_size < 1 || ranks_per_node < 1 || group_size % ranks_per_node != 0) {
    return invalid_argument("topology: ranks_per_node=" + std::to_string(ranks_per_node) +
                            " must be >= 1 and divide the group size " + std::to_string(group_size) +
                            "; pass --ranks-per-node as a divisor of --ranks");
  }
  if (lanes < 1 || ranks_per_node % lanes != 0) {
    return invalid_argument("topology: lanes=" + std::to_string(lanes) + " must be >= 1 and divide ranks_per_node=" +
                            std::to_string(ranks_per_node) + " (lanes = NICs per node; 1 = one proxy per node pair)");
  }
  NodeTopology t;
  t.group_size_ = group_size;
  t.ranks_per_node_ = ranks_per_node;
  t.lanes_ = lanes;
  return t;
}

}  // namespace piper::comm
