// The HALO exchange engine shared by the hierarchical all-to-all-v and the MoE dispatch.
//
// One exchange on a group laid out by a NodeTopology moves three kinds of traffic, all posted at once so that
// the phases overlap:
//   phase I   intra-node: blocks for ranks of the same node go directly; pieces bound for another node m go
//             to this lane's send proxy for m (gather);
//   phase II  inter-node: each send proxy sends ONE batched message (the lane's pieces, in local-rank order)
//             to the receive proxy on node m, as soon as its gather is complete;
//   phase III intra-node: the receive proxy splits the batch for its local ranks (HaloPayload::scatter) and
//             sends each its part, as soon as the batch has arrived.
// What a piece contains and how a batch is split is the payload's business (plain byte blocks, or tokens with
// per-local-rank multiplicities for a deduplicated MoE dispatch). Every size is known on both sides before
// anything is posted (the payload exchanges its metadata first), so no zero-byte message is ever posted and
// no receive needs a probe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/algorithms/topology.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

class HaloPayload {
 public:
  virtual ~HaloPayload() = default;
  // Direct traffic with local rank h of this node (h != own local rank).
  virtual std::span<const uint8_t> direct_send(int local_h) = 0;
  virtual std::span<uint8_t> direct_recv(int local_h) = 0;
  // This rank's piece bound for remote node m.
  virtual std::span<const uint8_t> piece(int node_m) = 0;
  // Size of the piece of local rank g (this node) bound for node m: what a send proxy gathers.
  virtual size_t local_piece_bytes(int local_g, int node_m) = 0;
  // Size of the piece of rank (node_n, local g) bound for this node: what a receive proxy gets in a batch.
  virtual size_t remote_piece_bytes(int node_n, int local_g) = 0;
  // Receive proxy: `pieces[i]` is the piece of rank (node_n, first local rank of `lane` + i); fills out[h] with
  // the bytes local rank h must get (out has ranks_per_node entries, all empty on entry).
  virtual void scatter(int node_n, int lane, std::span<const std::span<const uint8_t>> pieces,
                       std::vector<std::vector<uint8_t>>* out) = 0;
  // Final destination of what the receive proxy of (node_n, lane) sends here; its size must equal out[h].size().
  virtual std::span<uint8_t> final_recv(int node_n, int lane) = 0;
};

// Runs one exchange; collective over `comm` (whose size is topology.group_size()). The payload's own local
// block (if any) is not touched. Errors name the phase and the peers that did not deliver within timeout_s.
Status run_halo_exchange(Communicator& comm, const NodeTopology& topology, HaloPayload& payload, double timeout_s);

}  // namespace piper::comm
