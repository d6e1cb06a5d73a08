// disaggregate: attention/FFN disaggregation (DisagMoE). With a = attn_groups, f = ffn_groups, pp = a + f:
//   attention-side chunks (embed, attn, router) of layer l -> stage 2l on pipeline rank (l mod a)
//   FFN-side chunks (experts, shared, mlp, head) of layer l   -> stage 2l+1 on rank a + (l mod f)
// (the placement the af-pipe schedule emits). a != f is an uneven attention:FFN split (a*w : f*w ranks with w
// ranks per pipeline rank). Dispatch/combine all-to-alls are dissolved and every data edge
// between the two sides becomes one unidirectional m2n exchange: an m2n node on the sending rank and one on
// the receiving rank, deliberately not linked (like send/recv). As for pipeline send/recv, every channel (ordered
// rank pair) gets its own streams: m2n_to_<peer> on the sender and m2n_from_<peer> on the receiver, so compute
// never blocks on communication (DisagMoE runs compute, send and receive on separate streams) and an attention
// worker that receives activations from one FFN worker and gradients from another waits on neither's order.
// The lowering posts each channel's receives in its send order.
// With tensor parallelism a chunk's tp collectives (shard pass: <part>.tp_ag / tp_rs / tp_ar) go with their chunk:
// the dense MLP's and the head's gather and scatter run in the FFN ranks' tp groups, and an edge that crosses the
// sides from or to such a collective is an m2n pair like a chunk-to-chunk one.
#include <algorithm>
#include <optional>
#include <string>

#include "piper/ir/passes/passes.h"
#include "piper/spec/part.h"

