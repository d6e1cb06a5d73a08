// MoE token dispatch with top-k duplication: flat (one copy per routed slot, the Megatron "alltoall"
// dispatcher) and HALO (one copy per destination NODE plus a G-byte list of how many slots each local rank of
// that node wants; the receive proxy makes the copies inside the node, DeepEP normal mode / X-MoE RBD).
//
// Both produce the same bytes on every rank: the rows routed to this rank, ordered by (source rank, token,
// slot), one row per slot, so an expert that owns two of a token's top-k slots gets two rows. Row counts per
// source rank come with the result. Host memory only. Collective over the group; blocking with a timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/algorithms/halo_all_to_all.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

// Routing of one rank's tokens: dest_ranks[t * top_k + j] is the group rank owning the expert of slot j of
// token t, or -1 when the slot is dropped (capacity overflow).
struct MoeRouting {
  int64_t num_tokens = 0;
  int top_k = 1;
  std::vector<int> dest_ranks;
  // Checks sizes, 1 <= top_k <= 255 and every rank in [-1, group_size).
  Status validate(int group_size) const;
};

struct DispatchResult {
  std::vector<uint8_t> rows;         // sum(rows_from) * token_bytes bytes
  std::vector<int64_t> rows_from;    // rows received from each source rank
};

enum class FlatDispatchKind { kMpiAllToAllV, kPairwise };

// Flat dispatch: an all-to-all of row counts, then one all-to-all-v of rows (native MPI_Alltoallv through
// Communicator::all_to_all_v, or pairwise point-to-point).
// `known_rows_from`: the rows each source sends this rank, when an earlier dispatch of the same routing on every
// rank told them (its DispatchResult::rows_from): the count exchange, a synchronisation of the whole group, is
// skipped (a backward pass re-dispatches its forward's routing). Empty: the counts are exchanged first.
Result<DispatchResult> flat_dispatch(Communicator& comm, const void* tokens, size_t token_bytes,
                                     const MoeRouting& routing, FlatDispatchKind kind, double timeout_s,
                                     std::span<const int64_t> known_rows_from = {});
// The same into caller-kept buffers: `out` and `pack` (the send buffer, grouped by destination) keep their
// capacity from call to call, so a steady stream of dispatches touches no fresh memory (first-touch page
// faults cost ~8 ms per MiB on the build VM; see halo_engine.h).
Status flat_dispatch(Communicator& comm, const void* tokens, size_t token_bytes, const MoeRouting& routing,
                     FlatDispatchKind kind, double timeout_s, DispatchResult* out, std::vector<uint8_t>* pack,
                     std::span<const int64_t> known_rows_from = {});

// The rows `routing` sends to each of `group_size` ranks (dropped slots to none).
std::vector<uint64_t> rows_to_ranks(const MoeRouting& routing, int group_size);

// The rows each source sends this rank, whose own routing sends `rows_to` (rows_to_ranks): `known` when given
// (checked: one non-negative count per rank of `comm`, and this rank's own equal to rows_to's), else exchanged (an
// all-to-all of counts, waited for). Shared by the flat dispatch and combine.
Result<std::vector<uint64_t>> rows_from_sources(Communicator& comm, const std::vector<uint64_t>& rows_to,
                                                std::span<const int64_t> known, double timeout_s);

// HALO dispatch: an all-gather of per-rank row and token counts (small), then one HALO exchange in which a
// token crosses the network once per destination node. Its pieces and batches live in the context's scratch;
// the context's last_stats() describe the exchange afterwards.
Result<DispatchResult> halo_dispatch(HaloContext& context, const void* tokens, size_t token_bytes,
                                     const MoeRouting& routing, double timeout_s);
// The same into a caller-kept result (its capacity is reused).
Status halo_dispatch(HaloContext& context, const void* tokens, size_t token_bytes, const MoeRouting& routing,
                     double timeout_s, DispatchResult* out);

// Bytes this rank puts on the inter-node network for one dispatch (for benchmarks): flat = rows to other nodes
// * token_bytes; HALO = distinct (token, remote node) pairs * (token_bytes + ranks_per_node).
struct DispatchTraffic {
  int64_t flat_internode_bytes = 0;
  int64_t halo_internode_bytes = 0;
};
DispatchTraffic dispatch_traffic(const NodeTopology& topology, int rank, size_t token_bytes,
                                 const MoeRouting& routing);

}  // namespace piper::comm
