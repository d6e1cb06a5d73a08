// tp_grad_sum: the gradients that are partial sums over tp, summed over the chunk's tp group before its update.
//
// With tp > 1 a tensor rank's gradient of some tensors is only its share of the whole:
//   - a chunk split over tp (shard tp): the tensors it keeps whole (Node::tp_whole_params: norm weights, ...), whose
//     input gradient each rank computed from its heads or units only;
//   - under sequence parallelism, every tensor of a chunk that is not split (router, an unsplit embedding or head):
//     each tensor rank saw a slice of the tokens. The experts are left out when the replicate pass reduces them over
//     edp (MeshInfo::experts_reduce_over_edp, always under sequence parallelism), which sums those slices already.
// One all_reduce over tp per such chunk, after its gradient is complete and reduced over dp and before its update
// (compile::CommRole::kTpGradSum). After the data-parallel reduction, not before: under ZeRO-2/3 the whole gradient
// exists only per microbatch (each is reduce-scattered at once), so a sum before it would run once per microbatch;
// after it the sum runs once, on the reduced shard, and is exact for ZeRO 0-3 because summing over tp commutes with
// the mean over dp and the shards of one chunk cover the same elements on every tensor rank (each holds the same
// chunk structure). Under ZeRO its bytes are the shard's share of the partial tensors (which shard holds them
// depends on the data-parallel rank: the plan prices the mean, ceil(partial / degree)).
#include <map>
#include <utility>
#include <vector>

#include "piper/ir/passes/passes.h"
#include "piper/spec/part.h"

namespace piper::ir {
namespace {

// Elements of `chunk`'s gradient that are partial over tp (0: none).
int64_t partial_params(const Graph& g, const Node& chunk) {
  const bool split = chunk.shard_axis == "tp";
  const bool experts = chunk_part(chunk.tags.part) == Part::kExperts;
  if (!g.mesh.grads_partial_over_tp(split, experts, g.sequence_parallel())) return 0;
  return split ? chunk.tp_whole_params : chunk.param_count;
}

// Inserts the sum of `elements` partial gradient elements between update `u` and every data edge into it (the
// chunk's weight-gradient tasks, or its data-parallel reductions).
void insert_sum(Graph& g, NodeId u, int64_t elements) {
  std::vector<int> into;
  bool sharded = false;
  for (int e : g.in_edges(u)) {
    const Edge& ed = g.edge(e);
    if (!ed.alive || ed.kind != EdgeKind::kData) continue;
    into.push_back(e);
    sharded |= g.node(ed.src).kind == NodeKind::kReduceScatter;
  }
  if (into.empty()) return;
  const Node& upd = g.node(u);
  if (sharded) {
    const int degree = upd.group == "edp" ? g.mesh.expert_replicas() : g.mesh.dp;
    elements = (elements + degree - 1) / degree;
  }
  Node n;
  n.kind = NodeKind::kAllReduce;
  n.tags = upd.tags;
  n.tags.mb = -1;
  n.tags.pass = g.node(g.edge(into[0]).src).tags.pass;
  const std::optional<Part> part = chunk_part(upd.tags.part);
  n.name =
      (part == Part::kEmbedding || part == Part::kHead ? upd.tags.part
                                                       : "L" + std::to_string(upd.tags.layer) + "." + upd.tags.part) +
      ".tp_sum";
  n.pp_rank = upd.pp_rank;
  n.stream = "tp_grad";  // its own stream: overlaps the data-parallel reductions of the chunks after it
  n.group = "tp";
  n.algorithm = "ring";
  n.comm_bytes = elements * g.grad_bytes;
  const NodeId sum = g.add_node(std::move(n));
  for (int e : into) {
    const Edge ed = g.edge(e);
    g.remove_edge(e);
    g.add_edge(ed.src, sum, EdgeKind::kData, ed.bytes);
  }
  g.add_edge(sum, u, EdgeKind::kData, g.node(sum).comm_bytes);
}

}  // namespace

void add_tp_grad_sums(Graph& g) {
  if (g.mesh.tp <= 1) return;
  std::map<std::pair<int, std::string>, NodeId> forward;  // (layer, part) -> one of its F chunks
  for (const Node& n : g.nodes()) {
    if (n.kind == NodeKind::kChunk && n.tags.pass == Pass::kF)
      forward.emplace(std::make_pair(n.tags.layer, n.tags.part), n.id);
  }
  const size_t count = g.num_nodes();
  for (size_t i = 0; i < count; ++i) {
    const NodeId u = static_cast<NodeId>(i);
    if (g.node(u).kind != NodeKind::kUpdate) continue;
    const auto f = forward.find({g.node(u).tags.layer, g.node(u).tags.part});
    if (f == forward.end()) continue;
    const int64_t elements = partial_params(g, g.node(f->second));
    if (elements > 0) insert_sum(g, u, elements);
  }
}

}  // namespace piper::ir
