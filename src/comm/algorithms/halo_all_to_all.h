// HALO hierarchical all-to-all-v: same contract and same bytes as the flat all-to-all-v, but every pair of
// nodes exchanges one batched message per lane (NodeTopology) instead of one message per pair of ranks.
//
// Batching only ever saves messages (per-message latency), never bytes: a plain all-to-all has nothing to
// deduplicate. So a block between two ranks on different nodes of at least `direct_pair_bytes` (HaloContext)
// goes straight from its source to its destination, overlapped with the batched exchange of the smaller
// blocks; both sides decide alike because both know the block's size. Measured on the emulated two nodes
// (docs/comm.md): batching 256 KiB-1 MiB blocks through 1-4 proxies ran at 0.5-0.86x of MPI_Alltoallv, as the
// proxies' few TCP streams cannot fill the link the way one stream per rank pair does.
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

// Default for HaloContext::direct_pair_bytes: 64 KiB. The alpha-beta crossover of batching on the emulated
// cluster (inter-node alpha 24 us, intra-node 7.6 us at 7.9 GB/s) is (24 - 7.6) us / 2 * 7.9 GB/s = 65 KB: a
// larger block costs more in the two extra intra-node copies than it saves in inter-node message latency.
inline constexpr size_t kDefaultHaloDirectPairBytes = 64 * 1024;

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
  // halo_all_to_all_v sends a block between ranks of different nodes of at least this many bytes directly,
  // not through the proxies; 0 batches every block. Must be equal on every rank of the group.
  size_t direct_pair_bytes() const { return direct_pair_bytes_; }
  void set_direct_pair_bytes(size_t bytes) { direct_pair_bytes_ = bytes; }

 private:
  explicit HaloContext(const NodeTopology& topology) : topology_(topology) {}
  NodeTopology topology_;
  std::unique_ptr<Communicator> data_;
  std::unique_ptr<Communicator> node_;
  HaloScratch scratch_;
  HaloExchangeStats last_stats_;
  size_t direct_pair_bytes_ = kDefaultHaloDirectPairBytes;
};

// Collective over the context's group. Same contract as Communicator::all_to_all_v, blocking with a timeout.
Status halo_all_to_all_v(HaloContext& context, const void* send, std::span<const size_t> send_bytes, void* recv,
                         std::span<const size_t> recv_bytes, double timeout_s);

}  // namespace piper::comm
