// order: one row of a rank's schedule, over chunk nodes (comm nodes are ordered by the lowering next to the
// chunks they feed or drain). Slot k's nodes run before slot k+1's (temporal edges from the sinks of
// slot k to the sources of slot k+1); the filters inside one slot "may overlap" and get no order among them.
//
// Naming pass B or W in a row splits the matched fused backwards into B -> W (split_backward). A row that
// contradicts the dependencies (for example B of a microbatch before its F) makes a cycle, reported with the
// nodes on it. Rows for the same (rank, stream) append to each other.
#include <algorithm>
#include <unordered_set>

#include "piper/ir/passes/passes.h"

namespace piper::ir {
namespace {

// Nodes bucketed by (microbatch, stage) so that a filter naming microbatches scans only their buckets, and one
// that also names stages only theirs. Nodes whose stage is outside the mesh's stages (or whose mb is outside the
// graph's microbatches) sit in a bucket that every filter naming microbatches scans; every candidate is tested with
// TagFilter::matches and must have an mb of the graph, as when the index had one bucket per microbatch.
class MbIndex {
 public:
  explicit MbIndex(const Graph& g)
      : stages_(std::max(0, g.mesh.num_stages())),
        mbs_(std::max(0, g.num_microbatches)),
        buckets_(static_cast<size_t>(mbs_) * static_cast<size_t>(stages_) + 1) {
    for (const Node& n : g.nodes()) buckets_[bucket(n.tags.mb, n.tags.stage)].push_back(n.id);
  }
  std::vector<NodeId> select(const Graph& g, const TagFilter& f) const {
    if (f.mb.empty()) return g.select(f);
    std::vector<NodeId> out;
    auto scan = [&](const std::vector<NodeId>& ids) {
      for (NodeId id : ids) {
        const Tags& t = g.node(id).tags;
        if (t.mb >= 0 && t.mb < mbs_ && f.matches(t)) out.push_back(id);
      }
    };
    const int stage_lo = f.stage.empty() ? 0 : std::max(f.stage.lo, 0);
    const int stage_hi = f.stage.empty() ? stages_ - 1 : std::min(f.stage.hi, stages_ - 1);
    for (int mb = std::max(f.mb.lo, 0); mb <= f.mb.hi && mb < mbs_; ++mb) {
      for (int stage = stage_lo; stage <= stage_hi; ++stage) scan(buckets_[bucket(mb, stage)]);
    }
    scan(buckets_[0]);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  size_t bucket(int mb, int stage) const {
    if (mb < 0 || mb >= mbs_ || stage < 0 || stage >= stages_) return 0;
    return 1 + static_cast<size_t>(mb) * static_cast<size_t>(stages_) + static_cast<size_t>(stage);
  }
  int stages_;
  int mbs_;
  std::vector<std::vector<NodeId>> buckets_;
};

std::string slot_label(size_t k, size_t f, size_t size) {
  return "slots[" + std::to_string(k) + "]" + (size > 1 ? "[" + std::to_string(f) + "]" : "");
}

}  // namespace

Status apply_order(Graph& g, const OrderDirective& d, bool check_cycles) {
  if (d.rank < 0 || d.rank >= g.mesh.pp) {
    return invalid_argument("rank " + std::to_string(d.rank) + " does not exist: pp=" + std::to_string(g.mesh.pp) +
                            " (ranks 0.." + std::to_string(g.mesh.pp - 1) + ")");
  }
  // Backwards named as B or W are split first (only those chunks).
  MbIndex fused_index(g);
  for (const auto& slot : d.slots) {
    for (const auto& f : slot) {
      if (f.pass != Pass::kB && f.pass != Pass::kW) continue;
      TagFilter fused = f;
      fused.pass = Pass::kBW;
      split_backward(g, fused_index.select(g, fused));
    }
  }
  int base = 0;
  for (const Node& n : g.nodes()) {
    if (n.pp_rank == d.rank && n.stream == d.stream && n.order_slot >= base) base = n.order_slot + 1;
  }
  MbIndex index(g);
  std::vector<std::vector<NodeId>> members(d.slots.size());
  for (size_t k = 0; k < d.slots.size(); ++k) {
    for (size_t fi = 0; fi < d.slots[k].size(); ++fi) {
      const TagFilter& f = d.slots[k][fi];
      std::vector<NodeId> hits = index.select(g, f);
      // Rows order compute; comm nodes follow their chunks at lowering.
      std::erase_if(hits, [&](NodeId id) { return g.node(id).kind != NodeKind::kChunk; });
      if (hits.empty()) {
        return invalid_argument(slot_label(k, fi, d.slots[k].size()) + ": filter " + f.to_string() +
                                " matches no chunk (stages 0.." + std::to_string(g.mesh.num_stages() - 1) +
                                ", microbatches 0.." + std::to_string(g.num_microbatches - 1) + ")");
      }
      for (NodeId id : hits) {
        Node& n = g.node(id);
        if (n.pp_rank != d.rank) {
          return invalid_argument(slot_label(k, fi, d.slots[k].size()) + ": " + describe(n) +
                                  (n.pp_rank < 0 ? " is not placed on any rank"
                                                 : " is on rank " + std::to_string(n.pp_rank)) +
                                  ", not rank " + std::to_string(d.rank) + "; an order row cannot cross placement");
        }
        if (n.order_slot >= 0) {
          return invalid_argument(slot_label(k, fi, d.slots[k].size()) + ": " + describe(n) +
                                  " is already ordered (slot " + std::to_string(n.order_slot) + " of stream '" +
                                  n.stream + "'); every node appears in one slot");
        }
        n.stream = d.stream;
        n.order_slot = base + static_cast<int>(k);
        n.order_filter = static_cast<int>(fi);
        members[k].push_back(id);
      }
    }
  }
  // Temporal edges: sinks of slot k -> sources of slot k+1, also from the previous row's last slot.
  auto sources_sinks = [&](const std::vector<NodeId>& set, bool sources) {
    std::unordered_set<NodeId> in(set.begin(), set.end());
    std::vector<NodeId> out;
    for (NodeId id : set) {
      bool inner = false;
      for (NodeId other : sources ? g.preds(id) : g.succs(id)) inner |= in.count(other) > 0;
      if (!inner) out.push_back(id);
    }
    return out;
  };
  std::vector<NodeId> prev;
  if (base > 0) {
    std::vector<NodeId> last;
    for (const Node& n : g.nodes()) {
      if (n.pp_rank == d.rank && n.stream == d.stream && n.order_slot == base - 1) last.push_back(n.id);
    }
    prev = sources_sinks(last, false);
  }
  for (const auto& set : members) {
    std::vector<NodeId> sources = sources_sinks(set, true);
    for (NodeId a : prev) {
      for (NodeId b : sources) {
        if (!g.has_edge(a, b, EdgeKind::kTemporal)) g.add_edge(a, b, EdgeKind::kTemporal);
      }
    }
    prev = sources_sinks(set, false);
  }
  if (!check_cycles || g.is_acyclic()) return ok_status();
  auto topo = g.topo_order();  // names the nodes on the cycle
  if (!topo.ok()) {
    return invalid_argument("rank " + std::to_string(d.rank) + " row contradicts the dependencies: " +
                            topo.status().message());
  }
  return ok_status();
}

}  // namespace piper::ir
