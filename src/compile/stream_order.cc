// order_streams: a total order for every (rank, stream), and the matching tags of point-to-point pairs.
#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <unordered_map>

#include "piper/compile/lower_steps.h"

namespace piper::compile {

using ir::Node;
using ir::NodeId;
using ir::NodeKind;

namespace {

// Inside each "may overlap" slot of a sorted compute list, alternate the chunks of the slot's filters, so that
// while one microbatch's chunk waits for its all-to-all, the other's computes (DualPipe's F&B overlap at chunk
// granularity). The filters take turns; in its turn a filter places its first ready chunk (every chunk of the slot
// it depends on, directly or through communication nodes, is placed) that does not need the communication output
// (dispatch, combine, ...) of the last two chunks placed; only when no filter has such a chunk does it take a
// ready one that does. A filter's chunks therefore keep their order except where a later one can run while an
// earlier one waits for communication. For a MoE layer pair (F of one microbatch, B of another) this gives
//   attn.F, shared.B, router.F, experts.B, shared.F, experts.F, router.B, attn.B
// (docs/simulator.md): every dispatch and combine runs behind a chunk of the other microbatch. A slot that cannot
// be completed this way keeps its order.
void interleave_overlap_slots(const ir::Graph& g, std::vector<NodeId>& list) {
  // True when `id` reads an output of chunk `last` through communication nodes only, at least one of them
  // outside the tensor-parallel group. A tensor-parallel collective sits between every two consecutive chunks of a
  // sequence-parallel layer and is short; counting it would make every chunk look like it waits for communication,
  // and the pair would degenerate to F, F, B, B on the all-to-all stream (an F dispatch queued behind a B combine
  // on the one `ep` stream, then both waiting on the expert GEMMs between them).
  auto needs_comm_of = [&](NodeId id, NodeId last) {
    const int rank = g.node(id).pp_rank;
    std::vector<std::pair<NodeId, bool>> todo;  // (communication node, a non-tp collective is on the path)
    for (NodeId p : g.preds(id)) {
      if (g.node(p).kind != NodeKind::kChunk && g.node(p).pp_rank == rank) todo.push_back({p, g.node(p).group != "tp"});
    }
    for (size_t k = 0; k < todo.size() && k < 64; ++k) {
      const auto [node, slow] = todo[k];
      for (NodeId q : g.preds(node)) {
        if (q == last && slow) return true;
        if (g.node(q).kind != NodeKind::kChunk && g.node(q).pp_rank == rank) {
          todo.push_back({q, slow || g.node(q).group != "tp"});
        }
      }
    }
    return false;
  };
  for (size_t i = 0; i < list.size();) {
    const int slot = g.node(list[i]).kind == NodeKind::kChunk ? g.node(list[i]).order_slot : -1;
    size_t j = i + 1;
    while (j < list.size() && slot >= 0 && g.node(list[j]).kind == NodeKind::kChunk &&
           g.node(list[j]).order_slot == slot)
      ++j;
    std::map<int, std::vector<NodeId>> by_filter_map;
    for (size_t k = i; k < j; ++k) by_filter_map[g.node(list[k]).order_filter].push_back(list[k]);
    if (by_filter_map.size() > 1) {
      std::vector<std::vector<NodeId>> by_filter;
      for (auto& [filter, nodes] : by_filter_map) by_filter.push_back(std::move(nodes));
      const size_t nf = by_filter.size();
      std::set<NodeId> in_slot(list.begin() + static_cast<std::ptrdiff_t>(i),
                               list.begin() + static_cast<std::ptrdiff_t>(j));
      std::set<NodeId> placed;
      std::vector<NodeId> merged;
      std::vector<std::vector<char>> done(nf);
      for (size_t f = 0; f < nf; ++f) done[f].assign(by_filter[f].size(), 0);
      size_t turn = 0;             // filter whose turn it is
      std::vector<NodeId> recent;  // the last two chunks placed
      // Every chunk of the slot that `id` depends on, directly or through communication nodes, is placed.
      auto ready = [&](NodeId id) {
        std::vector<NodeId> todo = g.preds(id);
        for (size_t k = 0; k < todo.size(); ++k) {
          const NodeId p = todo[k];
          if (in_slot.count(p)) {
            if (!placed.count(p)) return false;
          } else if (g.node(p).kind != NodeKind::kChunk && g.node(p).pp_rank == g.node(id).pp_rank) {
            for (NodeId q : g.preds(p)) todo.push_back(q);
          }
        }
        return true;
      };
      auto hot = [&](NodeId id) {
        for (NodeId r : recent) {
          if (needs_comm_of(id, r)) return true;
        }
        return false;
      };
      // Index of the first ready chunk of filter f in its order (with `cool`: the first one that does not need
      // the communication of the last two chunks placed; a later chunk of the filter may then go first, as long
      // as its own predecessors in the slot are placed); -1 if none.
      auto first = [&](size_t f, bool cool) -> int {
        for (size_t k = 0; k < by_filter[f].size(); ++k) {
          if (done[f][k]) continue;
          const NodeId id = by_filter[f][k];
          if (ready(id) && (!cool || !hot(id))) return static_cast<int>(k);
        }
        return -1;
      };
      while (merged.size() < j - i) {
        size_t pick = nf;
        int at = -1;
        for (int pass = 0; pass < 2 && pick == nf; ++pass) {  // ready and not waiting for fresh comm; else ready
          for (size_t k = 0; k < nf && pick == nf; ++k) {
            const size_t f = (turn + k) % nf;
            at = first(f, pass == 0);
            if (at >= 0) pick = f;
          }
        }
        if (pick == nf) break;
        const NodeId id = by_filter[pick][static_cast<size_t>(at)];
        done[pick][static_cast<size_t>(at)] = 1;
        merged.push_back(id);
        placed.insert(id);
        recent.push_back(id);
        if (recent.size() > 2) recent.erase(recent.begin());
        turn = (pick + 1) % nf;
      }
      if (merged.size() == j - i)
        std::copy(merged.begin(), merged.end(), list.begin() + static_cast<std::ptrdiff_t>(i));
    }
    i = j;
  }
}

}  // namespace

namespace {

using RankStreams = std::map<std::string, std::vector<NodeId>>;

// The compute (chunk and update) nodes of each rank in schedule order: order rows (slot, filter, topological
// position), updates last; anchor[id] = the node's position in its rank's list (-1 for others).
Result<std::vector<std::vector<NodeId>>> compute_order(const ir::Graph& g, const std::vector<int64_t>& topo_pos,
                                                       bool interleave_overlap, std::vector<int64_t>* anchor_out) {
  const size_t n = g.num_nodes();
  const int pp = g.mesh.pp;
  // Anchor index of compute nodes per rank.
  std::vector<bool> ordered_rank(static_cast<size_t>(pp), false);
  for (const Node& nd : g.nodes()) {
    if (nd.kind == NodeKind::kChunk && nd.order_slot >= 0) ordered_rank[static_cast<size_t>(nd.pp_rank)] = true;
  }
  std::vector<std::vector<NodeId>> compute(static_cast<size_t>(pp));
  for (const Node& nd : g.nodes()) {
    if (skipped(nd) || (nd.kind != NodeKind::kChunk && nd.kind != NodeKind::kUpdate)) continue;
    if (nd.kind == NodeKind::kChunk && ordered_rank[static_cast<size_t>(nd.pp_rank)] && nd.order_slot < 0) {
      return invalid_argument("rank " + std::to_string(nd.pp_rank) + ": " + ir::describe(nd) +
                              " is not in any order row while other chunks of the rank are; order every chunk");
    }
    compute[static_cast<size_t>(nd.pp_rank)].push_back(nd.id);
  }
  std::vector<int64_t>& anchor = *anchor_out;
  anchor.assign(n, -1);
  for (auto& list : compute) {
    std::sort(list.begin(), list.end(), [&](NodeId x, NodeId y) {
      const Node& a = g.node(x);
      const Node& b = g.node(y);
      auto key = [&](const Node& v) {
        int slot = v.kind == NodeKind::kUpdate ? INT_MAX : v.order_slot;
        return std::make_tuple(slot, v.order_filter, topo_pos[static_cast<size_t>(v.id)]);
      };
      return key(a) < key(b);
    });
    if (interleave_overlap) interleave_overlap_slots(g, list);
    for (size_t i = 0; i < list.size(); ++i) anchor[static_cast<size_t>(list[i])] = static_cast<int64_t>(i);
  }
  return compute;
}

void add_prefetch_windows(ir::Graph& g, const std::vector<std::vector<NodeId>>& compute) {
  const size_t n = g.num_nodes();
  // ZeRO-3 prefetch window, per FSDP unit: a unit is a run of consecutive compute instructions of one layer and
  // microbatch (a layer's attention, router, experts ... chunks of one pass, with a backward's recomputed
  // forward), as Megatron-FSDP and PyTorch FSDP wrap each transformer layer. The all-gather feeding an
  // instruction of unit u may start once unit u-2 is done: it overlaps all of unit u-1 and at most two units'
  // gathered parameters are live (FSDP's current + prefetched). Without the edge a stream of all-gathers would
  // run ahead of compute and materialise every parameter. Megatron-FSDP: megatron_fsdp.py
  // _pre_forward_param_unshard / _pre_backward_param_unshard gather a layer and prefetch the next.
  std::vector<char> gather_seen(n, 0);
  for (const auto& list : compute) {
    // last_before[k]: the last instruction of the unit two before instruction k's (-1: none).
    std::vector<int64_t> last_before(list.size(), -1);
    int64_t unit_start = 0, prev_unit_start = -1;
    for (size_t k = 0; k < list.size(); ++k) {
      const Node& a = g.node(list[k]);
      if (k > 0) {
        const Node& b = g.node(list[k - 1]);
        const bool same = a.kind == NodeKind::kChunk && b.kind == NodeKind::kChunk && a.tags.layer == b.tags.layer &&
                          a.tags.mb == b.tags.mb && a.tags.layer >= 0;
        if (!same) {
          prev_unit_start = unit_start;
          unit_start = static_cast<int64_t>(k);
        }
      }
      last_before[k] = prev_unit_start - 1;
    }
    // Instructions in order: a gather is first met at its earliest consumer, which decides its window.
    for (size_t k = 0; k < list.size(); ++k) {
      for (NodeId p : g.preds(list[k])) {
        const Node& nd = g.node(p);
        if (gather_seen[static_cast<size_t>(p)] || nd.kind != NodeKind::kAllGather || nd.group == "tp" ||
            nd.tags.mb < 0 || !g.preds(p).empty())
          continue;
        gather_seen[static_cast<size_t>(p)] = 1;
        if (last_before[k] >= 0) g.add_edge(list[static_cast<size_t>(last_before[k])], p, ir::EdgeKind::kTemporal);
      }
    }
  }
}

// Comm nodes: after their latest same-rank producer (through comm chains), else before their first consumer.
std::vector<OrderKey> order_keys(const ir::Graph& g, const std::vector<NodeId>& topo,
                                 const std::vector<int64_t>& topo_pos, const std::vector<int64_t>& anchor) {
  const size_t n = g.num_nodes();
  std::vector<int64_t> after(n, -1), before(n, INT64_MAX);
  for (NodeId id : topo) {
    const Node& nd = g.node(id);
    if (anchor[static_cast<size_t>(id)] >= 0) continue;
    for (NodeId p : g.preds(id)) {
      if (g.node(p).pp_rank != nd.pp_rank) continue;
      int64_t a = anchor[static_cast<size_t>(p)] >= 0 ? anchor[static_cast<size_t>(p)] : after[static_cast<size_t>(p)];
      after[static_cast<size_t>(id)] = std::max(after[static_cast<size_t>(id)], a);
    }
  }
  for (size_t k = topo.size(); k-- > 0;) {
    NodeId id = topo[k];
    const Node& nd = g.node(id);
    if (anchor[static_cast<size_t>(id)] >= 0) continue;
    for (NodeId s : g.succs(id)) {
      if (g.node(s).pp_rank != nd.pp_rank) continue;
      int64_t b = anchor[static_cast<size_t>(s)] >= 0 ? anchor[static_cast<size_t>(s)] : before[static_cast<size_t>(s)];
      before[static_cast<size_t>(id)] = std::min(before[static_cast<size_t>(id)], b);
    }
  }
  auto compute_key = [&](NodeId id) -> OrderKey {
    auto i = static_cast<size_t>(id);
    if (anchor[i] >= 0) return {anchor[i], 1, topo_pos[i]};
    if (after[i] >= 0) return {after[i], 2, topo_pos[i]};
    if (before[i] != INT64_MAX) return {before[i], 0, topo_pos[i]};
    return {INT64_MAX, 0, topo_pos[i]};
  };
  std::vector<OrderKey> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = compute_key(static_cast<NodeId>(i));
  return keys;
}

// Every rank's streams, each in the order of its keys: compute follows the schedule, comm sits next to its chunks.
Status group_streams(const ir::Graph& g, const std::vector<OrderKey>& keys, std::vector<RankStreams>* streams_out) {
  auto key_of = [&](NodeId id) -> const OrderKey& { return keys[static_cast<size_t>(id)]; };
  auto& streams = *streams_out;
  streams.resize(static_cast<size_t>(g.mesh.pp));
  for (const Node& nd : g.nodes()) {
    if (skipped(nd)) continue;
    if (nd.pp_rank < 0) return invalid_argument(ir::describe(nd) + " is not placed on a pipeline rank");
    streams[static_cast<size_t>(nd.pp_rank)][nd.stream].push_back(nd.id);
  }
  for (auto& rank_streams : streams) {
    for (auto& [name, nodes] : rank_streams) {
      std::sort(nodes.begin(), nodes.end(), [&](NodeId a, NodeId b) { return key_of(a) < key_of(b); });
    }
  }
  return ok_status();
}

// Point-to-point pairs share the name up to the last '.'; tags are numbered in send-node id order. Returns each
// p2p node's partner.
Result<std::vector<NodeId>> number_p2p_tags(const ir::Graph& g, std::vector<int64_t>* tags) {
  const size_t n = g.num_nodes();
  std::vector<int64_t>& tag_of = *tags;
  tag_of.assign(n, -1);
  std::vector<NodeId> partner(n, ir::kNoNode);
  {
    std::unordered_map<std::string, NodeId> send_of;
    for (const Node& nd : g.nodes()) {
      if (is_p2p(nd) && !receives(nd) && !skipped(nd)) send_of.emplace(pair_name(nd), nd.id);
    }
    for (const Node& nd : g.nodes()) {
      if (!is_p2p(nd) || !receives(nd) || skipped(nd)) continue;
      auto it = send_of.find(pair_name(nd));
      if (it == send_of.end()) return internal_error("lower: receive " + nd.name + " has no send");
      partner[static_cast<size_t>(nd.id)] = it->second;
      partner[static_cast<size_t>(it->second)] = nd.id;
    }
    int64_t next_tag = 0;
    for (const Node& nd : g.nodes()) {
      if (is_p2p(nd) && !receives(nd) && partner[static_cast<size_t>(nd.id)] != ir::kNoNode) {
        tag_of[static_cast<size_t>(nd.id)] = tag_of[static_cast<size_t>(partner[static_cast<size_t>(nd.id)])] =
            next_tag++;
      }
    }
  }
  return partner;
}

