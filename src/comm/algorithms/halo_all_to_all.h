// HALO hierarchical all-to-all-v: same contract and same bytes as the flat all-to-all-v, but every pair of
// nodes exchanges one batched message per lane (NodeTopology) instead of one message per pair of ranks.
//
// HaloContext is built once per group (collective): it keeps a private duplicate of the group for the data and
// a node-local communicator for the size tables. Each call first all-gathers the send and receive counts inside
// the node (small, shared memory), so that proxies know every block size, then runs the three overlapped
// phases of halo_engine.h. Host memory only (the payload packs with memcpy).
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "piper/base/status.h"
#include "piper/comm/algorithms/halo_engine.h"
#include "piper/comm/algorithms/topology.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

class HaloContext {
 public:
  // Collective over `group`; topology.group_size() must equal group.size().
  static Result<std::unique_ptr<HaloContext>> create(Communicator& group, const NodeTopology& topology);

  const NodeTopology& topology() const { return topology_; }
  Communicator& data() { return *data_; }
  Communicator& node() { return *node_; }
  // Buffers reused by successive calls on this context (one call at a time).
  HaloScratch& scratch() { return scratch_; }
  // This rank's counts and phase times of the last exchange run on this context.
  HaloExchangeStats& last_stats() { return last_stats_; }

 private:
  explicit HaloContext(const NodeTopology& topology) : topology_(topology) {}
  NodeTopology topology_;
  std::unique_ptr<Communicator> data_;
  std::unique_ptr<Communicator> node_;
  HaloScratch scratch_;
  HaloExchangeStats last_stats_;
};

// Collective over the context's group. Same contract as Communicator::all_to_all_v, blocking with a timeout.
Status halo_all_to_all_v(HaloContext& context, const void* send, std::span<const size_t> send_bytes, void* recv,
                         std::span<const size_t> recv_bytes, double timeout_s);

}  // namespace piper::comm
