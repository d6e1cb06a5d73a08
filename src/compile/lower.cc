#include "piper/compile/lower.h"

#include <algorithm>
#include <climits>
#include <map>
#include <tuple>
#include <unordered_map>

namespace piper::compile {
namespace {

using ir::Node;
using ir::NodeId;
using ir::NodeKind;

bool skipped(const Node& n) { return n.tags.part == "dissolved"; }

bool is_p2p(const Node& n) { return n.kind == NodeKind::kSend || n.kind == NodeKind::kRecv || n.kind == NodeKind::kM2N; }
bool receives(const Node& n) { return n.kind == NodeKind::kRecv || (n.kind == NodeKind::kM2N && !n.m2n_sender); }
// Both sides of a point-to-point pair are named "<producer>-><consumer>.send" / ".recv".
std::string pair_name(const Node& n) { return n.name.substr(0, n.name.rfind('.')); }

// Position key of a node inside its rank: (anchor index, 0 before / 1 the node / 2 after, topo index).
using Key = std::tuple<int64_t, int, int64_t>;

struct Buffer {
  int id = -1;
  int64_t bytes = 0;
  std::string what;  // "act L0.attn.F.mb1", "params L0.attn.ag.F.mb1"
};

Instruction buffer_op(OpKind op, const Buffer& b) {
  Instruction in;
  in.op = op;
  in.buffer = b.id;
  in.bytes = b.bytes;
  in.mem_delta = op == OpKind::kAlloc ? b.bytes : -b.bytes;
  in.label = std::string(op == OpKind::kAlloc ? "alloc " : "free ") + b.what;
  return in;
}

void default_cost(const ir::Graph& g, const Node& n, Instruction& in) {
  in.flops = n.flops;
  in.comm_bytes = n.comm_bytes;
  if (n.kind == NodeKind::kChunk) {
    int64_t params = n.param_count;
    if (n.shard_axis == "ep") params /= std::max(1, g.mesh.ep);
    if (n.shard_axis == "tp") params /= std::max(1, g.mesh.tp);
    in.bytes = params * g.param_bytes + n.activation_bytes;
  }
}

}  // namespace

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::kCompute: return "compute";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
    case OpKind::kCollective: return "collective";
    case OpKind::kRecord: return "record";
    case OpKind::kWait: return "wait";
    case OpKind::kAlloc: return "alloc";
    case OpKind::kFree: return "free";
    case OpKind::kUpdate: return "update";
  }
  return "?";
}

Result<int> insert_p2p(ir::Graph& g) {
  int count = 0;
  const size_t num_edges = g.edges().size();
  for (size_t e = 0; e < num_edges; ++e) {
    const ir::Edge ed = g.edge(static_cast<int>(e));
    if (!ed.alive) continue;
    const Node& a = g.node(ed.src);
    const Node& b = g.node(ed.dst);
    for (const Node* n : {&a, &b}) {
      if (n->pp_rank < 0) {
        return invalid_argument(ir::describe(*n) + " is not placed on a pipeline rank; add a place directive "
                                "whose filter covers its layer");
      }
    }
    if (a.pp_rank == b.pp_rank) continue;
    if (ed.kind == ir::EdgeKind::kTemporal) {
      return invalid_argument("temporal edge " + ir::describe(a) + " -> " + ir::describe(b) + " crosses ranks");
    }
    g.remove_edge(static_cast<int>(e));
    std::string name = a.name + "->" + b.name;
    Node s;
    s.kind = NodeKind::kSend;
    s.tags = a.tags;
    s.name = name + ".send";
    s.pp_rank = a.pp_rank;
    s.peer_pp_rank = b.pp_rank;
    s.stream = "p2p_to_" + std::to_string(b.pp_rank);
    s.group = "pp";
    s.comm_bytes = ed.bytes;
    Node r = s;
    r.kind = NodeKind::kRecv;
    r.tags = b.tags;
    r.name = name + ".recv";
    r.pp_rank = b.pp_rank;
    r.peer_pp_rank = a.pp_rank;
    r.stream = "p2p_from_" + std::to_string(a.pp_rank);
    NodeId sid = g.add_node(std::move(s));
    NodeId rid = g.add_node(std::move(r));
    g.add_edge(ed.src, sid, ir::EdgeKind::kData, ed.bytes);
    g.add_edge(rid, ed.dst, ir::EdgeKind::kData, ed.bytes);
    ++count;
  }
  return count;
}

