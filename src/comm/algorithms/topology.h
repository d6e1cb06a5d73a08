// NodeTopology: how the ranks of a group sit on nodes, and which ranks act as HALO proxies.
//
// Ranks are node-major: rank = node * ranks_per_node + local. The local ranks of a node are split into
// `lanes` contiguous blocks of width W = ranks_per_node / lanes; a lane is the set of devices that share one
// NIC (NIC affinity: lanes = NICs per node). Traffic from local rank g of node n to node m leaves through the
// lane of g and arrives in the same lane on node m:
//   send proxy   of (n -> m, lane l) = local l * W + (m mod W)   gathers the lane's pieces for node m,
//   receive proxy of (n -> m, lane l) = local l * W + (n mod W)  receives the batch and scatters it in node m.
// lanes = ranks_per_node gives rail-aligned proxies (every rank is its own proxy, DeepEP normal mode);
// lanes = 1 gives one batched message per node pair, proxies rotated over the node by node index.
#pragma once

#include "piper/base/status.h"

namespace piper::comm {

class NodeTopology {
 public:
  // group_size must be a multiple of ranks_per_node, and lanes must divide ranks_per_node.
  static Result<NodeTopology> create(int group_size, int ranks_per_node, int lanes);

  int group_size() const { return group_size_; }
  int ranks_per_node() const { return ranks_per_node_; }
  int num_nodes() const { return group_size_ / ranks_per_node_; }
  int lanes() const { return lanes_; }
  int lane_width() const { return ranks_per_node_ / lanes_; }

  int node_of(int rank) const { return rank / ranks_per_node_; }
  int local_of(int rank) const { return rank % ranks_per_node_; }
  int rank_of(int node, int local) const { return node * ranks_per_node_ + local; }
  int lane_of(int local) const { return local / lane_width(); }
  int send_proxy(int src_node, int dst_node, int lane) const { return lane * lane_width() + dst_node % lane_width(); }
  int recv_proxy(int src_node, int dst_node, int lane) const { return lane * lane_width() + src_node % lane_width(); }

 private:
  int group_size_ = 1;
  int ranks_per_node_ = 1;
  int lanes_ = 1;
};

}  // namespace piper::comm
