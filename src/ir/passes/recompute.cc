// recompute: the matched forward chunks drop their activations after F; the backward re-runs F first.
// The lowering emits the recomputation as an extra compute instruction before the chunk's B/BW.
#include "piper/ir/passes/passes.h"

namespace piper::ir {

Status apply_recompute(Graph& g, const RecomputeDirective& d) {
  std::vector<NodeId> hits = g.select(d.filter);
  int marked = 0;
  for (NodeId id : hits) {
    Node& n = g.node(id);
    if (n.kind == NodeKind::kChunk && n.tags.pass == Pass::kF) {
      n.recompute = true;
      ++marked;
    }
  }
  if (marked == 0) {
    return invalid_argument("filter " + d.filter.to_string() + " matches no forward chunk; recompute applies to F");
  }
  return ok_status();
}

}  // namespace piper::ir
