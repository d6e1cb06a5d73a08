// insert_p2p: every data edge between two pipeline ranks becomes a send on the producer's rank and a recv on
// the consumer's, on the channel's streams p2p_to_<peer> / p2p_from_<peer>.
#include <unordered_map>

#include "piper/compile/lower.h"
#include "piper/compile/lower_steps.h"

namespace piper::compile {

using ir::EdgeKind;
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
    // Under sequence parallelism each tensor rank sends its token slice (Megatron-LM's p2p tensor_shape with
    // sequence_parallel: seq_length / tp), which the receiving stage's rank of the same tp coordinate holds.
    s.comm_bytes = g.sequence_parallel() ? (ed.bytes + g.mesh.tp - 1) / g.mesh.tp : ed.bytes;
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

int add_legacy_pipeline_edges(ir::Graph& g, const StreamOrder& order, bool p2p_blocking,
                              bool dp_reduce_after_backward) {
  int added = 0;
  for (const auto& rank_streams : order.streams) {
    // (stream, position) of every node of the rank; the last chunk (not an update) of each stream.
    std::unordered_map<NodeId, std::pair<const std::vector<NodeId>*, size_t>> where;
    std::unordered_map<std::string, NodeId> last_chunk;
    for (const auto& [name, nodes] : rank_streams) {
      for (size_t k = 0; k < nodes.size(); ++k) {
        where[nodes[k]] = {&nodes, k};
        const Node& n = g.node(nodes[k]);
        if (n.kind == NodeKind::kChunk && !skipped(n)) last_chunk[name] = nodes[k];
      }
    }
    for (const auto& [name, nodes] : rank_streams) {
      for (NodeId id : nodes) {
        const Node& n = g.node(id);
        if (p2p_blocking && n.kind == NodeKind::kSend && n.group == "pp") {
          // The stream to hold is the compute stream: walk back from the producer (e.g. a tp all-reduce on its
          // own stream) to the chunk that computed the tensor.
          std::vector<NodeId> producers = g.preds(id);
          for (int depth = 0; depth < 4 && !producers.empty() && g.node(producers[0]).kind != NodeKind::kChunk;
               ++depth) {
            producers = g.preds(producers[0]);
          }
          for (NodeId p : producers) {
            auto it = where.find(p);
            if (it == where.end()) continue;
            const auto& [list, k] = it->second;
            for (size_t j = k + 1; j < list->size(); ++j) {
              if (skipped(g.node((*list)[j]))) continue;
              g.add_edge(id, (*list)[j], EdgeKind::kTemporal);
              ++added;
              break;
            }
          }
        }
        if (dp_reduce_after_backward && n.kind == NodeKind::kAllReduce && (n.group == "dp" || n.group == "edp")) {
          for (NodeId p : g.preds(id)) {
            const Node& pn = g.node(p);
            if (pn.kind != NodeKind::kChunk) continue;
            auto last = last_chunk.find(pn.stream);
            if (last == last_chunk.end() || last->second == p) break;
            g.add_edge(last->second, id, EdgeKind::kTemporal);
            ++added;
            break;
          }
        }
      }
    }
  }
  return added;
}

}  // namespace piper::compile
