// lower(): the driver of the lowering steps (lower_steps.h) and the instruction emission.
#include "piper/compile/lower.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "piper/compile/lower_steps.h"
#include "piper/strategy/strategy.h"  // kTpOverlapRsPieces

namespace piper::compile {
namespace {

using ir::Node;
using ir::NodeId;
using ir::NodeKind;

Instruction buffer_op(OpKind op, const Buffer& b) {
  Instruction in;
  in.op = op;
  in.buffer = b.id;
  in.bytes = b.bytes;
  in.mem_delta = op == OpKind::kAlloc ? b.bytes : -b.bytes;
  in.label = std::string(op == OpKind::kAlloc ? "alloc " : "free ") + b.what;
  return in;
}

// A piece of a split node (tp_overlap) carries no cost of its own here: the node's totals stay on its kRest
// instruction. (The simulator's CostFn prices each piece: sim/task_time.cc.)
void default_cost(const ir::Graph& g, const Node& n, Instruction& in) {
  if (in.segment == Segment::kIn || in.segment == Segment::kOut) return;
  in.flops = n.flops;
  in.comm_bytes = n.comm_bytes;
  if (n.kind == NodeKind::kChunk) {
    int64_t params = n.param_count;
    if (n.shard_axis == "ep") params /= std::max(1, g.mesh.ep);
    if (n.shard_axis == "tp") params /= std::max(1, g.mesh.tp);
    in.bytes = params * g.param_bytes + n.activation_bytes;
  }
}

// A tp chunk's own collectives: the all-gather of its input (sequence parallelism) before it, the all-reduce or
// reduce-scatter of its output after it. (A pred all-reduce is the previous chunk's output, not this one's.)
bool is_tp_input_collective(const Node& n) { return n.group == "tp" && n.kind == NodeKind::kAllGather; }
bool is_tp_output_collective(const Node& n) {
  return n.group == "tp" && (n.kind == NodeKind::kAllReduce || n.kind == NodeKind::kReduceScatter);
}

// LowerOptions::tp_overlap: a tp chunk that runs as pieces, with its all-gather (ag) and reduce-scatter (rs),
// either of which may be absent, and the events between the pieces.
struct TpSplit {
  NodeId ag = ir::kNoNode, rs = ir::kNoNode;
  std::vector<int> in_events;   // all-gather piece i -> GEMM piece i + 1
  std::vector<int> out_events;  // GEMM piece i -> reduce-scatter piece i
};

bool overlapped_part(const Node& n) {
  const std::string& p = n.tags.part;
  const bool pass = n.tags.pass == ir::Pass::kF || n.tags.pass == ir::Pass::kB || n.tags.pass == ir::Pass::kBW;
  return n.kind == NodeKind::kChunk && n.shard_axis == "tp" && pass && (p == "attn" || p == "mlp" || p == "shared");
}

Instruction event_op(OpKind op, int event, const std::string& label) {
  Instruction in;
  in.op = op;
  in.event = event;
  in.label = label;
  return in;
}

Instruction piece_of(const Instruction& whole, Segment seg, int i, int n) {
  Instruction p = whole;
  p.segment = seg;
  p.pieces = n;
  p.label += std::string(" [") + to_string(seg) + " " + std::to_string(i + 1) + "/" + std::to_string(n) + "]";
  return p;
}

// What communication node `nd` means to an executor (Instruction::role).
CommRole comm_role(const Node& nd) {
  switch (nd.kind) {
    case NodeKind::kSend:
    case NodeKind::kRecv:
      return CommRole::kPipeline;
    case NodeKind::kM2N:
      if (nd.m2n_dst_part == "experts") return CommRole::kM2NToExperts;
      return nd.m2n_src_part == "experts" ? CommRole::kM2NFromExperts : CommRole::kM2NDense;
    case NodeKind::kAllToAll:
      if (nd.tags.part == "dispatch") return CommRole::kEpDispatch;
      return nd.tags.part == "combine" ? CommRole::kEpCombine : CommRole::kNone;
    case NodeKind::kAllGather:
    case NodeKind::kReduceScatter:
    case NodeKind::kAllReduce:
      if (nd.group == "tp") {
        return nd.kind == NodeKind::kAllGather       ? CommRole::kTpGather
               : nd.kind == NodeKind::kReduceScatter ? CommRole::kTpScatter
                                                     : CommRole::kTpReduce;
      }
      if (nd.group == "dp" || nd.group == "edp") {
        return nd.kind == NodeKind::kAllGather ? CommRole::kParamGather : CommRole::kGradReduce;
      }
      return CommRole::kNone;
    default:
      return CommRole::kNone;
  }
}

// The instruction that runs node `nd` (send/recv peers and tags, and the cost, are the caller's).
Instruction node_instruction(const Node& nd) {
  Instruction in;
  in.node = nd.id;
  in.label = nd.name;
  in.pass = nd.tags.pass;
  in.mb = nd.tags.mb;
  in.layer = nd.tags.layer;
  in.part = nd.tags.part;
  in.group = nd.group;
  in.algorithm = nd.algorithm;
  in.comm_bytes = nd.comm_bytes;
  in.role = comm_role(nd);
  switch (nd.kind) {
    case NodeKind::kChunk:
      in.op = OpKind::kCompute;
      break;
    case NodeKind::kUpdate:
      in.op = OpKind::kUpdate;
      break;
    case NodeKind::kSend:
      in.op = OpKind::kSend;
      break;
    case NodeKind::kRecv:
      in.op = OpKind::kRecv;
      break;
    case NodeKind::kM2N:
      in.op = nd.m2n_sender ? OpKind::kSend : OpKind::kRecv;
      break;
    default:
      in.op = OpKind::kCollective;
      break;
  }
  in.comm = nd.kind;
  return in;
}

// LowerOptions::recompute_reruns_tp_collectives: collective `c` of a recomputed forward, run again.
template <typename Cost>
Instruction rerun_collective(const ir::Graph& g, const Node& c, const Cost& cost) {
  Instruction in = node_instruction(c);
  in.label += " (recompute)";
  cost(g, c, in);
  return in;
}

// LowerOptions::p2p_scatter_gather: the receiver all-gathers the tp pieces of a received tensor (2021 Megatron-LM's
// mpu.gather_split_1d_tensor), `bytes` the whole tensor.
Instruction gather_split(const Node& recv, int64_t bytes) {
  Instruction in;
  in.op = OpKind::kCollective;
  in.comm = NodeKind::kAllGather;
  in.group = "tp";
  in.algorithm = "ring";
  in.label = recv.name + " (gather tp pieces)";
  in.pass = recv.tags.pass;
  in.mb = recv.tags.mb;
  in.layer = recv.tags.layer;
  in.part = recv.tags.part;
  in.role = CommRole::kTpGather;
  in.comm_bytes = bytes;
  return in;
}

}  // namespace

Result<Plan> lower(ir::Graph& g, const LowerOptions& options) {
  PIPER_RETURN_IF_ERROR(insert_p2p(g).status());
  PIPER_ASSIGN_OR_RETURN(StreamOrder order, order_streams(g, options.interleave_overlap));
  if (options.p2p_blocking || options.dp_reduce_after_backward) {
    add_legacy_pipeline_edges(g, order, options.p2p_blocking, options.dp_reduce_after_backward);
  }
  const size_t n = g.num_nodes();
  const int pp = g.mesh.pp;
  const std::vector<int64_t>& tag_of = order.tag;
  Plan plan;
  plan.mesh = g.mesh;
  plan.templates.resize(static_cast<size_t>(pp));
  auto cost = [&options](const ir::Graph& graph, const Node& nd, Instruction& in) {
    if (options.cost) {
      options.cost(in);
    } else {
      default_cost(graph, nd, in);
    }
  };
  std::vector<int> event_of(n, -1);
  std::vector<std::pair<int, size_t>> where(n, {-1, 0});  // (stream index, position) per node
  int next_event = 0, next_buffer = 0;
  for (int r = 0; r < pp; ++r) {
    Program& prog = plan.templates[static_cast<size_t>(r)];
    prog.pp_rank = r;
    auto& rank_streams = order.streams[static_cast<size_t>(r)];
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
    // tp_overlap: the chunks that run as pieces. Their collective must sit on another stream and serve only them.
    std::unordered_map<NodeId, TpSplit> splits;
    std::unordered_map<NodeId, NodeId> split_owner;  // a split all-gather / reduce-scatter -> its chunk
    const int tp = std::max(1, g.mesh.tp), rs_pieces = kTpOverlapRsPieces;
    if (options.tp_overlap && tp > 1) {
      auto other_stream_only = [&](NodeId c, NodeId x, const std::vector<NodeId>& ends) {
        if (g.node(c).pp_rank != r || where[static_cast<size_t>(c)].first == where[static_cast<size_t>(x)].first)
          return false;
        return std::all_of(ends.begin(), ends.end(), [&](NodeId e) { return e == x; });
      };
      for (auto& [name, nodes] : rank_streams) {
        for (NodeId id : nodes) {
          if (!overlapped_part(g.node(id))) continue;
          TpSplit sp;
          for (NodeId p : g.preds(id)) {
            if (is_tp_input_collective(g.node(p)) && other_stream_only(p, id, g.succs(p))) sp.ag = p;
          }
          for (NodeId q : g.succs(id)) {
            const Node& qn = g.node(q);
            if (qn.group == "tp" && qn.kind == NodeKind::kReduceScatter && other_stream_only(q, id, g.preds(q)))
              sp.rs = q;
          }
          if (sp.ag == ir::kNoNode && sp.rs == ir::kNoNode) continue;
          if (sp.ag != ir::kNoNode) {
            for (int i = 1; i < tp; ++i) sp.in_events.push_back(next_event++);
            split_owner[sp.ag] = id;
          }
          if (sp.rs != ir::kNoNode) {
            for (int i = 0; i < rs_pieces; ++i) sp.out_events.push_back(next_event++);
            split_owner[sp.rs] = id;
          }
          splits.emplace(id, std::move(sp));
        }
      }
    }
    // Buffers are planned before any stream is emitted (an alloc and its free may sit on different streams).
    const BufferPlan buffers = plan_buffers(g, r, order.keys, next_buffer);
    for (auto& [name, nodes] : rank_streams) {
      Stream st;
      st.name = name;
      st.instrs.reserve(2 * nodes.size());
      for (NodeId id : nodes) {
        const Node& nd = g.node(id);
        const auto split_it = splits.find(id);
        const TpSplit* split = split_it == splits.end() ? nullptr : &split_it->second;
        const auto owner_it = split_owner.find(id);
        const TpSplit* coll = owner_it == split_owner.end() ? nullptr : &splits.at(owner_it->second);
        for (NodeId p : g.preds(id)) {
          const Node& pn = g.node(p);
          // Split pieces wait for their own pieces (below), not for the whole.
          if ((split != nullptr && p == split->ag) || (coll != nullptr && p == owner_it->second)) continue;
          if (pn.pp_rank == r && where[static_cast<size_t>(p)].first != where[static_cast<size_t>(id)].first) {
            st.instrs.push_back(event_op(OpKind::kWait, event_of[static_cast<size_t>(p)], "wait " + pn.name));
          }
        }
        Instruction in = node_instruction(nd);
        if (nd.kind == NodeKind::kSend || nd.kind == NodeKind::kRecv || nd.kind == NodeKind::kM2N) {
          in.peer = nd.peer_pp_rank;
          in.tag = tag_of[static_cast<size_t>(id)];
        }
        cost(g, nd, in);
        const bool scatter = options.p2p_scatter_gather && g.mesh.tp > 1 && nd.group == "pp" &&
                             (nd.kind == NodeKind::kSend || nd.kind == NodeKind::kRecv);
        const int64_t whole_bytes = in.comm_bytes;
        if (scatter) in.comm_bytes /= g.mesh.tp;
        if (auto it = buffers.alloc_before.find(id); it != buffers.alloc_before.end()) {
          st.instrs.push_back(buffer_op(OpKind::kAlloc, it->second));
        }
        if (auto it = buffers.checkpoint_before.find(id); it != buffers.checkpoint_before.end()) {
          st.instrs.push_back(buffer_op(OpKind::kAlloc, it->second));
        }
        if (auto it = buffers.recompute_before.find(id); it != buffers.recompute_before.end()) {
          const NodeId f = buffers.recompute_of.at(id);
          const Node& fn = g.node(f);
          st.instrs.push_back(buffer_op(OpKind::kAlloc, it->second));
          Instruction re = node_instruction(fn);
          re.label += " (recompute)";
          cost(g, fn, re);
          if (options.recompute_reruns_tp_collectives && fn.shard_axis == "tp") {
            for (NodeId p : g.preds(f)) {
              if (is_tp_input_collective(g.node(p))) st.instrs.push_back(rerun_collective(g, g.node(p), cost));
            }
            st.instrs.push_back(re);
            for (NodeId q : g.succs(f)) {
              if (is_tp_output_collective(g.node(q))) st.instrs.push_back(rerun_collective(g, g.node(q), cost));
            }
          } else {
            st.instrs.push_back(re);
          }
        }
        if (split != nullptr) {
          // GEMM pieces behind the all-gather's pieces, the rest, GEMM pieces ahead of the reduce-scatter's.
          if (split->ag != ir::kNoNode) {
            for (int i = 0; i < tp; ++i) {
              if (i > 0) {
                st.instrs.push_back(event_op(OpKind::kWait, split->in_events[static_cast<size_t>(i - 1)],
                                             "wait " + g.node(split->ag).name + " piece " + std::to_string(i)));
              }
              Instruction piece = piece_of(in, Segment::kIn, i, tp);
              cost(g, nd, piece);
              st.instrs.push_back(piece);
            }
          }
          Instruction rest = in;
          rest.segment = Segment::kRest;
          rest.split_in = split->ag != ir::kNoNode;
          rest.split_out = split->rs != ir::kNoNode;
          rest.label += " [rest]";
          cost(g, nd, rest);
          st.instrs.push_back(rest);
          if (split->rs != ir::kNoNode) {
            for (int i = 0; i < rs_pieces; ++i) {
              Instruction piece = piece_of(in, Segment::kOut, i, rs_pieces);
              cost(g, nd, piece);
              st.instrs.push_back(piece);
              st.instrs.push_back(
                  event_op(OpKind::kRecord, split->out_events[static_cast<size_t>(i)], "record " + piece.label));
            }
          }
        } else if (coll != nullptr) {
          // A split collective: 1/pieces of the bytes each (the last takes the remainder).
          const bool gather = id == coll->ag;
          const int count = gather ? tp - 1 : rs_pieces;
          for (int i = 0; i < count; ++i) {
            if (!gather) {
              st.instrs.push_back(
                  event_op(OpKind::kWait, coll->out_events[static_cast<size_t>(i)],
                           "wait " + g.node(owner_it->second).name + " piece " + std::to_string(i + 1)));
            }
            Instruction piece = piece_of(in, gather ? Segment::kIn : Segment::kOut, i, count);
            if (gather) {
              // One ring step: every rank passes one shard (1/tp of the gathered bytes) to its successor.
              piece.algorithm = "ring_step";
              piece.comm_bytes = in.comm_bytes / tp;
            } else {
              piece.comm_bytes = in.comm_bytes / count + (i == count - 1 ? in.comm_bytes % count : 0);
            }
            st.instrs.push_back(piece);
            if (gather) {
              st.instrs.push_back(
                  event_op(OpKind::kRecord, coll->in_events[static_cast<size_t>(i)], "record " + piece.label));
            }
          }
        } else {
          st.instrs.push_back(in);
        }
        if (scatter && nd.kind == NodeKind::kRecv) st.instrs.push_back(gather_split(nd, whole_bytes));
        if (auto it = buffers.free_after.find(id); it != buffers.free_after.end()) {
          for (const Buffer& b : it->second) {
            Instruction f = buffer_op(OpKind::kFree, b);
            f.label += b.what.rfind("params ", 0) == 0 ? " after " + nd.name + " (re-shard)"
                       : b.what == "act " + nd.name    ? " (recompute)"
                                                       : "";
            st.instrs.push_back(f);
          }
        }
        if (event_of[static_cast<size_t>(id)] >= 0) {
          st.instrs.push_back(event_op(OpKind::kRecord, event_of[static_cast<size_t>(id)], "record " + nd.name));
        }
      }
      prog.streams.push_back(std::move(st));
    }
    prog.static_bytes = model_state_bytes(g, r);
  }
  // Global ranks: tp innermost, then dp (ep inside dp, or folded over tp*dp), then pp; ranks sharing a pp
  // coordinate share a program.
  const int tp = std::max(1, g.mesh.tp), dp = std::max(1, g.mesh.dp);
  plan.world_size = pp * dp * tp;
  for (int rank = 0; rank < plan.world_size; ++rank) {
    RankCoord c;
    c.tp = rank % tp;
    c.dp = (rank / tp) % dp;
    c.ep = g.mesh.ep_coord(c.dp, c.tp);
    c.pp = rank / (tp * dp);
    plan.coords.push_back(c);
    plan.rank_template.push_back(c.pp);
  }
  annotate_dataflow(g, plan);
  return plan;
}

}  // namespace piper::compile