namespace piper::ir {
namespace {

bool ffn_side(const std::string& part) {
  const std::optional<Part> p = chunk_part(part);
  return p == Part::kExperts || p == Part::kSharedExperts || p == Part::kDenseMlp || p == Part::kHead;
}

// The chunk part a node belongs to: a chunk's own, or for a tensor-parallel collective of a chunk ("mlp.tp_ag",
// "attn.tp_rs", "head.tp_ar": the shard pass names them <part>.<what>, group tp) its chunk's, so that it sits on
// its chunk's side and the edges it links across the sides are exchanged like the chunk's own. nullopt otherwise.
std::optional<std::string> owner_part(const Node& n) {
  if (n.kind == NodeKind::kChunk) return n.tags.part;
  if (n.group != "tp") return std::nullopt;
  const size_t dot = n.tags.part.find('.');
  if (dot == std::string::npos || !chunk_part(n.tags.part.substr(0, dot))) return std::nullopt;
  return n.tags.part.substr(0, dot);
}

}  // namespace

Status apply_disaggregate(Graph& g, const DisaggregateDirective& d) {
  const int na = d.attn_groups, nf = d.ffn_groups;
  if (na < 1 || nf < 1) {
    return invalid_argument("disaggregate needs attn_groups >= 1 and ffn_groups >= 1 (got " + std::to_string(na) +
                            ", " + std::to_string(nf) + ")");
  }
  if (g.mesh.pp != na + nf) {
    return invalid_argument("disaggregate needs pp = attn_groups + ffn_groups = " + std::to_string(na + nf) +
                            " (got pp=" + std::to_string(g.mesh.pp) + ")");
  }
  if (g.mesh.num_stages() != 2 * g.num_layers || (na == nf && g.num_layers % na != 0)) {
    return invalid_argument(
        "disaggregate cuts " + std::to_string(g.num_layers) + " layers into " + std::to_string(2 * g.num_layers) +
        " stages (attention and FFN of each layer) dealt round-robin to the groups: the mesh needs pp*vpp = " +
        std::to_string(2 * g.num_layers) + " (got pp=" + std::to_string(g.mesh.pp) + ", vpp=" +
        std::to_string(g.mesh.vpp) + (na == nf ? ", and equal groups must divide num_layers)" : "; or stages=)"));
  }
  if (g.num_layers < std::max(na, nf)) {
    return invalid_argument("disaggregate: " + std::to_string(g.num_layers) + " layers cannot give each of " +
                            std::to_string(na) + " attention and " + std::to_string(nf) + " FFN groups a layer");
  }
  for (const Node& n : g.nodes()) {
    if (n.order_slot >= 0) return invalid_argument("disaggregate must come before order rows");
  }
  // Dissolve dispatch/combine all-to-alls: connect their producers straight to their consumers.
  for (size_t i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.node(static_cast<NodeId>(i));
    if (n.kind != NodeKind::kAllToAll || (n.tags.part != "dispatch" && n.tags.part != "combine")) continue;
    std::vector<int> ins, outs;
    for (int e : g.in_edges(n.id)) {
      if (g.edge(e).alive) ins.push_back(e);
    }
    for (int e : g.out_edges(n.id)) {
      if (g.edge(e).alive) outs.push_back(e);
    }
    for (int a : ins) {
      for (int b : outs) g.add_edge(g.edge(a).src, g.edge(b).dst, g.edge(b).kind, g.edge(b).bytes);
    }
    for (int e : ins) g.remove_edge(e);
    for (int e : outs) g.remove_edge(e);
    g.node(static_cast<NodeId>(i)).tags.part = "dissolved";
    g.node(static_cast<NodeId>(i)).pp_rank = -1;
  }
  // Place every node with a layer by its side (a chunk's tp collectives by their chunk's).
  for (size_t i = 0; i < g.num_nodes(); ++i) {
    Node& n = g.node(static_cast<NodeId>(i));
    if (n.tags.layer < 0 || n.tags.part == "dissolved") continue;
    const bool ffn = ffn_side(owner_part(n).value_or(n.tags.part));
    n.tags.stage = 2 * n.tags.layer + (ffn ? 1 : 0);
    n.pp_rank = ffn ? na + n.tags.layer % nf : n.tags.layer % na;
  }
  // Side-crossing data edges become m2n pairs: between two chunks, or with tensor parallelism between a chunk or
  // its tp collective and the other side's (experts -> the next attention's all-gather, the attention's reduce-
  // scatter -> the dense MLP's all-gather, ...). The pair names the two chunks' parts; under sequence parallelism
  // each rank exchanges its token slice with the other side's ranks of its tp coordinate (Plan::m2n_peers).
  const int64_t slices = g.sequence_parallel() ? g.mesh.tp : 1;
  const size_t num_edges = g.edges().size();
  int exchanges = 0;
  for (size_t e = 0; e < num_edges; ++e) {
    const Edge ed = g.edge(static_cast<int>(e));
    if (!ed.alive || ed.kind != EdgeKind::kData) continue;
    const Node& a = g.node(ed.src);
    const Node& b = g.node(ed.dst);
    const std::optional<std::string> a_part = owner_part(a), b_part = owner_part(b);
    if (!a_part || !b_part || a.pp_rank == b.pp_rank) continue;
    if (ffn_side(*a_part) == ffn_side(*b_part)) continue;
    g.remove_edge(static_cast<int>(e));
    std::string name = a.name + "->" + b.name + ".m2n";
    Node s;
    s.kind = NodeKind::kM2N;
    s.tags = a.tags;
    s.tags.part = "m2n";
    s.name = name + ".send";
    s.pp_rank = a.pp_rank;
    s.peer_pp_rank = b.pp_rank;
    s.stream = "m2n_to_" + std::to_string(b.pp_rank);
    s.group = "a2f";
    s.algorithm = "direct";
    // Routed exchanges carry a row per (token, slot): the dispatch and its gradient always, the combine and its
    // gradient when the router's rank combines (compile/exec_info.cc divides them by top_k where the FFN group
    // combines and sends hidden states instead).
    const bool routed = chunk_part(*a_part) == Part::kExperts || chunk_part(*b_part) == Part::kExperts;
    const int64_t bytes = ed.bytes * (routed ? g.moe_top_k : 1);
    s.comm_bytes = (bytes + slices - 1) / slices;
    s.m2n_sender = true;
    s.m2n_src_part = *a_part;
    s.m2n_dst_part = *b_part;
    Node r = s;
    r.tags = b.tags;
    r.tags.part = "m2n";
    r.name = name + ".recv";
    r.pp_rank = b.pp_rank;
    r.peer_pp_rank = a.pp_rank;
    r.stream = "m2n_from_" + std::to_string(a.pp_rank);
    r.m2n_sender = false;
    NodeId sid = g.add_node(std::move(s));
    NodeId rid = g.add_node(std::move(r));
    g.add_edge(ed.src, sid, EdgeKind::kData, ed.bytes);
    g.add_edge(rid, ed.dst, EdgeKind::kData, ed.bytes);
    ++exchanges;
  }
  if (exchanges == 0) return invalid_argument("disaggregate found no attention/FFN boundary; is the model a MoE?");
  return ok_status();
}

}  // namespace piper::ir
