#include "piper/comm/algorithms/moe_dispatch.h"

#include <cstring>
#include <string>

#include "piper/comm/algorithms/pairwise_all_to_all.h"

namespace piper::comm {

Status MoeRouting::validate(int group_size) const {
  if (top_k < 1 || top_k > 255) {
    return invalid_argument("moe routing: top_k=" + std::to_string(top_k) + " must be in [1, 255]");
  }
  if (num_tokens < 0 || dest_ranks.size() != static_cast<size_t>(num_tokens) * top_k) {
    return invalid_argument("moe routing: expected num_tokens * top_k = " + std::to_string(num_tokens * top_k) +
                            " destination ranks, got " + std::to_string(dest_ranks.size()));
  }
  for (size_t i = 0; i < dest_ranks.size(); ++i) {
    if (dest_ranks[i] < -1 || dest_ranks[i] >= group_size) {
      return invalid_argument("moe routing: token " + std::to_string(i / top_k) + " slot " +
                              std::to_string(i % top_k) + " goes to rank " + std::to_string(dest_ranks[i]) +
                              ", outside [0, " + std::to_string(group_size) + ") (use -1 for a dropped slot)");
    }
  }
  return ok_status();
}

Result<DispatchResult> flat_dispatch(Communicator& comm, const void* tokens, size_t token_bytes,
                                     const MoeRouting& routing, FlatDispatchKind kind, double timeout_s,
                                     std::span<const int64_t> known_rows_from) {
  DispatchResult result;
  std::vector<uint8_t> pack;
  PIPER_RETURN_IF_ERROR(
      flat_dispatch(comm, tokens, token_bytes, routing, kind, timeout_s, &result, &pack, known_rows_from));
  return result;
}

std::vector<uint64_t> rows_to_ranks(const MoeRouting& routing, int group_size) {
  std::vector<uint64_t> rows_to(static_cast<size_t>(group_size), 0);
  for (int d : routing.dest_ranks) {
    if (d >= 0) ++rows_to[static_cast<size_t>(d)];
  }
  return rows_to;
}

Result<std::vector<uint64_t>> rows_from_sources(Communicator& comm, const std::vector<uint64_t>& rows_to,
                                                std::span<const int64_t> known, double timeout_s) {
  const int p = comm.size();
  std::vector<uint64_t> rows_from(p, 0);
  if (!known.empty()) {
    if (known.size() != static_cast<size_t>(p)) {
      return invalid_argument("moe exchange: " + std::to_string(known.size()) + " known row count(s) for a group of " +
                              std::to_string(p) + " ranks; pass the earlier dispatch's rows_from, one per rank");
    }
    for (int s = 0; s < p; ++s) {
      if (known[s] < 0) {
        return invalid_argument("moe exchange: known row count " + std::to_string(known[s]) + " from rank " +
                                std::to_string(s) + " is negative");
      }
      rows_from[s] = static_cast<uint64_t>(known[s]);
    }
    // The rows a rank keeps are the only ones it can check here; a count that disagrees with the routing would
    // receive other bytes than the peers send.
    const int me = comm.rank();
    if (rows_from[me] != rows_to[me]) {
      return invalid_argument("moe exchange: known row count " + std::to_string(rows_from[me]) + " from rank " +
                              std::to_string(me) + " itself, but the routing sends it " + std::to_string(rows_to[me]) +
                              " rows: the counts are not this routing's");
    }
    return rows_from;
  }
  std::vector<size_t> eight(p, sizeof(uint64_t));
  PIPER_ASSIGN_OR_RETURN(Handle h, comm.all_to_all_v(rows_to.data(), eight, rows_from.data(), eight));
  PIPER_RETURN_IF_ERROR(comm.wait(h, timeout_s));
  return rows_from;
}

Status flat_dispatch(Communicator& comm, const void* tokens, size_t token_bytes, const MoeRouting& routing,
                     FlatDispatchKind kind, double timeout_s, DispatchResult* out, std::vector<uint8_t>* pack,
                     std::span<const int64_t> known_rows_from) {
  PIPER_RETURN_IF_ERROR(routing.validate(comm.size()));
  const int p = comm.size();
  const auto* in = static_cast<const uint8_t*>(tokens);
  const std::vector<uint64_t> rows_to = rows_to_ranks(routing, p);
  PIPER_ASSIGN_OR_RETURN(std::vector<uint64_t> rows_from, rows_from_sources(comm, rows_to, known_rows_from, timeout_s));

  // Send buffer grouped by destination rank, rows in (token, slot) order.
  std::vector<size_t> send_bytes(p), recv_bytes(p), offset(p + 1, 0);
  for (int d = 0; d < p; ++d) {
    send_bytes[d] = rows_to[d] * token_bytes;
    recv_bytes[d] = rows_from[d] * token_bytes;
    offset[d + 1] = offset[d] + send_bytes[d];
  }
  std::vector<uint8_t>& send = *pack;
  send.resize(offset[p]);
  for (int64_t t = 0; t < routing.num_tokens; ++t) {
    for (int j = 0; j < routing.top_k; ++j) {
      int d = routing.dest_ranks[t * routing.top_k + j];
      if (d < 0) continue;
      std::memcpy(send.data() + offset[d], in + t * token_bytes, token_bytes);
      offset[d] += token_bytes;
    }
  }
  DispatchResult& result = *out;
  result.rows_from.clear();
  size_t total = 0;
  for (int s = 0; s < p; ++s) {
    result.rows_from.push_back(static_cast<int64_t>(rows_from[s]));
    total += recv_bytes[s];
  }
  result.rows.resize(total);
  if (kind == FlatDispatchKind::kPairwise) {
    PIPER_RETURN_IF_ERROR(pairwise_all_to_all_v(comm, send.data(), send_bytes, result.rows.data(), recv_bytes,
                                                timeout_s));
  } else {
    PIPER_ASSIGN_OR_RETURN(Handle d, comm.all_to_all_v(send.data(), send_bytes, result.rows.data(), recv_bytes));
    PIPER_RETURN_IF_ERROR(comm.wait(d, timeout_s));
  }
  return ok_status();
}

DispatchTraffic dispatch_traffic(const NodeTopology& t, int rank, size_t token_bytes, const MoeRouting& routing) {
  DispatchTraffic traffic;
  const int node = t.node_of(rank);
  std::vector<char> hit(t.num_nodes());
  for (int64_t tok = 0; tok < routing.num_tokens; ++tok) {
    std::fill(hit.begin(), hit.end(), 0);
    for (int j = 0; j < routing.top_k; ++j) {
      int d = routing.dest_ranks[tok * routing.top_k + j];
      if (d < 0 || t.node_of(d) == node) continue;
      traffic.flat_internode_bytes += static_cast<int64_t>(token_bytes);
      if (!hit[t.node_of(d)]) {
        hit[t.node_of(d)] = 1;
        traffic.halo_internode_bytes += static_cast<int64_t>(token_bytes + t.ranks_per_node());
      }
    }
  }
  return traffic;
}

}  // namespace piper::comm
