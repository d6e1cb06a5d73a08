#include "piper/ir/graph.h"

#include <queue>

#include "piper/base/check.h"
#include "piper/spec/part.h"

namespace piper::ir {

bool is_tp_grad_sum(const Node& n) {
  return n.kind == NodeKind::kAllReduce && n.group == "tp" && chunk_part(n.tags.part).has_value();
}

NodeId Graph::add_node(Node node) {
  node.id = static_cast<NodeId>(nodes_.size());
  nodes_.push_back(std::move(node));
  out_.emplace_back();
  in_.emplace_back();
  return nodes_.back().id;
}

int Graph::add_edge(NodeId src, NodeId dst, EdgeKind kind, int64_t bytes) {
  PIPER_CHECK(src >= 0 && static_cast<size_t>(src) < nodes_.size(), "bad edge source ", src);
  PIPER_CHECK(dst >= 0 && static_cast<size_t>(dst) < nodes_.size(), "bad edge destination ", dst);
  PIPER_CHECK(src != dst, "self edge on ", describe(nodes_[static_cast<size_t>(src)]));
  int id = static_cast<int>(edges_.size());
  edges_.push_back(Edge{src, dst, kind, bytes, true});
  out_[static_cast<size_t>(src)].push_back(id);
  in_[static_cast<size_t>(dst)].push_back(id);
  return id;
}

void Graph::remove_edge(int edge_id) { edges_[static_cast<size_t>(edge_id)].alive = false; }

NodeId Graph::insert_on_edge(int edge_id, Node n) {
  const Edge e = edge(edge_id);
  remove_edge(edge_id);
  NodeId id = add_node(std::move(n));
  add_edge(e.src, id, e.kind, e.bytes);
  add_edge(id, e.dst, e.kind, e.bytes);
  return id;
}

bool Graph::has_edge(NodeId src, NodeId dst, EdgeKind kind) const {
  for (int e : out_edges(src)) {
    const Edge& ed = edge(e);
    if (ed.alive && ed.dst == dst && ed.kind == kind) return true;
  }
  return false;
}

std::vector<NodeId> Graph::preds(NodeId id) const {
  std::vector<NodeId> out;
  for (int e : in_edges(id)) {
    if (edge(e).alive) out.push_back(edge(e).src);
  }
  return out;
}

std::vector<NodeId> Graph::succs(NodeId id) const {
  std::vector<NodeId> out;
  for (int e : out_edges(id)) {
    if (edge(e).alive) out.push_back(edge(e).dst);
  }
  return out;
}

std::vector<NodeId> Graph::select(const TagFilter& filter) const {
  std::vector<NodeId> out;
  for (const Node& n : nodes_) {
    if (filter.matches(n.tags)) out.push_back(n.id);
  }
  return out;
}

bool Graph::is_acyclic() const {
  std::vector<int> indeg(nodes_.size(), 0);
  for (const Edge& e : edges_) {
    if (e.alive) ++indeg[static_cast<size_t>(e.dst)];
  }
  std::vector<NodeId> stack;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (indeg[i] == 0) stack.push_back(static_cast<NodeId>(i));
  }
  size_t visited = 0;
  while (!stack.empty()) {
    NodeId n = stack.back();
    stack.pop_back();
    ++visited;
    for (int e : out_edges(n)) {
      const Edge& ed = edge(e);
      if (ed.alive && --indeg[static_cast<size_t>(ed.dst)] == 0) stack.push_back(ed.dst);
    }
  }
  return visited == nodes_.size();
}

Result<std::vector<NodeId>> Graph::topo_order() const {
  std::vector<int> indeg(nodes_.size(), 0);
  for (const Edge& e : edges_) {
    if (e.alive) ++indeg[static_cast<size_t>(e.dst)];
  }
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<>> ready;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (indeg[i] == 0) ready.push(static_cast<NodeId>(i));
  }
  std::vector<NodeId> order;
  order.reserve(nodes_.size());
  while (!ready.empty()) {
    NodeId n = ready.top();
    ready.pop();
    order.push_back(n);
    for (int e : out_edges(n)) {
      const Edge& ed = edge(e);
      if (ed.alive && --indeg[static_cast<size_t>(ed.dst)] == 0) ready.push(ed.dst);
    }
  }
  if (order.size() == nodes_.size()) return order;
  // Walk backwards from a blocked node along blocked predecessors until a node repeats: that is a cycle.
  NodeId start = kNoNode;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (indeg[i] > 0) {
      start = static_cast<NodeId>(i);
      break;
    }
  }
  std::vector<int> seen(nodes_.size(), -1);
  std::vector<NodeId> path;
  NodeId cur = start;
  while (seen[static_cast<size_t>(cur)] < 0) {
    seen[static_cast<size_t>(cur)] = static_cast<int>(path.size());
    path.push_back(cur);
    for (int e : in_edges(cur)) {
      const Edge& ed = edge(e);
      if (ed.alive && indeg[static_cast<size_t>(ed.src)] > 0) {
        cur = ed.src;
        break;
      }
    }
  }
  std::string names;
  size_t first = static_cast<size_t>(seen[static_cast<size_t>(cur)]);
  size_t shown = 0;
  for (size_t i = path.size(); i-- > first && shown < 4; ++shown) {
    names += (names.empty() ? "" : " -> ") + describe(node(path[i]));
  }
  return invalid_argument("the graph has a cycle through " + names + " (" + std::to_string(path.size() - first) +
                          " nodes); an order or edge contradicts a dependency");
}

std::string describe(const Node& n) {
  std::string s = n.name.empty() ? std::string(to_string(n.kind)) + "#" + std::to_string(n.id) : n.name;
  if (n.tags.mb >= 0 && s.find(".mb") == std::string::npos) s += ".mb" + std::to_string(n.tags.mb);
  if (n.tags.stage >= 0) s += "@stage" + std::to_string(n.tags.stage);
  if (n.pp_rank >= 0) s += "/rank" + std::to_string(n.pp_rank);
  return s;
}

}  // namespace piper::ir
