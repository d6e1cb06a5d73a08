// shard: expert parallelism (axis ep) or Megatron tensor parallelism (axis tp) for the matched chunks.
//
// ep: every chunk-to-chunk data edge entering the matched set gets an all_to_all (forward: dispatch;
//     backward: the combine's gradient), every edge leaving it another (forward: combine; backward: the
//     dispatch's gradient). Payload = edge bytes x top_k. Parameters are sharded over ep. With etp > 1 the
//     experts' rows are gathered over the etp group inside the all-to-alls and reduce-scattered after them; with
//     ep = 1 and etp > 1 (Megatron's expert_model_parallel_size 1) the etp exchanges stand alone.
// tp: each matched chunk gets an all_reduce on its outputs (column->row parallel pair), or with sequence
//     parallelism an all_gather on its inputs and a reduce_scatter on its outputs; F and B/BW alike.
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <unordered_set>

#include "piper/ir/passes/passes.h"
#include "piper/spec/part.h"

namespace piper::ir {
namespace {

Node comm_like(const Node& chunk, NodeKind kind, const std::string& part, const std::string& group,
               const std::string& algorithm, const std::string& stream, int64_t bytes) {
  Node n;
  n.kind = kind;
  n.tags = chunk.tags;
  n.tags.part = part;
  // The microbatch is part of the name (as for chunks after split): cross-rank send/recv pairs are matched by
  // name, and two microbatches' collectives must not share one.
  n.name = "L" + std::to_string(chunk.tags.layer) + "." + part + "." + to_string(chunk.tags.pass) +
           (chunk.tags.mb >= 0 ? ".mb" + std::to_string(chunk.tags.mb) : "");
  n.pp_rank = chunk.pp_rank;
  n.stream = stream;
  n.group = group;
  n.algorithm = algorithm;
  n.comm_bytes = bytes;
  return n;
}

// Alive data edges between two chunks, entering (into=true) or leaving the node. With `via_group`, edges whose
// other end is a collective of that group count too: a TP chunk next to an already sharded one sees that
// chunk's reduce-scatter, and sequence parallelism needs its own all-gather after it.
std::vector<int> chunk_edges(const Graph& g, NodeId id, bool into, const std::string& via_group = "") {
  std::vector<int> out;
  for (int e : into ? g.in_edges(id) : g.out_edges(id)) {
    const Edge& ed = g.edge(e);
    if (!ed.alive || ed.kind != EdgeKind::kData) continue;
    const Node& other = g.node(into ? ed.src : ed.dst);
    if (other.kind == NodeKind::kChunk || (!via_group.empty() && other.group == via_group)) out.push_back(e);
  }
  return out;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Expert tensor parallelism (MeshInfo::etp > 1): on edge `e` entering (into) or leaving the experts chunk `id`, the
// all-gather of the rows over the etp group next to the chunk (into: its input rows, F or B) or the reduce-scatter
// of its partial outputs (leaving). `rows_bytes` is this rank's rows before the gather / after the scatter.
// Returns the edge on which the expert all-to-all goes (the outer side), `e` itself without etp.
int etp_exchange(Graph& g, int e, NodeId id, bool into, int64_t rows_bytes, const std::string& stream) {
  const int etp = std::max(1, g.mesh.etp);
  if (etp == 1) return e;
  const Node& chunk = g.node(id);
  const NodeKind kind = into ? NodeKind::kAllGather : NodeKind::kReduceScatter;
  // A collective's comm_bytes is its buffer: the gathered rows (all-gather) or the partial rows (reduce-scatter).
  const NodeId c = g.insert_on_edge(e, comm_like(chunk, kind, chunk.tags.part + (into ? ".etp_ag" : ".etp_rs"), "etp",
                                                 "ring", stream, rows_bytes * etp));
  for (int x : into ? g.in_edges(c) : g.out_edges(c)) {
    if (g.edge(x).alive) return x;
  }
  return e;  // unreachable: insert_on_edge links both sides
}

// A chunk that sees 1/tp of a microbatch's tokens: every per-token byte count it carries, divided by tp.
void split_token_bytes(Node& n, int64_t tp) {
  n.activation_bytes = ceil_div(n.activation_bytes, tp);
  n.activation_whole_bytes = ceil_div(n.activation_whole_bytes, tp);
  n.checkpoint_bytes = ceil_div(n.checkpoint_bytes, tp);
  n.backward_scratch_bytes = ceil_div(n.backward_scratch_bytes, tp);
  n.weight_grad_bytes = ceil_div(n.weight_grad_bytes, tp);
}

Status shard_ep(Graph& g, const ShardDirective& d, const std::vector<NodeId>& chunks) {
  if (g.mesh.ep <= 1 && g.mesh.etp <= 1) {
    return invalid_argument("axis ep needs ep > 1 or etp > 1 in the mesh (ep=" + std::to_string(g.mesh.ep) +
                            ", etp=" + std::to_string(g.mesh.etp) + ")");
  }
  const bool all_to_all = g.mesh.ep > 1;  // ep = 1: the etp exchanges alone
  std::unordered_set<NodeId> set(chunks.begin(), chunks.end());
  const std::string stream = d.stream.empty() ? "ep" : d.stream;
  // Under tensor parallelism the MoE layer's tokens are split over the tp ranks (sequence parallelism, as in
  // Megatron-LM and the closed form): each rank routes, dispatches and keeps the activations of T / tp tokens.
  const int64_t tp = std::max(1, g.mesh.tp);
  // The neighbouring chunks may already be tensor parallel (shard tp runs first): their all-gather /
  // reduce-scatter / all-reduce then sits on the edge, and the exchange goes between it and the experts.
  // Before, only chunk-to-chunk edges counted, so under tp every combine (forward) and its gradient (backward)
  // was missing from the plan: half the EP traffic of the closed form.
  auto own_collective = [&](NodeId chunk, NodeId other) {
    const Node& c = g.node(chunk);
    const Node& o = g.node(other);
    return o.kind != NodeKind::kChunk && o.tags.layer == c.tags.layer && o.tags.part.rfind(c.tags.part + ".", 0) == 0;
  };
  // The router before the experts keeps its T / tp tokens' activations too (the closed form's MoE terms are all
  // divided by tp); it is divided once, when its experts chunk is sharded.
  std::unordered_set<NodeId> routers;
  for (NodeId id : chunks) {
    g.node(id).shard_axis = "ep";
    split_token_bytes(g.node(id), tp);
    for (NodeId p : g.preds(id)) {
      Node& r = g.node(p);
      if (r.kind == NodeKind::kChunk && chunk_part(r.tags.part) == Part::kRouter &&
          r.tags.layer == g.node(id).tags.layer && routers.insert(p).second)
        split_token_bytes(r, tp);
    }
    const bool fwd = g.node(id).tags.pass == Pass::kF;
    for (int e : chunk_edges(g, id, true, "tp")) {
      if (set.count(g.edge(e).src) || own_collective(id, g.edge(e).src)) continue;
      const int64_t rows_bytes = ceil_div(g.edge(e).bytes * g.moe_top_k, tp);
      // The forward dispatch may travel in a narrower format (fp8) than the edge's activations.
      const int64_t bytes =
          fwd ? static_cast<int64_t>(std::ceil(static_cast<double>(rows_bytes) * g.moe_dispatch_ratio)) : rows_bytes;
      const int outer = etp_exchange(g, e, id, true, rows_bytes, stream);
      // Under etp the F keeps the rows of its whole etp group (its input and its partial outputs, each of width
      // h): etp times the closed form's per-token rows (spec/activation_counting.h), the intermediates unchanged.
      if (fwd && g.mesh.etp > 1 && g.node(id).activation_bytes > 0) {
        g.node(id).activation_bytes += 2 * (g.mesh.etp - 1) * rows_bytes;
      }
      if (!all_to_all) continue;
      g.insert_on_edge(outer, comm_like(g.node(id), NodeKind::kAllToAll, fwd ? "dispatch" : "combine", "ep",
                                        d.algorithm, stream, bytes));
    }
    for (int e : chunk_edges(g, id, false, "tp")) {
      if (set.count(g.edge(e).dst) || own_collective(id, g.edge(e).dst)) continue;
      const int64_t bytes = ceil_div(g.edge(e).bytes * g.moe_top_k, tp);
      const int outer = etp_exchange(g, e, id, false, bytes, stream);
      if (!all_to_all) continue;
      g.insert_on_edge(outer, comm_like(g.node(id), NodeKind::kAllToAll, fwd ? "combine" : "dispatch", "ep",
                                        d.algorithm, stream, bytes));
    }
  }
  return ok_status();
}

Status shard_tp(Graph& g, const ShardDirective& d, const std::vector<NodeId>& chunks) {
  if (g.mesh.tp <= 1)
    return invalid_argument("axis tp needs tp > 1 in the mesh (tp=" + std::to_string(g.mesh.tp) + ")");
  if (g.tp_sequence_parallel && *g.tp_sequence_parallel != d.sequence_parallel) {
    return invalid_argument(std::string("this tp shard has sequence_parallel ") +
                            (d.sequence_parallel ? "true" : "false") + " but an earlier one has " +
                            (d.sequence_parallel ? "false" : "true") +
                            "; the hidden states between chunks are either token slices or whole, so give every "
                            "tp shard directive the same sequence_parallel");
  }
  g.tp_sequence_parallel = d.sequence_parallel;
  const std::string stream = d.stream.empty() ? "tp" : d.stream;
  const int64_t tp = g.mesh.tp;
  for (NodeId id : chunks) {
    g.node(id).shard_axis = "tp";
    const std::string part = g.node(id).tags.part;
    // The activations the F keeps for its backward: split over tp, except, without sequence parallelism, the
    // replicated part (the norm's and the projection's input); a recomputed F's checkpoint is its input.
    if (Node& nd = g.node(id); nd.activation_bytes > 0) {
      const int64_t whole = d.sequence_parallel ? 0 : std::min(nd.activation_whole_bytes, nd.activation_bytes);
      nd.activation_bytes = whole + ceil_div(nd.activation_bytes - whole, tp);
      nd.activation_whole_bytes = whole;
      if (d.sequence_parallel) nd.checkpoint_bytes = ceil_div(nd.checkpoint_bytes, tp);
    }
    // The backward's working set: its sharded widths split over tp (the hidden-width gradients too: whole
    // without sequence parallelism in the runtime, a small part of the set).
    if (Node& nd = g.node(id); nd.backward_scratch_bytes > 0) {
      nd.backward_scratch_bytes = ceil_div(nd.backward_scratch_bytes, tp);
      nd.weight_grad_bytes = ceil_div(nd.weight_grad_bytes, tp);
    }
    auto reroute = [&](bool into, NodeKind kind, const std::string& what) {
      std::vector<int> edges = chunk_edges(g, id, into, "tp");
      // The activations an F keeps for its own backward (F -> B/BW/W of the same layer and part) stay local:
      // only the hidden states exchanged with neighbouring chunks go through the TP collective.
      std::erase_if(edges, [&](int e) {
        const Node& other = g.node(into ? g.edge(e).src : g.edge(e).dst);
        return other.tags.layer == g.node(id).tags.layer && other.tags.part == part;
      });
      if (edges.empty()) return;
      int64_t bytes = g.edge(edges[0]).bytes;
      NodeId c = g.add_node(comm_like(g.node(id), kind, part + "." + what, "tp", "ring", stream, bytes));
      for (int e : edges) {
        Edge ed = g.edge(e);
        g.remove_edge(e);
        if (into) {
          g.add_edge(ed.src, c, ed.kind, ed.bytes);
        } else {
          g.add_edge(c, ed.dst, ed.kind, ed.bytes);
        }
      }
      if (into) {
        g.add_edge(c, id, EdgeKind::kData, bytes);
      } else {
        g.add_edge(id, c, EdgeKind::kData, bytes);
      }
    };
    if (d.sequence_parallel) {
      reroute(true, NodeKind::kAllGather, "tp_ag");
      reroute(false, NodeKind::kReduceScatter, "tp_rs");
    } else {
      reroute(false, NodeKind::kAllReduce, "tp_ar");
    }
  }
  return ok_status();
}

}  // namespace

Status apply_shard(Graph& g, const ShardDirective& d) {
  std::vector<NodeId> chunks;
  for (NodeId id : g.select(d.filter)) {
    const Node& n = g.node(id);
    if (n.kind != NodeKind::kChunk) continue;
    if (!n.shard_axis.empty()) {
      return invalid_argument(describe(n) + " is already sharded over " + n.shard_axis + "; give one shard per chunk");
    }
    if (n.tags.pass == Pass::kW) continue;  // weight gradients need no activation exchange
    chunks.push_back(id);
  }
  if (chunks.empty()) return invalid_argument("filter " + d.filter.to_string() + " matches no chunk");
  if (d.axis == "ep") {
    for (NodeId id : chunks) {
      if (chunk_part(g.node(id).tags.part) != Part::kExperts) {
        return invalid_argument("axis ep shards expert chunks only, but the filter matches " + describe(g.node(id)) +
                                "; add \"part\": \"experts\" to the filter");
      }
    }
    return shard_ep(g, d, chunks);
  }
  return shard_tp(g, d, chunks);
}

void split_unsharded_moe_tokens(Graph& g) {
  const int64_t tp = g.mesh.tp;
  if (tp <= 1 || !g.sequence_parallel()) return;
  std::set<int> ep_layers;  // layers whose experts shard ep already split their router's and their own tokens
  for (const Node& n : g.nodes()) {
    if (n.kind == NodeKind::kChunk && chunk_part(n.tags.part) == Part::kExperts && n.shard_axis == "ep")
      ep_layers.insert(n.tags.layer);
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    Node& n = g.node(static_cast<NodeId>(i));
    if (n.kind != NodeKind::kChunk || ep_layers.count(n.tags.layer) > 0) continue;
    const std::optional<Part> part = chunk_part(n.tags.part);
    if (part == Part::kRouter || part == Part::kExperts) split_token_bytes(n, tp);
  }
}

}  // namespace piper::ir
