// replicate: data parallelism (and ZeRO) for the matched chunks' parameters.
//
// Per (layer, part) parameter group, over axis dp (experts: edp, MeshInfo::expert_replicas ranks, when sharded over
// ep or when MeshInfo::experts_reduce_over_edp):
//   zero 0: one all_reduce of the accumulated gradient after every microbatch's backward -> update
//   zero 1: one reduce_scatter after all microbatches -> sharded update -> all_gather of the new parameters
//   zero 2: a reduce_scatter per microbatch (gradients accumulate sharded) -> sharded update -> all_gather
//   zero 3: as zero 2, plus an all_gather before every F and every B/BW of every microbatch; parameters are
//           re-sharded after each use (the lowering frees the gathered copy after its consumer), and no
//           all_gather follows the update.
// bucket_mb > 0 cuts a group's collectives into ceil(bytes / bucket) chained pieces.
#include <algorithm>
#include <climits>
#include <cmath>
#include <map>

#include "piper/ir/passes/passes.h"
#include "piper/spec/part.h"

namespace piper::ir {
namespace {

struct Group {
  std::vector<NodeId> fwd, bwd, grad;  // grad: the nodes producing weight gradients (BW or W)
  NodeId update = kNoNode;
};

Node comm_node(const Node& like, NodeKind kind, const std::string& what, int mb, Pass pass, const std::string& axis,
               const ReplicateDirective& d, int64_t bytes) {
  Node n;
  n.kind = kind;
  n.tags = like.tags;
  n.tags.mb = mb;
  n.tags.pass = pass;
  n.name = (chunk_part(like.tags.part) == Part::kEmbedding || chunk_part(like.tags.part) == Part::kHead
                ? like.tags.part
                : "L" + std::to_string(like.tags.layer) + "." + like.tags.part) +
           "." + what + (mb >= 0 ? ".mb" + std::to_string(mb) : "");
  n.pp_rank = like.pp_rank;
  n.stream = d.stream;
  n.group = axis;
  n.algorithm = "ring";
  n.comm_bytes = bytes;
  return n;
}

}  // namespace

Status apply_replicate(Graph& g, const ReplicateDirective& d) {
  std::map<std::pair<int, std::string>, Group> groups;
  for (NodeId id : g.select(d.filter)) {
    const Node& n = g.node(id);
    auto key = std::make_pair(n.tags.layer, n.tags.part);
    if (n.kind == NodeKind::kUpdate) groups[key].update = id;
    if (n.kind != NodeKind::kChunk) continue;
    if (n.tags.pass == Pass::kF) groups[key].fwd.push_back(id);
    if (n.tags.pass == Pass::kB || n.tags.pass == Pass::kBW) groups[key].bwd.push_back(id);
    if (n.tags.pass == Pass::kW || n.tags.pass == Pass::kBW) groups[key].grad.push_back(id);
  }
  int replicated = 0;
  for (auto& [key, grp] : groups) {
    if (grp.fwd.empty()) continue;
    if (grp.update == kNoNode) {
      return invalid_argument("filter " + d.filter.to_string() + " matches the chunks of layer " +
                              std::to_string(key.first) + " " + key.second +
                              " but not their update node; drop \"pass\" from the filter");
    }
    if (!g.node(grp.update).group.empty()) {
      return invalid_argument("layer " + std::to_string(key.first) + " " + key.second +
                              " is already replicated; give one replicate per chunk");
    }
    const Node& first = g.node(grp.fwd[0]);
    // The experts reduce over edp when sharded over ep, or when their tensor ranks saw different tokens
    // (MeshInfo::experts_reduce_over_edp: then with ep = 1 too, over the dp x tp ranks of the stage).
    const bool edp_experts = first.shard_axis == "ep" || (chunk_part(first.tags.part) == Part::kExperts &&
                                                          g.mesh.experts_reduce_over_edp(g.sequence_parallel()));
    const std::string axis = edp_experts ? "edp" : d.axis;
    const int degree = edp_experts ? g.mesh.expert_replicas() : g.mesh.dp;
    if (degree <= 1) continue;  // nothing to replicate over (e.g. experts with ep == dp)
    ++replicated;
    int64_t params = first.param_count;
    // Experts: sharded over ep and sliced over etp (MeshInfo::etp).
    if (!first.shard_axis.empty()) params /= first.shard_axis == "ep" ? g.mesh.ep * g.mesh.etp : g.mesh.tp;
    const int64_t grad_bytes = params * g.grad_bytes, param_bytes = params * g.param_bytes;
    const int pieces =
        d.bucket_mb > 0
            ? std::max(1, static_cast<int>(std::ceil(static_cast<double>(param_bytes) / (d.bucket_mb * 1e6))))
            : 1;
    for (NodeId id : grp.fwd) g.node(id).zero = d.zero;
    for (NodeId id : grp.bwd) g.node(id).zero = d.zero;
    for (NodeId id : grp.grad) g.node(id).zero = d.zero;
    Node& upd = g.node(grp.update);
    upd.zero = d.zero;
    upd.group = axis;
    const Node upd_copy = upd;
    // Gradient reduction: cut grad -> update edges and route them through the collective chain.
    auto reduce_chain = [&](const std::vector<NodeId>& sources, int mb, NodeKind kind) {
      NodeId head = kNoNode, tail = kNoNode;
      for (int k = 0; k < pieces; ++k) {
        std::string what =
            std::string(kind == NodeKind::kAllReduce ? "ar" : "rs") + (pieces > 1 ? ".b" + std::to_string(k) : "");
        Node c =
            comm_node(g.node(sources[0]), kind, what, mb, g.node(sources[0]).tags.pass, axis, d, grad_bytes / pieces);
        c.bucket = k;
        NodeId id = g.add_node(std::move(c));
        if (tail != kNoNode) g.add_edge(tail, id, EdgeKind::kData);
        if (head == kNoNode) head = id;
        tail = id;
      }
      for (NodeId s : sources) {
        for (int e : std::vector<int>(g.out_edges(s))) {
          if (g.edge(e).alive && g.edge(e).dst == grp.update) g.remove_edge(e);
        }
        g.add_edge(s, head, EdgeKind::kData, grad_bytes);
      }
      g.add_edge(tail, grp.update, EdgeKind::kData, grad_bytes);
    };
    const NodeKind reduce = d.zero == 0 && d.reduce == "all_reduce" ? NodeKind::kAllReduce : NodeKind::kReduceScatter;
    if (d.zero <= 1) {
      reduce_chain(grp.grad, -1, reduce);
    } else {
      for (NodeId s : grp.grad) reduce_chain({s}, g.node(s).tags.mb, NodeKind::kReduceScatter);
    }
    if (d.zero >= 1 || reduce == NodeKind::kReduceScatter) {
      g.node(grp.update).param_count = params / degree;
    }
    if (d.zero == 3) {
      for (const auto* list : {&grp.fwd, &grp.bwd}) {
        for (NodeId c : *list) {
          const Node& chunk = g.node(c);
          Node ag = comm_node(chunk, NodeKind::kAllGather, std::string("ag.") + to_string(chunk.tags.pass),
                              chunk.tags.mb, chunk.tags.pass, axis, d, param_bytes);
          NodeId id = g.add_node(std::move(ag));
          g.add_edge(id, c, EdgeKind::kData, param_bytes);
        }
      }
    } else if (d.zero >= 1 || reduce == NodeKind::kReduceScatter) {
      Node ag = comm_node(upd_copy, NodeKind::kAllGather, "ag.params", -1, Pass::kU, axis, d, param_bytes);
      NodeId id = g.add_node(std::move(ag));
      if (d.param_gather == "before_forward" && !grp.fwd.empty()) {
        int first_mb = INT_MAX;  // the earliest microbatch's forward chunks need the gathered parameters
        for (NodeId c : grp.fwd) first_mb = std::min(first_mb, g.node(c).tags.mb);
        for (NodeId c : grp.fwd) {
          if (g.node(c).tags.mb == first_mb) g.add_edge(id, c, EdgeKind::kData, param_bytes);
        }
      } else {
        g.add_edge(grp.update, id, EdgeKind::kData, param_bytes);
      }
    }
  }
  if (replicated == 0) {
    return invalid_argument("nothing to replicate: filter " + d.filter.to_string() +
                            " matches no chunk with a data-"
                            "parallel degree above 1 (dp=" +
                            std::to_string(g.mesh.dp) + ", ep=" + std::to_string(g.mesh.ep) +
                            "); drop the directive or raise dp");
  }
  return ok_status();
}

}  // namespace piper::ir
