// The HALO exchange engine shared by the hierarchical all-to-all-v and the MoE dispatch.
//
// One exchange on a group laid out by a NodeTopology moves three kinds of traffic, all posted at once so that
// the phases overlap:
//   phase I   intra-node: blocks for ranks of the same node go directly; pieces bound for another node m go
//             to this lane's send proxy for m (gather);
//   phase II  inter-node: each send proxy sends ONE batched message (the lane's pieces, in local-rank order)
//             to the receive proxy on node m, as soon as its gather is complete; a proxy that also receives
//             a batch from that same proxy posts that receive only after its own send (receives first can
//             make OpenMPI's TCP rendezvous move the two batches one after the other: pairwise_all_to_all.h);
//   phase III intra-node: the receive proxy splits the batch for its local ranks (HaloPayload::scatter) and
//             sends each its part, as soon as the batch has arrived.
// What a piece contains and how a batch is split is the payload's business (plain byte blocks, or tokens with
// per-local-rank multiplicities for a deduplicated MoE dispatch). Every size is known on both sides before
// anything is posted (the payload exchanges its metadata first), so no zero-byte message is ever posted and
// no receive needs a probe.
//
// Buffers: batches and scatter parts live in a HaloScratch that the caller keeps across calls (HaloContext
// owns one). Reusing memory matters: on the build VM a first-touch page fault costs ~30 us, i.e. 8 ms per
// MiB, as slow as the 1 Gbit/s link itself (docs/comm.md, "Where the time went").
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/algorithms/topology.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

// An arena of reusable byte buffers, handed out in request order: the i-th take() after reset() returns
// buffer i, grown (never shrunk) to the size asked. Successive calls that ask for the same sequence of sizes
// touch no fresh memory. Contents are unspecified. Not thread-safe; one user at a time.
class HaloScratch {
 public:
  void reset() { next_ = 0; }
  std::span<uint8_t> take(size_t bytes);

 private:
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t bytes = 0;
  };
  std::vector<Buffer> buffers_;
  size_t next_ = 0;
};

// What one rank did in one exchange (for benchmarks and diagnosis). Times are seconds since the exchange
// started on this rank (after the caller's metadata exchange and packing); a phase this rank has no part in
// stays 0. The engine sets every field except metadata_s and pack_s, which its callers fill.
struct HaloExchangeStats {
  double metadata_s = 0;       // the caller's exchange of sizes before the engine ran
  double pack_s = 0;           // the caller's packing of pieces before the engine ran
  int64_t messages_intra = 0;  // messages this rank sent inside its node (phases I and III)
  int64_t messages_inter = 0;  // batches this rank sent to other nodes (phase II)
  int64_t bytes_intra = 0;
  int64_t bytes_inter = 0;
  double posted_s = 0;       // every receive (but deferred batch receives) and every phase-I send posted
  double batches_out_s = 0;  // send proxy: the last batch posted (its gather complete)
  double batches_in_s = 0;   // receive proxy: the last batch arrived and its scatter posted
  double scatter_s = 0;      // receive proxy: time spent splitting batches (payload scatter copies)
  double total_s = 0;        // everything of this rank complete
  int64_t idle_rounds = 0;   // polling rounds that found nothing to do (each yields or sleeps)
};

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
  // Receive proxy of (node_n, lane) on this node: bytes it hands local rank h (equal to what final_recv of
  // (node_n, lane) is on rank h).
  virtual size_t scatter_bytes(int node_n, int lane, int local_h) = 0;
  // Receive proxy: `pieces[i]` is the piece of rank (node_n, first local rank of `lane` + i); fills out[h]
  // (scatter_bytes(node_n, lane, h) bytes, for every local rank h) with what local rank h must get.
  virtual void scatter(int node_n, int lane, std::span<const std::span<const uint8_t>> pieces,
                       std::span<const std::span<uint8_t>> out) = 0;
  // Final destination of what the receive proxy of (node_n, lane) sends here.
  virtual std::span<uint8_t> final_recv(int node_n, int lane) = 0;
};

// Runs one exchange; collective over `comm` (whose size is topology.group_size()). The payload's own local
// block (if any) is not touched. Errors name the phase and the peers that did not deliver within timeout_s.
// The engine takes its buffers from `scratch` (may be null: a temporary arena is used) after whatever the payload
// took from it (no reset() in between). `stats` (may be null) receives this rank's counts and phase times.
Status run_halo_exchange(Communicator& comm, const NodeTopology& topology, HaloPayload& payload, double timeout_s,
                         HaloScratch* scratch = nullptr, HaloExchangeStats* stats = nullptr);

}  // namespace piper::comm
