#include "piper/comm/algorithms/moe_combine.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "piper/comm/algorithms/pairwise_all_to_all.h"

namespace piper::comm {
namespace {

// Step 2 metadata: the slot of a token as seen by the reducer of one remote node.
struct SlotRef {
  int32_t local;  // local rank of the slot's expert on the reducer's node, -1 when the slot is elsewhere
  float weight;
};
static_assert(sizeof(SlotRef) == 8);

Status check_inputs(const MoeRouting& routing, int group_size, int64_t hidden, std::span<const float> weights) {
  PIPER_RETURN_IF_ERROR(routing.validate(group_size));
  if (hidden < 1) return invalid_argument("moe combine: hidden=" + std::to_string(hidden) + " must be >= 1");
  const size_t slots = static_cast<size_t>(routing.num_tokens) * routing.top_k;
  if (weights.size() != slots) {
    return invalid_argument("moe combine: expected num_tokens * top_k = " + std::to_string(slots) +
                            " routing weights, got " + std::to_string(weights.size()));
  }
  return ok_status();
}

Status check_rows(std::span<const float> rows, uint64_t received_rows, int64_t hidden) {
  if (rows.size() != received_rows * static_cast<uint64_t>(hidden)) {
    return invalid_argument("moe combine: expert_rows has " + std::to_string(rows.size()) + " floats but this rank " +
                            "received " + std::to_string(received_rows) + " rows in the dispatch (expected rows * " +
                            "hidden = " + std::to_string(received_rows * hidden) +
                            "); pass the expert outputs in dispatch order");
  }
  return ok_status();
}

Status exchange(Communicator& comm, const void* send, std::span<const size_t> send_bytes, void* recv,
                std::span<const size_t> recv_bytes, double timeout_s) {
  PIPER_ASSIGN_OR_RETURN(Handle h, comm.all_to_all_v(send, send_bytes, recv, recv_bytes));
  return comm.wait(h, timeout_s);
}

void add_scaled(float* acc, const float* row, float w, int64_t hidden) {
  for (int64_t c = 0; c < hidden; ++c) acc[c] += w * row[c];
}

}  // namespace

Result<std::vector<float>> flat_combine(Communicator& comm, std::span<const float> expert_rows, int64_t hidden,
                                        const MoeRouting& routing, std::span<const float> topk_weights,
                                        FlatDispatchKind kind, double timeout_s) {
  PIPER_RETURN_IF_ERROR(check_inputs(routing, comm.size(), hidden, topk_weights));
  const int p = comm.size(), k = routing.top_k;
  std::vector<uint64_t> rows_to(p, 0), rows_from(p, 0);
  for (int d : routing.dest_ranks) {
    if (d >= 0) ++rows_to[d];
  }
  std::vector<size_t> eight(p, sizeof(uint64_t));
  PIPER_RETURN_IF_ERROR(exchange(comm, rows_to.data(), eight, rows_from.data(), eight, timeout_s));
  uint64_t received = 0, sent = 0;
  std::vector<size_t> send_bytes(p), recv_bytes(p);
  std::vector<uint64_t> first_row(p);  // first row of expert rank d's block in `back`
  for (int r = 0; r < p; ++r) {
    received += rows_from[r];
    first_row[r] = sent;
    sent += rows_to[r];
    send_bytes[r] = rows_from[r] * hidden * sizeof(float);
    recv_bytes[r] = rows_to[r] * hidden * sizeof(float);
  }
  PIPER_RETURN_IF_ERROR(check_rows(expert_rows, received, hidden));
  std::vector<float> back(sent * hidden);
  if (kind == FlatDispatchKind::kPairwise) {
    PIPER_RETURN_IF_ERROR(
        pairwise_all_to_all_v(comm, expert_rows.data(), send_bytes, back.data(), recv_bytes, timeout_s));
  } else {
    PIPER_RETURN_IF_ERROR(exchange(comm, expert_rows.data(), send_bytes, back.data(), recv_bytes, timeout_s));
  }
  std::vector<float> y(static_cast<size_t>(routing.num_tokens) * hidden, 0.0f);
  for (int64_t t = 0; t < routing.num_tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      int d = routing.dest_ranks[t * k + j];
      if (d < 0) continue;
      add_scaled(y.data() + t * hidden, back.data() + first_row[d]++ * hidden, topk_weights[t * k + j], hidden);
    }
  }
  return y;
}