  // A receive stream posts its receives in the order its sender sends (FIFO per channel, as NCCL matches
  // point-to-point operations between two ranks): a message may arrive before its consumer needs it, but a
  // channel never blocks on its own order. Sends stay in production order.
void receives_in_sender_order(const ir::Graph& g, const std::vector<NodeId>& partner,
                              std::vector<RankStreams>& streams) {
  std::vector<size_t> pos(g.num_nodes(), 0);
  for (auto& rank_streams : streams) {
    for (auto& [name, nodes] : rank_streams) {
      for (size_t k = 0; k < nodes.size(); ++k) pos[static_cast<size_t>(nodes[k])] = k;
    }
  }
  for (auto& rank_streams : streams) {
    for (auto& [name, nodes] : rank_streams) {
      const bool all_receives = std::all_of(nodes.begin(), nodes.end(),
                                            [&](NodeId id) { return is_p2p(g.node(id)) && receives(g.node(id)); });
      if (!all_receives) continue;
      auto sender_key = [&](NodeId id) {
        const NodeId snd = partner[static_cast<size_t>(id)];
        return std::make_tuple(g.node(snd).pp_rank, g.node(snd).stream, pos[static_cast<size_t>(snd)]);
      };
      std::stable_sort(nodes.begin(), nodes.end(), [&](NodeId a, NodeId b) { return sender_key(a) < sender_key(b); });
    }
  }
}

}  // namespace

Result<StreamOrder> order_streams(ir::Graph& g, bool interleave_overlap) {
  PIPER_ASSIGN_OR_RETURN(std::vector<NodeId> topo, g.topo_order());
  std::vector<int64_t> topo_pos(g.num_nodes());
  for (size_t i = 0; i < topo.size(); ++i) topo_pos[static_cast<size_t>(topo[i])] = static_cast<int64_t>(i);
  std::vector<int64_t> anchor;
  PIPER_ASSIGN_OR_RETURN(std::vector<std::vector<NodeId>> compute,
                         compute_order(g, topo_pos, interleave_overlap, &anchor));
  add_prefetch_windows(g, compute);
  StreamOrder out;
  out.keys = order_keys(g, topo, topo_pos, anchor);
  PIPER_RETURN_IF_ERROR(group_streams(g, out.keys, &out.streams));
  PIPER_ASSIGN_OR_RETURN(std::vector<NodeId> partner, number_p2p_tags(g, &out.tag));
  receives_in_sender_order(g, partner, out.streams);
  return out;
}

}  // namespace piper::compile