Result<Plan> lower(ir::Graph& g, const LowerOptions& options) {
  PIPER_RETURN_IF_ERROR(insert_p2p(g).status());
  PIPER_ASSIGN_OR_RETURN(std::vector<NodeId> topo, g.topo_order());
  const size_t n = g.num_nodes();
  std::vector<int64_t> topo_pos(n);
  for (size_t i = 0; i < topo.size(); ++i) topo_pos[static_cast<size_t>(topo[i])] = static_cast<int64_t>(i);
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
  std::vector<int64_t> anchor(n, -1);
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
    for (size_t i = 0; i < list.size(); ++i) anchor[static_cast<size_t>(list[i])] = static_cast<int64_t>(i);
  }
  // ZeRO-3 prefetch window: the all-gather feeding the k-th compute instruction of a rank may start once the
  // (k-2)-th is done, so it overlaps the (k-1)-th but at most two gathered copies are live (FSDP's limit).
  // Without the edge a stream of all-gathers would run ahead of compute and materialise every parameter.
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = g.node(static_cast<NodeId>(i));
    if (nd.kind != NodeKind::kAllGather || nd.group == "tp" || nd.tags.mb < 0 || !g.preds(nd.id).empty()) continue;
    int64_t k = INT64_MAX;
    for (NodeId c : g.succs(nd.id)) {
      if (anchor[static_cast<size_t>(c)] >= 0) k = std::min(k, anchor[static_cast<size_t>(c)]);
    }
    if (k == INT64_MAX || k < 2) continue;
    const NodeId window = compute[static_cast<size_t>(nd.pp_rank)][static_cast<size_t>(k - 2)];
    g.add_edge(window, static_cast<NodeId>(i), ir::EdgeKind::kTemporal);
  }
  // Comm nodes: after their latest same-rank producer (through comm chains), else before their first consumer.
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
  auto compute_key = [&](NodeId id) -> Key {
    auto i = static_cast<size_t>(id);
    if (anchor[i] >= 0) return {anchor[i], 1, topo_pos[i]};
    if (after[i] >= 0) return {after[i], 2, topo_pos[i]};
    if (before[i] != INT64_MAX) return {before[i], 0, topo_pos[i]};
    return {INT64_MAX, 0, topo_pos[i]};
  };
  std::vector<Key> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = compute_key(static_cast<NodeId>(i));
  auto key_of = [&](NodeId id) -> const Key& { return keys[static_cast<size_t>(id)]; };

  // Streams per rank.
  Plan plan;
  plan.mesh = g.mesh;
  plan.templates.resize(static_cast<size_t>(pp));
  std::vector<std::map<std::string, std::vector<NodeId>>> streams(static_cast<size_t>(pp));
  for (const Node& nd : g.nodes()) {
    if (skipped(nd)) continue;
    if (nd.pp_rank < 0) return invalid_argument(ir::describe(nd) + " is not placed on a pipeline rank");
    streams[static_cast<size_t>(nd.pp_rank)][nd.stream].push_back(nd.id);
  }
  // Every stream in the order of its keys: compute follows the schedule, comm sits next to its chunks.
  for (auto& rank_streams : streams) {
    for (auto& [name, nodes] : rank_streams) {
      std::sort(nodes.begin(), nodes.end(), [&](NodeId a, NodeId b) { return key_of(a) < key_of(b); });
    }
  }
  // Point-to-point pairs share the name up to the last '.'; tags are numbered in send-node id order.
  std::vector<int64_t> tag_of(n, -1);
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
  // A receive stream posts its receives in the order its sender sends (FIFO per channel, as NCCL matches
  // point-to-point operations between two ranks): a message may arrive before its consumer needs it, but a
  // channel never blocks on its own order. Sends stay in production order.
  std::vector<size_t> pos(n, 0);
  for (auto& rank_streams : streams) {
    for (auto& [name, nodes] : rank_streams) {
      for (size_t k = 0; k < nodes.size(); ++k) pos[static_cast<size_t>(nodes[k])] = k;
    }
  }
  for (auto& rank_streams : streams) {
    for (auto& [name, nodes] : rank_streams) {
      const bool all_receives = std::all_of(nodes.begin(), nodes.end(), [&](NodeId id) {
        return is_p2p(g.node(id)) && receives(g.node(id));
      });
      if (!all_receives) continue;
      auto sender_key = [&](NodeId id) {
        const NodeId snd = partner[static_cast<size_t>(id)];
        return std::make_tuple(g.node(snd).pp_rank, g.node(snd).stream, pos[static_cast<size_t>(snd)]);
      };
      std::stable_sort(nodes.begin(), nodes.end(), [&](NodeId a, NodeId b) { return sender_key(a) < sender_key(b); });
    }
  }

  CostFn cost = options.cost ? options.cost : CostFn(default_cost);
  std::vector<int> event_of(n, -1);
  std::vector<std::pair<int, size_t>> where(n, {-1, 0});  // (stream index, position) per node
  std::vector<NodeId> recompute_of(n, ir::kNoNode);        // backward chunk -> the recomputed F it re-runs
  int next_event = 0, next_buffer = 0;
  for (int r = 0; r < pp; ++r) {
    Program& prog = plan.templates[static_cast<size_t>(r)];
    prog.pp_rank = r;
    auto& rank_streams = streams[static_cast<size_t>(r)];
    int si = 0;
    for (auto& [name, nodes] : rank_streams) {
      for (size_t k = 0; k < nodes.size(); ++k) where[static_cast<size_t>(nodes[k])] = {si, k};
      ++si;
    }
    // Which nodes need an event (a consumer on another stream of this rank).
    for (auto& [name, nodes] : rank_streams) {
      for (NodeId id : nodes) {
        for (NodeId s : g.succs(id)) {
          const Node& sn = g.node(s);
          if (sn.pp_rank != r || skipped(sn)) continue;
          auto [ws, wp] = where[static_cast<size_t>(s)];
          auto [ms, mp] = where[static_cast<size_t>(id)];
          if (ws != ms) {
            if (event_of[static_cast<size_t>(id)] < 0) event_of[static_cast<size_t>(id)] = next_event++;
          } else if (wp < mp) {
            return invalid_argument("rank " + std::to_string(r) + " stream '" + sn.stream + "': instruction " +
                                    std::to_string(wp) + " (" + sn.name + ") runs before instruction " +
                                    std::to_string(mp) + " (" + g.node(id).name +
                                    ") that it depends on; the stream order contradicts the DAG");
          }
        }
      }
    }
    // Buffers, planned before any stream is emitted (an alloc and its free may sit on different streams) and
    // numbered in node-id order, so plans do not depend on stream names.
    std::map<std::tuple<int, std::string, int>, NodeId> last_backward;
    for (const Node& nd : g.nodes()) {
      if (nd.pp_rank != r || nd.kind != NodeKind::kChunk || !ir::is_backward(nd.tags.pass)) continue;
      auto k = std::make_tuple(nd.tags.layer, nd.tags.part, nd.tags.mb);
      auto it = last_backward.find(k);
      if (it == last_backward.end() || key_of(it->second) < key_of(nd.id)) last_backward[k] = nd.id;
    }
    std::map<NodeId, Buffer> alloc_before;              // node -> buffer allocated right before it
    std::map<NodeId, Buffer> recompute_before;          // backward chunk -> buffer of the re-run F before it
    std::map<NodeId, std::vector<Buffer>> free_after;   // node -> buffers freed right after it
    for (const Node& nd : g.nodes()) {
      if (nd.pp_rank != r || skipped(nd)) continue;
      if (nd.kind == NodeKind::kAllGather && nd.group != "tp" && nd.tags.mb >= 0) {
        // ZeRO-3: the gathered parameters live until the chunk that uses them is done (re-shard).
        Buffer b{next_buffer++, nd.comm_bytes, "params " + nd.name};
        alloc_before[nd.id] = b;
        for (NodeId c : g.succs(nd.id)) {
          if (g.node(c).kind == NodeKind::kChunk) free_after[c].push_back(b);
        }
        continue;
      }
      if (nd.kind != NodeKind::kChunk || nd.tags.pass != ir::Pass::kF || nd.activation_bytes <= 0) continue;
      Buffer b{next_buffer++, nd.activation_bytes, "act " + nd.name};
      alloc_before[nd.id] = b;
      auto last = last_backward.find(std::make_tuple(nd.tags.layer, nd.tags.part, nd.tags.mb));
      if (!nd.recompute) {
        if (last != last_backward.end()) free_after[last->second].push_back(b);
        continue;
      }
      // Recompute: keep nothing after F; the first backward task that consumes F re-runs it.
      free_after[nd.id].push_back(b);
      for (NodeId c : g.succs(nd.id)) {
        const Node& cn = g.node(c);
        if (cn.kind != NodeKind::kChunk || !ir::is_backward(cn.tags.pass) || cn.pp_rank != r) continue;
        if (recompute_before.count(c)) continue;
        Buffer again{next_buffer++, nd.activation_bytes, "act " + nd.name + " (recompute)"};
        recompute_before[c] = again;
        if (last != last_backward.end()) free_after[last->second].push_back(again);
        recompute_of[static_cast<size_t>(c)] = nd.id;
      }
    }
    for (auto& [name, nodes] : rank_streams) {
      Stream st;
      st.name = name;
      st.instrs.reserve(2 * nodes.size());
      for (NodeId id : nodes) {
        const Node& nd = g.node(id);
        for (NodeId p : g.preds(id)) {
          const Node& pn = g.node(p);
          if (pn.pp_rank == r && where[static_cast<size_t>(p)].first != where[static_cast<size_t>(id)].first) {
            Instruction w;
            w.op = OpKind::kWait;
            w.event = event_of[static_cast<size_t>(p)];
            w.label = "wait " + pn.name;
            st.instrs.push_back(w);
          }
        }
        Instruction in;
        in.node = id;
        in.label = nd.name;
        in.pass = nd.tags.pass;
        in.mb = nd.tags.mb;
        in.group = nd.group;
        in.algorithm = nd.algorithm;
        switch (nd.kind) {
          case NodeKind::kChunk: in.op = OpKind::kCompute; break;
          case NodeKind::kUpdate: in.op = OpKind::kUpdate; break;
          case NodeKind::kSend: in.op = OpKind::kSend; break;
          case NodeKind::kRecv: in.op = OpKind::kRecv; break;
          case NodeKind::kM2N: in.op = nd.m2n_sender ? OpKind::kSend : OpKind::kRecv; break;
          default: in.op = OpKind::kCollective; break;
        }
        in.comm = nd.kind;
        if (nd.kind == NodeKind::kSend || nd.kind == NodeKind::kRecv || nd.kind == NodeKind::kM2N) {
          in.peer = nd.peer_pp_rank;
          in.tag = tag_of[static_cast<size_t>(id)];
        }
        cost(g, nd, in);
        if (auto it = alloc_before.find(id); it != alloc_before.end()) st.instrs.push_back(buffer_op(OpKind::kAlloc, it->second));
        if (auto it = recompute_before.find(id); it != recompute_before.end()) {
          const NodeId f = recompute_of[static_cast<size_t>(id)];
          const Node& fn = g.node(f);
          st.instrs.push_back(buffer_op(OpKind::kAlloc, it->second));
          Instruction re;
          re.op = OpKind::kCompute;
          re.node = f;
          re.label = fn.name + " (recompute)";
          re.pass = ir::Pass::kF;
          re.mb = fn.tags.mb;
          cost(g, fn, re);
          st.instrs.push_back(re);
        }
        st.instrs.push_back(in);
        if (auto it = free_after.find(id); it != free_after.end()) {
          for (const Buffer& b : it->second) {
            Instruction f = buffer_op(OpKind::kFree, b);
            f.label += b.what.rfind("params ", 0) == 0 ? " after " + nd.name + " (re-shard)"
                       : b.what == "act " + nd.name    ? " (recompute)"
                                                       : "";
            st.instrs.push_back(f);
          }
        }
        if (event_of[static_cast<size_t>(id)] >= 0) {
          Instruction rec;
          rec.op = OpKind::kRecord;
          rec.event = event_of[static_cast<size_t>(id)];
          rec.label = "record " + nd.name;
          st.instrs.push_back(rec);
        }
      }
      prog.streams.push_back(std::move(st));
    }
    // Resident model state per (layer, part) group of the rank: parameters (sharded over dp with ZeRO-3),
    // gradients (sharded with ZeRO-2/3) and fp32 Adam state with master weights (sharded with ZeRO >= 1).
    std::map<std::pair<int, std::string>, const Node*> first_fwd;
    for (const Node& c : g.nodes()) {
      if (c.pp_rank == r && c.kind == NodeKind::kChunk && c.tags.pass == ir::Pass::kF && c.tags.mb <= 0) {
        first_fwd.emplace(std::make_pair(c.tags.layer, c.tags.part), &c);
      }
    }
    for (const Node& nd : g.nodes()) {
      if (nd.pp_rank != r || nd.kind != NodeKind::kUpdate) continue;
      auto it = first_fwd.find({nd.tags.layer, nd.tags.part});
      if (it == first_fwd.end()) continue;
      int64_t params = it->second->param_count;
      const int zero = nd.zero;
      const std::string& axis = it->second->shard_axis;
      if (axis == "ep") params /= std::max(1, g.mesh.ep);
      if (axis == "tp") params /= std::max(1, g.mesh.tp);
      int64_t deg = nd.group.empty() ? 1 : nd.group == "edp" ? std::max(1, g.mesh.dp / g.mesh.ep) : g.mesh.dp;
      prog.static_bytes += params * g.param_bytes / (zero >= 3 ? deg : 1);
      prog.static_bytes += params * g.grad_bytes / (zero >= 2 ? deg : 1);
      prog.static_bytes += params * 12 / (zero >= 1 ? deg : 1);
    }
  }
  // Global ranks: tp innermost, then dp (ep inside dp), then pp; ranks sharing a pp coordinate share a program.
  const int tp = std::max(1, g.mesh.tp), dp = std::max(1, g.mesh.dp), ep = std::max(1, g.mesh.ep);
  plan.world_size = pp * dp * tp;
  for (int rank = 0; rank < plan.world_size; ++rank) {
    RankCoord c;
    c.tp = rank % tp;
    c.dp = (rank / tp) % dp;
    c.ep = c.dp % ep;
    c.pp = rank / (tp * dp);
    plan.coords.push_back(c);
    plan.rank_template.push_back(c.pp);
  }
  return plan;
}

}  // namespace piper::compile
