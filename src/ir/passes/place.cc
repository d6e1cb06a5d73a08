// place: tag nodes with a pipeline stage and/or put them on a pipeline rank.
#include "piper/ir/passes/passes.h"

namespace piper::ir {

Status apply_place(Graph& g, const PlaceDirective& d) {
  const int num_stages = g.mesh.num_stages();
  if (d.stage >= num_stages) {
    return invalid_argument("stage " + std::to_string(d.stage) + " does not exist: the mesh has pp*vpp = " +
                            std::to_string(num_stages) + " stages (0.." + std::to_string(num_stages - 1) +
                            "); place on a smaller stage or raise pp/vpp");
  }
  if (d.rank >= g.mesh.pp) {
    return invalid_argument("pipeline rank " + std::to_string(d.rank) + " does not exist: pp=" +
                            std::to_string(g.mesh.pp) + " (ranks 0.." + std::to_string(g.mesh.pp - 1) + ")");
  }
  if (!d.filter.stage.empty() && d.filter.stage.hi >= num_stages) {
    return invalid_argument("filter " + d.filter.to_string() + " names stage " + std::to_string(d.filter.stage.hi) +
                            ", which does not exist: the mesh has " + std::to_string(num_stages) + " stages");
  }
  std::vector<NodeId> hits = g.select(d.filter);
  if (hits.empty()) {
    return invalid_argument("filter " + d.filter.to_string() +
                            " matches no node (check layer/stage ranges against the model and earlier directives)");
  }
  for (NodeId id : hits) {
    Node& n = g.node(id);
    if (d.stage >= 0) n.tags.stage = d.stage;
    if (d.rank >= 0) {
      if (n.order_slot >= 0 && n.pp_rank != d.rank) {
        return invalid_argument(describe(n) + " is already ordered on rank " + std::to_string(n.pp_rank) +
                                "; place it before ordering");
      }
      n.pp_rank = d.rank;
    }
  }
  return ok_status();
}

}  // namespace piper::ir
