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
#include <algorithm>

#include "piper/ir/passes/passes.h"
#include "piper/spec/part.h"

namespace piper::ir {
namespace {

bool ffn_side(const std::string& part) {
  const std::optional<Part> p = chunk_part(part);
  return p == Part::kExperts || p == Part::kSharedExperts || p == Part::kDenseMlp || p == Part::kHead;
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
  // Place every node with a layer by its side.
  for (size_t i = 0; i < g.num_nodes(); ++i) {
    Node& n = g.node(static_cast<NodeId>(i));
    if (n.tags.layer < 0 || n.tags.part == "dissolved") continue;
    const bool ffn = ffn_side(n.tags.part);
    n.tags.stage = 2 * n.tags.layer + (ffn ? 1 : 0);
    n.pp_rank = ffn ? na + n.tags.layer % nf : n.tags.layer % na;
  }
  // Side-crossing data edges become m2n pairs.
  const size_t num_edges = g.edges().size();
  int exchanges = 0;
  for (size_t e = 0; e < num_edges; ++e) {
    const Edge ed = g.edge(static_cast<int>(e));
    if (!ed.alive || ed.kind != EdgeKind::kData) continue;
    const Node& a = g.node(ed.src);
    const Node& b = g.node(ed.dst);
    if (a.kind != NodeKind::kChunk || b.kind != NodeKind::kChunk || a.pp_rank == b.pp_rank) continue;
    if (ffn_side(a.tags.part) == ffn_side(b.tags.part)) continue;
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
    s.comm_bytes = ed.bytes * (chunk_part(b.tags.part) == Part::kExperts ? g.moe_top_k : 1);
    s.m2n_sender = true;
    s.m2n_src_part = a.tags.part;
    s.m2n_dst_part = b.tags.part;
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
