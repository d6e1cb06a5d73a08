// lower(): the driver of the lowering steps (lower_steps.h) and the instruction emission.
#include "piper/compile/lower.h"

#include <algorithm>
#include <string>

#include "piper/compile/lower_steps.h"

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

// A tp chunk's own collectives: the all-gather of its input (sequence parallelism) before it, the all-reduce or
// reduce-scatter of its output after it. (A pred all-reduce is the previous chunk's output, not this one's.)
bool is_tp_input_collective(const Node& n) { return n.group == "tp" && n.kind == NodeKind::kAllGather; }
bool is_tp_output_collective(const Node& n) {
  return n.group == "tp" && (n.kind == NodeKind::kAllReduce || n.kind == NodeKind::kReduceScatter);
}

// The instruction that runs node `nd` (send/recv peers and tags, and the cost, are the caller's).
Instruction node_instruction(const Node& nd) {
  Instruction in;
  in.node = nd.id;
  in.label = nd.name;
  in.pass = nd.tags.pass;
  in.mb = nd.tags.mb;
  in.group = nd.group;
  in.algorithm = nd.algorithm;
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

}  // namespace

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::kCompute:
      return "compute";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kCollective:
      return "collective";
    case OpKind::kRecord:
      return "record";
    case OpKind::kWait:
      return "wait";
    case OpKind::kAlloc:
      return "alloc";
    case OpKind::kFree:
      return "free";
    case OpKind::kUpdate:
      return "update";
  }
  return "?";
}

Result<Plan> lower(ir::Graph& g, const LowerOptions& options) {
  PIPER_RETURN_IF_ERROR(insert_p2p(g).status());
  PIPER_ASSIGN_OR_RETURN(StreamOrder order, order_streams(g, options.interleave_overlap));
  const size_t n = g.num_nodes();
  const int pp = g.mesh.pp;
  const std::vector<int64_t>& tag_of = order.tag;
  Plan plan;
  plan.mesh = g.mesh;
  plan.templates.resize(static_cast<size_t>(pp));
  CostFn cost = options.cost ? options.cost : CostFn(default_cost);
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
    // Buffers are planned before any stream is emitted (an alloc and its free may sit on different streams).
    const BufferPlan buffers = plan_buffers(g, r, order.keys, next_buffer);
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
        Instruction in = node_instruction(nd);
        if (nd.kind == NodeKind::kSend || nd.kind == NodeKind::kRecv || nd.kind == NodeKind::kM2N) {
          in.peer = nd.peer_pp_rank;
          in.tag = tag_of[static_cast<size_t>(id)];
        }
        cost(g, nd, in);
        if (auto it = buffers.alloc_before.find(id); it != buffers.alloc_before.end()) {
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
        st.instrs.push_back(in);
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
          Instruction rec;
          rec.op = OpKind::kRecord;
          rec.event = event_of[static_cast<size_t>(id)];
          rec.label = "record " + nd.name;
          st.instrs.push_back(rec);
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
  return plan;
}

}  // namespace piper::compile