Result<std::vector<float>> halo_combine(HaloContext& context, std::span<const float> expert_rows, int64_t hidden,
                                        const MoeRouting& routing, std::span<const float> topk_weights,
                                        double timeout_s) {
  Communicator& comm = context.data();
  const NodeTopology& t = context.topology();
  PIPER_RETURN_IF_ERROR(check_inputs(routing, comm.size(), hidden, topk_weights));
  const int p = t.group_size(), nodes = t.num_nodes(), me = comm.rank(), node = t.node_of(me);
  const int gpn = t.ranks_per_node(), k = routing.top_k;
  const size_t row_bytes = hidden * sizeof(float);

  // 1. Row counts per destination rank and distinct tokens per remote node, of every rank.
  const size_t stride = p + nodes;
  std::vector<uint64_t> mine(stride, 0), table(stride * p);
  std::vector<char> hit(nodes);
  for (int64_t tok = 0; tok < routing.num_tokens; ++tok) {
    std::fill(hit.begin(), hit.end(), 0);
    for (int j = 0; j < k; ++j) {
      int d = routing.dest_ranks[tok * k + j];
      if (d < 0) continue;
      ++mine[d];
      if (t.node_of(d) != node && !hit[t.node_of(d)]) {
        hit[t.node_of(d)] = 1;
        ++mine[p + t.node_of(d)];
      }
    }
  }
  PIPER_ASSIGN_OR_RETURN(Handle h, comm.all_gather(mine.data(), table.data(), stride * sizeof(uint64_t)));
  PIPER_RETURN_IF_ERROR(comm.wait(h, timeout_s));
  auto rows = [&](int s, int r) { return table[s * stride + r]; };
  auto tokens_to = [&](int s, int m) { return table[s * stride + p + m]; };
  // The rank of node m that reduces the slots of source s (the receive proxy of s's lane in the dispatch).
  auto reducer = [&](int s, int m) { return t.rank_of(m, t.recv_proxy(t.node_of(s), m, t.lane_of(t.local_of(s)))); };
  auto served = [&](int s) { return t.node_of(s) != node && reducer(s, node) == me; };
  std::vector<uint64_t> first_row(p + 1, 0);  // first row from source s in expert_rows
  for (int s = 0; s < p; ++s) first_row[s + 1] = first_row[s] + rows(s, me);
  PIPER_RETURN_IF_ERROR(check_rows(expert_rows, first_row[p], hidden));

  // 2. Slot metadata to the reducers (ranks of different nodes: node order is rank order).
  std::vector<size_t> send_bytes(p, 0), recv_bytes(p, 0);
  std::vector<std::vector<SlotRef>> meta_out(nodes);
  for (int64_t tok = 0; tok < routing.num_tokens; ++tok) {
    std::fill(hit.begin(), hit.end(), 0);
    for (int j = 0; j < k; ++j) {
      int d = routing.dest_ranks[tok * k + j];
      if (d >= 0 && t.node_of(d) != node) hit[t.node_of(d)] = 1;
    }
    for (int m = 0; m < nodes; ++m) {
      if (!hit[m]) continue;
      for (int j = 0; j < k; ++j) {
        int d = routing.dest_ranks[tok * k + j];
        bool here = d >= 0 && t.node_of(d) == m;
        meta_out[m].push_back(SlotRef{here ? t.local_of(d) : -1, topk_weights[tok * k + j]});
      }
    }
  }
  std::vector<SlotRef> meta_send, meta_recv;
  for (int m = 0; m < nodes; ++m) {
    send_bytes[reducer(me, m)] += meta_out[m].size() * sizeof(SlotRef);
    meta_send.insert(meta_send.end(), meta_out[m].begin(), meta_out[m].end());
  }
  size_t meta_total = 0;
  for (int s = 0; s < p; ++s) {
    if (served(s)) recv_bytes[s] = tokens_to(s, node) * k * sizeof(SlotRef);
    meta_total += recv_bytes[s] / sizeof(SlotRef);
  }
  meta_recv.resize(meta_total);
  // Waited for together with step 3: the rows a reducer receives do not depend on the metadata, so the node-local
  // shuffle overlaps the metadata's trip across nodes (send_bytes and recv_bytes stay untouched until then).
  PIPER_ASSIGN_OR_RETURN(Handle meta, comm.all_to_all_v(meta_send.data(), send_bytes, meta_recv.data(), recv_bytes));

  // 3. Inside the node: rows of remote sources to their reducer, grouped by reducer then source.
  std::vector<size_t> node_send(gpn, 0), node_recv(gpn, 0);
  std::vector<float> rows_send, rows_recv;
  for (int g = 0; g < gpn; ++g) {
    for (int s = 0; s < p; ++s) {
      if (t.node_of(s) == node || reducer(s, node) != t.rank_of(node, g)) continue;
      const float* from = expert_rows.data() + first_row[s] * hidden;
      rows_send.insert(rows_send.end(), from, from + rows(s, me) * hidden);
      node_send[g] += rows(s, me) * row_bytes;
    }
    for (int s = 0; s < p; ++s) {
      if (served(s)) node_recv[g] += rows(s, t.rank_of(node, g)) * row_bytes;
    }
  }
  size_t recv_rows_total = 0;
  std::vector<size_t> cursor(gpn, 0);  // next float of expert g's block in rows_recv
  for (int g = 0; g < gpn; ++g) {
    cursor[g] = recv_rows_total;
    recv_rows_total += node_recv[g] / sizeof(float);
  }
  rows_recv.resize(recv_rows_total);
  PIPER_ASSIGN_OR_RETURN(Handle shuffle,
                         context.node().all_to_all_v(rows_send.data(), node_send, rows_recv.data(), node_recv));
  PIPER_RETURN_IF_ERROR(context.node().wait(shuffle, timeout_s));
  PIPER_RETURN_IF_ERROR(comm.wait(meta, timeout_s));

  // 4. Reduce, and 5. send partials and same-node rows back to the sources.
  std::vector<float> back_send;
  std::fill(send_bytes.begin(), send_bytes.end(), 0);
  std::fill(recv_bytes.begin(), recv_bytes.end(), 0);
  const SlotRef* ref = meta_recv.data();
  for (int s = 0; s < p; ++s) {
    if (t.node_of(s) == node) {
      const float* from = expert_rows.data() + first_row[s] * hidden;
      back_send.insert(back_send.end(), from, from + rows(s, me) * hidden);
      send_bytes[s] = rows(s, me) * row_bytes;
      recv_bytes[s] = rows(me, s) * row_bytes;
      continue;
    }
    if (t.node_of(s) != node && reducer(me, t.node_of(s)) == s) recv_bytes[s] = tokens_to(me, t.node_of(s)) * row_bytes;
    if (!served(s)) continue;
    const size_t base = back_send.size();
    back_send.resize(base + tokens_to(s, node) * hidden, 0.0f);
    for (uint64_t i = 0; i < tokens_to(s, node); ++i, ref += k) {
      for (int j = 0; j < k; ++j) {
        if (ref[j].local < 0) continue;
        add_scaled(back_send.data() + base + i * hidden, rows_recv.data() + cursor[ref[j].local], ref[j].weight,
                   hidden);
        cursor[ref[j].local] += hidden;
      }
    }
    send_bytes[s] = tokens_to(s, node) * row_bytes;
  }
  if (ref != meta_recv.data() + meta_recv.size()) return internal_error("moe combine: slot metadata not consumed");
  std::vector<size_t> first(p + 1, 0);  // first float from rank r in `back`
  for (int r = 0; r < p; ++r) first[r + 1] = first[r] + recv_bytes[r] / sizeof(float);
  std::vector<float> back(first[p]);
  PIPER_RETURN_IF_ERROR(halo_all_to_all_v(context, back_send.data(), send_bytes, back.data(), recv_bytes, timeout_s));

  // 6. Weighted sum in slot order; a remote node's partial enters at its first slot.
  std::vector<float> y(static_cast<size_t>(routing.num_tokens) * hidden, 0.0f);
  for (int64_t tok = 0; tok < routing.num_tokens; ++tok) {
    std::fill(hit.begin(), hit.end(), 0);
    float* acc = y.data() + tok * hidden;
    for (int j = 0; j < k; ++j) {
      int d = routing.dest_ranks[tok * k + j];
      if (d < 0) continue;
      int m = t.node_of(d);
      if (m == node) {
        add_scaled(acc, back.data() + first[d], topk_weights[tok * k + j], hidden);
        first[d] += hidden;
      } else if (!hit[m]) {
        hit[m] = 1;
        const int r = reducer(me, m);
        for (int64_t c = 0; c < hidden; ++c) acc[c] += back[first[r] + c];
        first[r] += hidden;
      }
    }
  }
  return y;
}

CombineTraffic combine_traffic(const NodeTopology& t, int rank, int64_t hidden, const MoeRouting& routing) {
  CombineTraffic traffic;
  const int node = t.node_of(rank);
  const int64_t row_bytes = hidden * static_cast<int64_t>(sizeof(float));
  std::vector<char> hit(t.num_nodes());
  for (int64_t tok = 0; tok < routing.num_tokens; ++tok) {
    std::fill(hit.begin(), hit.end(), 0);
    for (int j = 0; j < routing.top_k; ++j) {
      int d = routing.dest_ranks[tok * routing.top_k + j];
      if (d < 0 || t.node_of(d) == node) continue;
      traffic.flat_internode_bytes += row_bytes;
      if (!hit[t.node_of(d)]) {
        hit[t.node_of(d)] = 1;
        traffic.halo_internode_bytes += row_bytes + routing.top_k * static_cast<int64_t>(sizeof(SlotRef));
      }
    }
  }
  return traffic;
}

}  // namespace piper::comm
