// insert_p2p: every data edge between two pipeline ranks becomes a send on the producer's rank and a recv on
// the consumer's, on the channel's streams p2p_to_<peer> / p2p_from_<peer>.
#include "piper/compile/lower.h"
#include "piper/compile/lower_steps.h"

namespace piper::compile {

using ir::Node;
using ir::NodeId;
using ir::NodeKind;

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
        return invalid_argument(ir::describe(*n) +
                                " is not placed on a pipeline rank; add a place directive "
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

}  // namespace piper::compile
