#include "piper/ir/layer_chain.h"

namespace piper::ir {

Graph build_layer_chain(int num_layers, const MeshInfo& mesh) {
  Graph g;
  g.mesh = mesh;
  g.num_layers = num_layers;
  std::vector<NodeId> fwd, bwd, upd;
  for (int l = 0; l < num_layers; ++l) {
    auto make = [&](NodeKind kind, Pass pass, const char* suffix) {
      Node n;
      n.kind = kind;
      n.tags.layer = l;
      n.tags.part = "block";
      n.tags.pass = pass;
      n.name = "L" + std::to_string(l) + ".block." + suffix;
      return g.add_node(std::move(n));
    };
    fwd.push_back(make(NodeKind::kChunk, Pass::kF, "F"));
    bwd.push_back(make(NodeKind::kChunk, Pass::kBW, "BW"));
    upd.push_back(make(NodeKind::kUpdate, Pass::kU, "U"));
  }
  for (int l = 0; l < num_layers; ++l) {
    if (l + 1 < num_layers) {
      g.add_edge(fwd[static_cast<size_t>(l)], fwd[static_cast<size_t>(l) + 1], EdgeKind::kData);
      g.add_edge(bwd[static_cast<size_t>(l) + 1], bwd[static_cast<size_t>(l)], EdgeKind::kData);
    }
    g.add_edge(fwd[static_cast<size_t>(l)], bwd[static_cast<size_t>(l)], EdgeKind::kData);
    g.add_edge(bwd[static_cast<size_t>(l)], upd[static_cast<size_t>(l)], EdgeKind::kData);
  }
  return g;
}

}  // namespace piper::ir
