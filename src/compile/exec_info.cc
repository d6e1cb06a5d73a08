// annotate_dataflow (lower_steps.h): what the executors read from the Plan instead of the graph.
#include <algorithm>
#include <map>
#include <utility>

#include "piper/base/check.h"
#include "piper/compile/lower_steps.h"

namespace piper::compile {
namespace {

using ir::Node;
using ir::NodeId;
using ir::NodeKind;

// Live data neighbours of `n` lowered on its own pipeline rank, in edge order (preds: true).
std::vector<NodeId> data_neighbours(const ir::Graph& g, const Node& n, bool preds) {
  std::vector<NodeId> out;
  for (int e : preds ? g.in_edges(n.id) : g.out_edges(n.id)) {
    const ir::Edge& ed = g.edge(e);
    if (!ed.alive || ed.kind != ir::EdgeKind::kData) continue;
    const Node& o = g.node(preds ? ed.src : ed.dst);
    if (o.pp_rank == n.pp_rank && !skipped(o)) out.push_back(o.id);
  }
  return out;
}

// Where the combine of each (MoE layer, microbatch)'s experts runs (Instruction::combine_on_ffn): inside the FFN
// group when the experts' forward output feeds another part's chunk on its rank (the head), the tp all-gather
// before one (a vocabulary-parallel head under sequence parallelism), or an m2n exchange with another attention
// rank than the router's, so that the router's rank cannot combine.
class CombinePlacement {
 public:
  explicit CombinePlacement(const ir::Graph& g) : g_(g) {
    for (const Node& n : g.nodes()) {
      if (n.kind != NodeKind::kChunk || n.tags.pass != ir::Pass::kF) continue;
      const std::optional<Part> part = chunk_part(n.tags.part);
      if (part == Part::kExperts) experts_f_[{n.tags.layer, n.tags.mb}] = n.id;
      if (part == Part::kRouter) router_pp_[{n.tags.layer, n.tags.mb}] = n.pp_rank;
    }
  }
  bool on_ffn(int layer, int mb) const {
    auto f = experts_f_.find({layer, mb});
    if (f == experts_f_.end()) return false;
    auto r = router_pp_.find({layer, mb});
    const int router_pp = r == router_pp_.end() ? -1 : r->second;
    const Node& fwd = g_.node(f->second);
    for (int e : g_.out_edges(fwd.id)) {
      const ir::Edge& ed = g_.edge(e);
      if (!ed.alive || ed.kind != ir::EdgeKind::kData) continue;
      const Node& c = g_.node(ed.dst);
      // Not the chunk's own F -> BW (stash) edge: another part's chunk, or an m2n to another attention rank.
      if (c.kind == NodeKind::kChunk && c.tags.part != fwd.tags.part) return true;
      if (c.kind == NodeKind::kAllGather && c.group == "tp") return true;
      if (c.kind == NodeKind::kM2N && c.peer_pp_rank != router_pp) return true;
    }
    return false;
  }

 private:
  const ir::Graph& g_;
  std::map<std::pair<int, int>, NodeId> experts_f_;
  std::map<std::pair<int, int>, int> router_pp_;
};

// The facts of node `n` every instruction lowering it carries. `partner`: the other side of an m2n pair.
void annotate(const ir::Graph& g, const Node& n, const Node* partner, const CombinePlacement& combine, bool data_edges,
              Instruction& in) {
  if (data_edges) {
    in.inputs = data_neighbours(g, n, true);
    in.outputs = data_neighbours(g, n, false);
  }
  if (n.kind == NodeKind::kChunk || n.kind == NodeKind::kUpdate) {
    in.recompute = n.kind == NodeKind::kChunk && n.recompute;
    in.recompute_norm = n.kind == NodeKind::kChunk && n.recompute_norm;
    in.recompute_act = n.kind == NodeKind::kChunk && n.recompute_act;
    in.shard_axis = n.shard_axis;
  }
  if (n.kind != NodeKind::kM2N) return;
  // The IR's part names become the enum here, once (disaggregate connects chunks only: both ends name one).
  in.src_part = chunk_part(n.m2n_src_part);
  in.dst_part = chunk_part(n.m2n_dst_part);
  PIPER_CHECK(in.src_part && in.dst_part);
  // The node carries its local chunk's tags (the producer's on the sender, the consumer's on the receiver).
  const Part mine = n.m2n_sender ? *in.src_part : *in.dst_part;
  const Part theirs = n.m2n_sender ? *in.dst_part : *in.src_part;
  if (mine == Part::kExperts) {
    in.experts_layer = n.tags.layer;
  } else if (theirs == Part::kExperts && partner != nullptr) {
    in.experts_layer = partner->tags.layer;
  }
  if (in.experts_layer >= 0) in.combine_on_ffn = combine.on_ffn(in.experts_layer, n.tags.mb);
  // Where the FFN group combines, the combine (experts -> next, F) and its gradient (next -> experts, B) carry one
  // hidden row per token, not the top_k routed rows the disaggregate pass priced (executor_m2n.cc).
  const bool combine_path = (*in.src_part == Part::kExperts && n.tags.pass == ir::Pass::kF) ||
                            (*in.dst_part == Part::kExperts && ir::is_backward(n.tags.pass));
  if (in.combine_on_ffn && combine_path && g.moe_top_k > 1) {
    in.comm_bytes = (in.comm_bytes + g.moe_top_k - 1) / g.moe_top_k;
  }
}

}  // namespace

void annotate_dataflow(const ir::Graph& g, Plan& plan, bool data_edges) {
  plan.num_microbatches = std::max(1, g.num_microbatches);
  plan.num_layers = g.num_layers;
  // Both sides of an m2n pair share pair_name (lower_steps.h); the sender's side is the first of the two.
  std::map<std::string, std::pair<NodeId, NodeId>> pairs;  // pair name -> (sender, receiver)
  for (const Node& n : g.nodes()) {
    if (n.kind != NodeKind::kM2N || skipped(n)) continue;
    auto& p = pairs.try_emplace(pair_name(n), ir::kNoNode, ir::kNoNode).first->second;
    (n.m2n_sender ? p.first : p.second) = n.id;
  }
  const CombinePlacement combine(g);
  for (Program& prog : plan.templates) {
    for (Stream& st : prog.streams) {
      for (Instruction& in : st.instrs) {
        if (in.node == ir::kNoNode) continue;
        const Node& n = g.node(in.node);
        const Node* partner = nullptr;
        if (n.kind == NodeKind::kM2N) {
          const auto& [s, r] = pairs.at(pair_name(n));
          const NodeId other = n.m2n_sender ? r : s;
          if (other != ir::kNoNode) partner = &g.node(other);
        }
        annotate(g, n, partner, combine, data_edges, in);
      }
    }
  }
}

}  // namespace piper::compile
