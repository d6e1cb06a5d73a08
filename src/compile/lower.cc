// lower(): the driver of the lowering steps (lower_steps.h) and the instruction emission.
#include "piper/compile/lower.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

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
  return n.group == "tp" && (n.kind == NodeKind::kAllReduce || n.kind == NodeKind::kReduceScatter) &&
         !ir::is_tp_grad_sum(n);
}

// LowerOptions::tp_overlap: a tp chunk that runs as pieces, with its all-gather (ag) and reduce-scatter (rs),
// either of which may be absent, and the events between the pieces.
struct TpSplit {
  NodeId ag = ir::kNoNode, rs = ir::kNoNode;
  std::vector<int> in_events;   // all-gather piece i -> GEMM piece i + 1
  std::vector<int> out_events;  // GEMM piece i -> reduce-scatter piece i
  int64_t ring_tag = -1;        // the all-gather's ring steps: their point-to-point tag (Instruction::tag)
};

// Point-to-point tags of the communicator are in [0, kRingTags) (comm/communicator.h).
constexpr int64_t kRingTags = 32768;

bool overlapped_part(const Node& n) {
  const std::optional<Part> p = chunk_part(n.tags.part);
  const bool pass = n.tags.pass == ir::Pass::kF || n.tags.pass == ir::Pass::kB || n.tags.pass == ir::Pass::kBW;
  return n.kind == NodeKind::kChunk && n.shard_axis == "tp" && pass &&
         (p == Part::kAttention || p == Part::kDenseMlp || p == Part::kSharedExperts);
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

// Instruction::part from a node's part tag: parsed once into the enum; a tag that names no chunk (a communication's
// "dispatch", "m2n", "attn.tp_ag") is kept as comm_part.
void set_part(Instruction& in, const std::string& tag) {
  in.part = chunk_part(tag);
  if (!in.part) in.comm_part = tag;
}

// What communication node `nd` means to an executor (Instruction::role).
CommRole comm_role(const Node& nd) {
  switch (nd.kind) {
    case NodeKind::kSend:
    case NodeKind::kRecv:
      return CommRole::kPipeline;
    case NodeKind::kM2N:
      if (chunk_part(nd.m2n_dst_part) == Part::kExperts) return CommRole::kM2NToExperts;
      return chunk_part(nd.m2n_src_part) == Part::kExperts ? CommRole::kM2NFromExperts : CommRole::kM2NDense;
    case NodeKind::kAllToAll:
      if (nd.tags.part == "dispatch") return CommRole::kEpDispatch;
      return nd.tags.part == "combine" ? CommRole::kEpCombine : CommRole::kNone;
    case NodeKind::kAllGather:
    case NodeKind::kReduceScatter:
    case NodeKind::kAllReduce:
      if (ir::is_tp_grad_sum(nd)) return CommRole::kTpGradSum;
      if (nd.group == "tp") {
        return nd.kind == NodeKind::kAllGather       ? CommRole::kTpGather
               : nd.kind == NodeKind::kReduceScatter ? CommRole::kTpScatter
                                                     : CommRole::kTpReduce;
      }
      if (nd.group == "dp" || nd.group == "edp") {
        return nd.kind == NodeKind::kAllGather ? CommRole::kParamGather : CommRole::kGradReduce;
      }
      if (nd.group == "etp") {
        return nd.kind == NodeKind::kAllGather       ? CommRole::kEtpGather
               : nd.kind == NodeKind::kReduceScatter ? CommRole::kEtpScatter
                                                     : CommRole::kNone;
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
  set_part(in, nd.tags.part);
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
  set_part(in, recv.tags.part);
  in.role = CommRole::kTpGather;
  in.comm_bytes = bytes;
  return in;
}

// One lowering: the graph's stream order turned into each pipeline rank's Program (lower() below).
class Lowering {
 public:
  Lowering(ir::Graph& g, const LowerOptions& options, StreamOrder order)
      : g_(g),
        options_(options),
        order_(std::move(order)),
        event_of_(g.num_nodes(), -1),
        where_(g.num_nodes(), {-1, 0}),
        tp_(std::max(1, g.mesh.tp)) {}

  Result<Plan> run() {
    const int pp = g_.mesh.pp;
    plan_.mesh = g_.mesh;
    plan_.sequence_parallel = g_.sequence_parallel();
    plan_.templates.resize(static_cast<size_t>(pp));
    for (int r = 0; r < pp; ++r) PIPER_RETURN_IF_ERROR(lower_rank(r));
    assign_ranks();
    annotate_dataflow(g_, plan_, options_.data_edges);
    return std::move(plan_);
  }

 private:
  using RankStreams = std::map<std::string, std::vector<NodeId>>;  // StreamOrder::streams of one rank

  void cost(const Node& nd, Instruction& in) const {
    if (options_.cost) {
      options_.cost(in);
    } else {
      default_cost(g_, nd, in);
    }
  }

  Status lower_rank(int r) {
    Program& prog = plan_.templates[static_cast<size_t>(r)];
    prog.pp_rank = r;
    RankStreams& rank_streams = order_.streams[static_cast<size_t>(r)];
    int si = 0;
    for (auto& [name, nodes] : rank_streams) {
      for (size_t k = 0; k < nodes.size(); ++k) where_[static_cast<size_t>(nodes[k])] = {si, k};
      ++si;
    }
    PIPER_RETURN_IF_ERROR(mark_events(r, rank_streams));
    find_tp_splits(r, rank_streams);
    // Buffers are planned before any stream is emitted (an alloc and its free may sit on different streams).
    buffers_ = plan_buffers(g_, r, order_.keys, next_buffer_);
    for (auto& [name, nodes] : rank_streams) {
      Stream st;
      st.name = name;
      st.instrs.reserve(2 * nodes.size());
      for (NodeId id : nodes) emit_node(r, id, st);
      prog.streams.push_back(std::move(st));
    }
    prog.static_bytes = model_state_bytes(g_, r);
    return ok_status();
  }

  // Which nodes need an event (a consumer on another stream of this rank); an error when a stream's order
  // contradicts the DAG.
  Status mark_events(int r, const RankStreams& rank_streams) {
    for (const auto& [name, nodes] : rank_streams) {
      for (NodeId id : nodes) {
        for (NodeId s : g_.succs(id)) {
          const Node& sn = g_.node(s);
          if (sn.pp_rank != r || skipped(sn)) continue;
          auto [ws, wp] = where_[static_cast<size_t>(s)];
          auto [ms, mp] = where_[static_cast<size_t>(id)];
          if (ws != ms) {
            if (event_of_[static_cast<size_t>(id)] < 0) event_of_[static_cast<size_t>(id)] = next_event_++;
          } else if (wp < mp) {
            return invalid_argument("rank " + std::to_string(r) + " stream '" + sn.stream + "': instruction " +
                                    std::to_string(wp) + " (" + sn.name + ") runs before instruction " +
                                    std::to_string(mp) + " (" + g_.node(id).name +
                                    ") that it depends on; the stream order contradicts the DAG");
          }
        }
      }
    }
    return ok_status();
  }

  // tp_overlap: the chunks that run as pieces. Their collective must sit on another stream and serve only them.
  void find_tp_splits(int r, const RankStreams& rank_streams) {
    splits_.clear();
    split_owner_.clear();
    if (!options_.tp_overlap || tp_ <= 1) return;
    auto other_stream_only = [&](NodeId c, NodeId x, const std::vector<NodeId>& ends) {
      if (g_.node(c).pp_rank != r || where_[static_cast<size_t>(c)].first == where_[static_cast<size_t>(x)].first)
        return false;
      return std::all_of(ends.begin(), ends.end(), [&](NodeId e) { return e == x; });
    };
    for (const auto& [name, nodes] : rank_streams) {
      for (NodeId id : nodes) {
        if (!overlapped_part(g_.node(id))) continue;
        TpSplit sp;
        for (NodeId p : g_.preds(id)) {
          if (is_tp_input_collective(g_.node(p)) && other_stream_only(p, id, g_.succs(p))) sp.ag = p;
        }
        for (NodeId q : g_.succs(id)) {
          const Node& qn = g_.node(q);
          if (qn.group == "tp" && qn.kind == NodeKind::kReduceScatter && other_stream_only(q, id, g_.preds(q)))
            sp.rs = q;
        }
        if (sp.ag == ir::kNoNode && sp.rs == ir::kNoNode) continue;
        if (sp.ag != ir::kNoNode) {
          for (int i = 1; i < tp_; ++i) sp.in_events.push_back(next_event_++);
          // The tp ranks of one pipeline rank run this template, so they number their rings alike; a tag that
          // wraps is shared by rings far apart in the stream, which the channel matches in posting order.
          sp.ring_tag = next_ring_tag_++ % kRingTags;
          split_owner_[sp.ag] = id;
        }
        if (sp.rs != ir::kNoNode) {
          for (int i = 0; i < kTpOverlapRsPieces; ++i) sp.out_events.push_back(next_event_++);
          split_owner_[sp.rs] = id;
        }
        splits_.emplace(id, std::move(sp));
      }
    }
  }

  // Node `id`'s instructions on its stream: waits, allocations, a recomputation, the node itself (whole or in
  // pieces), frees and its record.
  void emit_node(int r, NodeId id, Stream& st) {
    const Node& nd = g_.node(id);
    const auto split_it = splits_.find(id);
    const TpSplit* split = split_it == splits_.end() ? nullptr : &split_it->second;
    const auto owner_it = split_owner_.find(id);
    const NodeId owner = owner_it == split_owner_.end() ? ir::kNoNode : owner_it->second;
    const TpSplit* coll = owner == ir::kNoNode ? nullptr : &splits_.at(owner);
    emit_waits(r, id, split, owner, st);
    Instruction in = node_instruction(nd);
    if (nd.kind == NodeKind::kSend || nd.kind == NodeKind::kRecv || nd.kind == NodeKind::kM2N) {
      in.peer = nd.peer_pp_rank;
      in.tag = order_.tag[static_cast<size_t>(id)];
    }
    cost(nd, in);
    const bool scatter = options_.p2p_scatter_gather && g_.mesh.tp > 1 && !g_.sequence_parallel() && nd.group == "pp" &&
                         (nd.kind == NodeKind::kSend || nd.kind == NodeKind::kRecv);
    const int64_t whole_bytes = in.comm_bytes;
    if (scatter) in.comm_bytes /= g_.mesh.tp;
    emit_allocs(id, st);
    // The working set first (the simulator's measured expert loads find an experts backward's buffers from it).
    for (const auto* before : {&buffers_.scratch_before, &buffers_.weight_grad_before, &buffers_.grads_before}) {
      if (auto it = before->find(id); it != before->end()) st.instrs.push_back(buffer_op(OpKind::kAlloc, it->second));
    }
    if (split != nullptr) {
      emit_split_chunk(nd, in, *split, st);
    } else if (coll != nullptr) {
      emit_split_collective(id, in, *coll, owner, st);
    } else {
      st.instrs.push_back(in);
    }
    if (scatter && nd.kind == NodeKind::kRecv) st.instrs.push_back(gather_split(nd, whole_bytes));
    emit_frees(id, nd, st);
    if (event_of_[static_cast<size_t>(id)] >= 0) {
      st.instrs.push_back(event_op(OpKind::kRecord, event_of_[static_cast<size_t>(id)], "record " + nd.name));
    }
  }

  // A wait for every producer of `id` on another stream of this rank; split pieces wait for their own pieces
  // (emit_split_*), not for the whole.
  void emit_waits(int r, NodeId id, const TpSplit* split, NodeId owner, Stream& st) const {
    for (NodeId p : g_.preds(id)) {
      const Node& pn = g_.node(p);
      if ((split != nullptr && p == split->ag) || (owner != ir::kNoNode && p == owner)) continue;
      if (pn.pp_rank == r && where_[static_cast<size_t>(p)].first != where_[static_cast<size_t>(id)].first) {
        st.instrs.push_back(event_op(OpKind::kWait, event_of_[static_cast<size_t>(p)], "wait " + pn.name));
      }
    }
  }

  // The buffers allocated before `id`, and the recomputation of its forward when it has one.
  void emit_allocs(NodeId id, Stream& st) const {
    if (auto it = buffers_.alloc_before.find(id); it != buffers_.alloc_before.end()) {
      st.instrs.push_back(buffer_op(OpKind::kAlloc, it->second));
    }
    if (auto it = buffers_.checkpoint_before.find(id); it != buffers_.checkpoint_before.end()) {
      st.instrs.push_back(buffer_op(OpKind::kAlloc, it->second));
    }
    auto it = buffers_.recompute_before.find(id);
    if (it == buffers_.recompute_before.end()) return;
    const NodeId f = buffers_.recompute_of.at(id);
    const Node& fn = g_.node(f);
    st.instrs.push_back(buffer_op(OpKind::kAlloc, it->second));
    Instruction re = node_instruction(fn);
    re.label += " (recompute)";
    cost(fn, re);
    auto cost_fn = [this](const ir::Graph&, const Node& nd, Instruction& in) { cost(nd, in); };
    if (!options_.recompute_reruns_tp_collectives || fn.shard_axis != "tp") {
      st.instrs.push_back(re);
      return;
    }
    for (NodeId p : g_.preds(f)) {
      if (is_tp_input_collective(g_.node(p))) st.instrs.push_back(rerun_collective(g_, g_.node(p), cost_fn));
    }
    st.instrs.push_back(re);
    for (NodeId q : g_.succs(f)) {
      if (is_tp_output_collective(g_.node(q))) st.instrs.push_back(rerun_collective(g_, g_.node(q), cost_fn));
    }
  }

  // A split chunk: GEMM pieces behind the all-gather's pieces, the rest, GEMM pieces ahead of the reduce-scatter's.
  void emit_split_chunk(const Node& nd, const Instruction& in, const TpSplit& split, Stream& st) const {
    if (split.ag != ir::kNoNode) {
      for (int i = 0; i < tp_; ++i) {
        if (i > 0) {
          st.instrs.push_back(event_op(OpKind::kWait, split.in_events[static_cast<size_t>(i - 1)],
                                       "wait " + g_.node(split.ag).name + " piece " + std::to_string(i)));
        }
        Instruction piece = piece_of(in, Segment::kIn, i, tp_);
        cost(nd, piece);
        st.instrs.push_back(piece);
      }
    }
    Instruction rest = in;
    rest.segment = Segment::kRest;
    rest.split_in = split.ag != ir::kNoNode;
    rest.split_out = split.rs != ir::kNoNode;
    rest.label += " [rest]";
    cost(nd, rest);
    st.instrs.push_back(rest);
    if (split.rs == ir::kNoNode) return;
    for (int i = 0; i < kTpOverlapRsPieces; ++i) {
      Instruction piece = piece_of(in, Segment::kOut, i, kTpOverlapRsPieces);
      cost(nd, piece);
      st.instrs.push_back(piece);
      st.instrs.push_back(
          event_op(OpKind::kRecord, split.out_events[static_cast<size_t>(i)], "record " + piece.label));
    }
  }

  // A split collective: 1/pieces of the bytes each (the last takes the remainder).
  void emit_split_collective(NodeId id, const Instruction& in, const TpSplit& coll, NodeId owner,
                             Stream& st) const {
    const bool gather = id == coll.ag;
    const int count = gather ? tp_ - 1 : kTpOverlapRsPieces;
    for (int i = 0; i < count; ++i) {
      if (!gather) {
        st.instrs.push_back(event_op(OpKind::kWait, coll.out_events[static_cast<size_t>(i)],
                                     "wait " + g_.node(owner).name + " piece " + std::to_string(i + 1)));
      }
      Instruction piece = piece_of(in, gather ? Segment::kIn : Segment::kOut, i, count);
      if (gather) {
        // One ring step: every rank passes one shard (1/tp of the gathered bytes) to its successor.
        piece.algorithm = "ring_step";
        piece.comm_bytes = in.comm_bytes / tp_;
        piece.tag = coll.ring_tag;
      } else {
        piece.comm_bytes = in.comm_bytes / count + (i == count - 1 ? in.comm_bytes % count : 0);
      }
      st.instrs.push_back(piece);
      if (gather) {
        st.instrs.push_back(
            event_op(OpKind::kRecord, coll.in_events[static_cast<size_t>(i)], "record " + piece.label));
      }
    }
  }

  void emit_frees(NodeId id, const Node& nd, Stream& st) const {
    auto it = buffers_.free_after.find(id);
    if (it == buffers_.free_after.end()) return;
    for (const Buffer& b : it->second) {
      Instruction f = buffer_op(OpKind::kFree, b);
      f.label += b.what.rfind("params ", 0) == 0 ? " after " + nd.name + " (re-shard)"
                 : b.what == "act " + nd.name    ? " (recompute)"
                                                 : "";
      st.instrs.push_back(f);
    }
  }

  // Global ranks: tp innermost, then dp (ep inside dp, or folded over tp*dp), then pp; ranks sharing a pp
  // coordinate share a program.
  void assign_ranks() {
    const int pp = g_.mesh.pp, dp = std::max(1, g_.mesh.dp);
    plan_.world_size = pp * dp * tp_;
    for (int rank = 0; rank < plan_.world_size; ++rank) {
      RankCoord c;
      c.tp = rank % tp_;
      c.dp = (rank / tp_) % dp;
      c.ep = g_.mesh.ep_coord(c.dp, c.tp);
      c.pp = rank / (tp_ * dp);
      plan_.coords.push_back(c);
      plan_.rank_template.push_back(c.pp);
    }
  }

  ir::Graph& g_;
  const LowerOptions& options_;
  StreamOrder order_;
  Plan plan_;
  std::vector<int> event_of_;
  std::vector<std::pair<int, size_t>> where_;  // (stream index, position) per node
  int next_event_ = 0, next_buffer_ = 0;
  int64_t next_ring_tag_ = 0;  // TpSplit::ring_tag
  const int tp_;
  // Per rank (lower_rank):
  std::unordered_map<NodeId, TpSplit> splits_;
  std::unordered_map<NodeId, NodeId> split_owner_;  // a split all-gather / reduce-scatter -> its chunk
  BufferPlan buffers_;
};

}  // namespace

Result<Plan> lower(ir::Graph& g, const LowerOptions& options) {
  PIPER_RETURN_IF_ERROR(insert_p2p(g).status());
  PIPER_ASSIGN_OR_RETURN(StreamOrder order, order_streams(g, options.interleave_overlap));
  if (options.p2p_blocking || options.dp_reduce_after_backward) {
    add_legacy_pipeline_edges(g, order, options.p2p_blocking, options.dp_reduce_after_backward);
  }
  return Lowering(g, options, std::move(order)).run();
}

}  // namespace piper::compile
