// split_backward: fused BW chunks become B (input grad) -> W (weight grad).
//
// B keeps the BW node's id and its incoming edges; outgoing edges that carry weight gradients (to update
// nodes and to data-parallel gradient collectives) move to the new W node, edges carrying input gradients
// (to other chunks' backwards, to tensor-parallel collectives and to the experts' etp reduce-scatter) stay on B.
#include "piper/ir/passes/passes.h"

namespace piper::ir {

void split_backward(Graph& g, const std::vector<NodeId>& nodes) {
  for (NodeId id : nodes) {
    auto i = static_cast<size_t>(id);
    if (g.node(id).kind != NodeKind::kChunk || g.node(id).tags.pass != Pass::kBW) continue;
    g.backward_split = true;
    Node w = g.node(static_cast<NodeId>(i));
    Node& b = g.node(static_cast<NodeId>(i));
    b.tags.pass = Pass::kB;
    b.flops = w.flops / 2;
    auto rename = [](std::string& name, const char* to) {
      auto pos = name.find(".BW");
      if (pos != std::string::npos) name.replace(pos, 3, to);
    };
    rename(b.name, ".B");
    w.tags.pass = Pass::kW;
    w.flops -= b.flops;
    w.activation_bytes = 0;
    w.activation_whole_bytes = 0;
    w.checkpoint_bytes = 0;
    w.backward_scratch_bytes = 0;  // B's working set; W reuses what B left for it (the deferred B -> W gradients)
    w.weight_grad_bytes = 0;       // held from B to W: allocated with B (compile/memory_plan.cc)
    w.order_slot = -1;
    rename(w.name, ".W");
    NodeId wid = g.add_node(std::move(w));
    std::vector<int> out = g.out_edges(static_cast<NodeId>(i));
    for (int e : out) {
      const Edge ed = g.edge(e);
      if (!ed.alive) continue;
      const Node& dst = g.node(ed.dst);
      // Gradient collectives of the data-parallel axes carry weight gradients; tensor-parallel all-reduce /
      // reduce-scatter (shard tp) carry input gradients and stay on B (moving them made W feed the previous
      // chunk's B: a cycle with any order that runs W late, i.e. zb-h1 and dualpipev with tp > 1).
      bool grad_collective = dst.kind == NodeKind::kAllReduce || dst.kind == NodeKind::kReduceScatter;
      // The experts' etp reduce-scatter (shard ep with etp > 1) sums their input-row gradients: B's too.
      bool weight_grad = dst.kind == NodeKind::kUpdate || (grad_collective && dst.group != "tp" && dst.group != "etp");
      if (!weight_grad) continue;
      g.remove_edge(e);
      g.add_edge(wid, ed.dst, ed.kind, ed.bytes);
    }
    g.add_edge(static_cast<NodeId>(i), wid, EdgeKind::kData);
  }
}

void split_backward(Graph& g) {
  std::vector<NodeId> all;
  for (const Node& n : g.nodes()) {
    if (n.kind == NodeKind::kChunk && n.tags.pass == Pass::kBW) all.push_back(n.id);
  }
  split_backward(g, all);
}

}  // namespace piper::ir
