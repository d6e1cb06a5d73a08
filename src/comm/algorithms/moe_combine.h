// MoE combine: the reverse of the dispatch of moe_dispatch.h, with the contract of the runtime's
// kernels unpermute_forward: every source rank gets y[t] = sum over the non-dropped slots j of token t, in slot
// order, of weights[t * top_k + j] * out(t, j), where out(t, j) is the expert output row of that slot (a token
// whose slots are all dropped gets zeros). The routing weights are applied inside the combine.
//
// Input on every rank: the expert outputs of the rows it received in the dispatch, in dispatch order (source
// rank, token, slot), `hidden` floats per row. Output: num_tokens * hidden floats on the source rank.
//
// Flat: an all-to-all of row counts, one all-to-all-v of rows back to the sources (MPI_Alltoallv or
// pairwise), then the weighted sum at the source.
// HALO: the rows of a token's slots on a remote node m are reduced inside m, so the token crosses the network
// back once per node (the reverse of the dispatch's node deduplication). The reducer of (source s, node m) is the
// rank that scattered s's tokens in the HALO dispatch (the receive proxy of s's lane); it serves the lane's
// sources as one group.
//   1. all-gather of row and token counts (as the dispatch);
//   2. posted at once, point to point: source -> reducer, per (token, remote node) its top_k (local rank or -1,
//      weight) pairs (8 B a slot); every expert rank -> each reducer of its node, the rows of that reducer's
//      group, sent straight from expert_rows (a group's rows are contiguous there); every expert rank -> each
//      other source of its node, its raw rows;
//   3. a reducer reduces a group as soon as its metadata and rows are in: partial(t, m) = sum over the slots j
//      of t on node m, in slot order, of w_j * row_j; and sends each source of the group its partials at once
//      (a partial from a rank it also sends partials to is received only after those are posted);
//   4. source: y[t] = sum over slots in slot order, where a same-node slot adds w_j * row_j and the first
//      slot of each remote node adds that node's partial.
// Buffers come from the context's scratch arena (no fresh memory from call to call).
// Summation order: HALO equals flat bit for bit when no token has two slots on the same remote node (the same
// additions in the same order). Otherwise HALO regroups the additions (partial per node first), so results
// agree to rounding (a few ulp per slot); they are still bitwise equal whenever products and sums are exact.
#pragma once

#include <span>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/algorithms/halo_all_to_all.h"
#include "piper/comm/algorithms/moe_dispatch.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

// Collective over `comm`. expert_rows holds (rows received in the dispatch) * hidden floats; topk_weights holds
// routing.num_tokens * routing.top_k weights (the entry of a dropped slot is ignored). `dispatch_rows_from`: that
// dispatch's DispatchResult::rows_from, whose rows go back to their sources without a count exchange; empty: the
// counts are exchanged first (one more synchronisation of the group).
Result<std::vector<float>> flat_combine(Communicator& comm, std::span<const float> expert_rows, int64_t hidden,
                                        const MoeRouting& routing, std::span<const float> topk_weights,
                                        FlatDispatchKind kind, double timeout_s,
                                        std::span<const int64_t> dispatch_rows_from = {});

// Collective over the context's group; same inputs and result as flat_combine.
Result<std::vector<float>> halo_combine(HaloContext& context, std::span<const float> expert_rows, int64_t hidden,
                                        const MoeRouting& routing, std::span<const float> topk_weights,
                                        double timeout_s);

// Bytes of one combine on the inter-node network, counted at the SOURCE rank (symmetric to dispatch_traffic):
// flat = remote slots * hidden * 4; HALO = distinct (token, remote node) pairs * (hidden * 4 + top_k * 8).
struct CombineTraffic {
  int64_t flat_internode_bytes = 0;
  int64_t halo_internode_bytes = 0;
};
CombineTraffic combine_traffic(const NodeTopology& topology, int rank, int64_t hidden, const MoeRouting& routing);

}  // namespace piper::comm
