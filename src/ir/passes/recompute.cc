// recompute: the matched forward chunks drop their activations after F; the backward re-runs F first.
// The lowering emits the recomputation as an extra compute instruction before the chunk's B/BW.
#include <algorithm>

#include "piper/base/strings.h"
#include "piper/ir/passes/passes.h"

namespace piper::ir {

namespace {

Status apply_module_recompute(Graph& g, const RecomputeDirective& d) {
  for (size_t i = 0; i < g.num_nodes(); ++i) {
    const auto id = static_cast<NodeId>(i);
    if (!g.node(id).shard_axis.empty()) {
      return invalid_argument("recompute with modules " + join(d.modules, "+") + " after shard (node " +
                              g.node(id).name + " is sharded over " + g.node(id).shard_axis +
                              "): it counts unsharded activations; put it before the shard directives");
    }
  }
  const bool norm = std::find(d.modules.begin(), d.modules.end(), "layernorm") != d.modules.end();
  const bool act = std::find(d.modules.begin(), d.modules.end(), "moe_act") != d.modules.end();
  int dropped = 0;
  for (NodeId id : g.select(d.filter)) {
    Node& n = g.node(id);
    if (n.kind != NodeKind::kChunk || n.tags.pass != Pass::kF) continue;
    int64_t drop = 0;
    if (norm && n.norm_output_bytes > 0) {
      drop += n.norm_output_bytes;
      n.recompute_norm = true;
      n.activation_whole_bytes -= std::min(n.activation_whole_bytes, n.norm_output_bytes);
      n.norm_output_bytes = 0;
    }
    if (act && n.act_output_bytes > 0) {
      drop += n.act_output_bytes;
      n.recompute_act = true;
      n.act_output_bytes = 0;
    }
    if (drop == 0) continue;
    n.activation_bytes -= std::min(n.activation_bytes, drop);
    n.activation_whole_bytes = std::min(n.activation_whole_bytes, n.activation_bytes);
    ++dropped;
  }
  if (dropped == 0) {
    return invalid_argument("recompute modules " + join(d.modules, "+") + ": filter " + d.filter.to_string() +
                            " matches no MoE router or experts forward chunk (the modules act on MoE layers)");
  }
  return ok_status();
}

}  // namespace

Status apply_recompute(Graph& g, const RecomputeDirective& d) {
  if (!d.modules.empty()) return apply_module_recompute(g, d);
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
