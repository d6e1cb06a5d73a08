// split: clone the per-microbatch part of the graph N times (microbatches 0..N-1).
//
// Every node without an mb tag except update nodes is per-microbatch. Edges between per-microbatch nodes are
// copied inside each microbatch; edges into or out of shared nodes (updates) are duplicated so that every
// microbatch's gradients feed the same update. Must run before place/order (they select by mb).
#include "piper/ir/passes/passes.h"
#include "piper/spec/limits.h"

namespace piper::ir {

Status apply_split(Graph& g, const SplitDirective& d) {
  if (g.num_microbatches != 1) {
    return invalid_argument("the graph is already split into " + std::to_string(g.num_microbatches) +
                            " microbatches; give one split directive");
  }
  for (const Node& n : g.nodes()) {
    if (n.order_slot >= 0) {
      return invalid_argument("split must come before order directives (" + describe(n) + " is already ordered)");
    }
  }
  const int m = d.microbatches;
  // The split graph holds a copy of every per-microbatch node for each microbatch: bounded before allocating.
  const int64_t nodes = static_cast<int64_t>(g.num_nodes()) * m;
  if (nodes > kMaxGraphNodes) {
    const double gib = static_cast<double>(nodes) * static_cast<double>(sizeof(Node)) / (1u << 30);
    return invalid_argument("split into " + std::to_string(m) + " microbatches would make a graph of " +
                            std::to_string(g.num_nodes()) + " x " + std::to_string(m) + " = " + std::to_string(nodes) +
                            " nodes (" + std::to_string(static_cast<int64_t>(gib)) + "+ GiB); allowed <= " +
                            std::to_string(kMaxGraphNodes) + " nodes; lower microbatches or the model's layers");
  }
  Graph out;
  out.mesh = g.mesh;
  out.num_layers = g.num_layers;
  out.num_microbatches = m;
  out.backward_split = g.backward_split;
  out.param_bytes = g.param_bytes;
  out.grad_bytes = g.grad_bytes;
  out.optimizer_bytes = g.optimizer_bytes;
  out.moe_top_k = g.moe_top_k;  // without it every EP dispatch/combine carried 1/top_k of its bytes
  out.moe_dispatch_ratio = g.moe_dispatch_ratio;
  out.tp_sequence_parallel = g.tp_sequence_parallel;
  auto per_mb = [](const Node& n) { return n.kind != NodeKind::kUpdate && n.tags.mb < 0; };
  // new_id[old][k]: copy k of an old node (shared nodes have one copy).
  std::vector<std::vector<NodeId>> new_id(g.num_nodes());
  for (int k = 0; k < m; ++k) {
    for (const Node& n : g.nodes()) {
      if (!per_mb(n)) continue;
      Node c = n;
      c.tags.mb = k;
      c.name = n.name + ".mb" + std::to_string(k);
      new_id[static_cast<size_t>(n.id)].push_back(out.add_node(std::move(c)));
    }
  }
  for (const Node& n : g.nodes()) {
    if (!per_mb(n)) new_id[static_cast<size_t>(n.id)].push_back(out.add_node(n));
  }
  for (const Edge& e : g.edges()) {
    if (!e.alive) continue;
    const auto& src = new_id[static_cast<size_t>(e.src)];
    const auto& dst = new_id[static_cast<size_t>(e.dst)];
    if (src.size() == dst.size()) {
      for (size_t k = 0; k < src.size(); ++k) out.add_edge(src[k], dst[k], e.kind, e.bytes);
    } else {
      for (NodeId s : src) {
        for (NodeId t : dst) out.add_edge(s, t, e.kind, e.bytes);
      }
    }
  }
  g = std::move(out);
  return ok_status();
}

}  // namespace piper::ir
