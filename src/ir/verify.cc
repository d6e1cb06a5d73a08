#include "piper/ir/verify.h"

#include <map>
#include <set>

namespace piper::ir {

Status verify_graph(const Graph& g) {
  const MeshInfo& mesh = g.mesh;
  for (const Node& n : g.nodes()) {
    if (n.tags.stage >= mesh.num_stages()) {
      return internal_error("verify: " + describe(n) + " is on stage " + std::to_string(n.tags.stage) +
                            " but the mesh has " + std::to_string(mesh.num_stages()) + " stages");
    }
    if (n.pp_rank >= mesh.pp) {
      return internal_error("verify: " + describe(n) + " is on pipeline rank " + std::to_string(n.pp_rank) +
                            " but pp=" + std::to_string(mesh.pp));
    }
    if (n.order_slot >= 0 && n.pp_rank < 0) {
      return internal_error("verify: " + describe(n) + " is ordered but not placed on a pipeline rank");
    }
  }
  for (const Edge& e : g.edges()) {
    if (!e.alive) continue;
    const Node& a = g.node(e.src);
    const Node& b = g.node(e.dst);
    if (e.kind == EdgeKind::kTemporal && a.pp_rank >= 0 && b.pp_rank >= 0 && a.pp_rank != b.pp_rank) {
      return internal_error("verify: temporal edge " + describe(a) + " -> " + describe(b) +
                            " joins two pipeline ranks; orders are per rank");
    }
  }
  // Dense slot numbering per (rank, stream).
  std::map<std::pair<int, std::string>, std::set<int>> slots;
  for (const Node& n : g.nodes()) {
    if (n.order_slot >= 0) slots[{n.pp_rank, n.stream}].insert(n.order_slot);
  }
  for (const auto& [key, used] : slots) {
    if (*used.rbegin() + 1 != static_cast<int>(used.size())) {
      return internal_error("verify: rank " + std::to_string(key.first) + " stream '" + key.second +
                            "' has holes in its order (" + std::to_string(used.size()) + " slots, last index " +
                            std::to_string(*used.rbegin()) + ")");
    }
  }
  // Send/recv pairing: each send has exactly one recv successor through a data edge... sends and receives are
  // deliberately not linked (each rank's sub-DAG must be separable), so pairs are matched by `peer_pp_rank`
  // and the shared name instead.
  std::map<std::string, int> p2p;
  for (const Node& n : g.nodes()) {
    if (n.kind == NodeKind::kSend) ++p2p[n.name.substr(0, n.name.rfind('.'))];
    if (n.kind == NodeKind::kRecv) --p2p[n.name.substr(0, n.name.rfind('.'))];
    if (n.kind == NodeKind::kM2N) p2p[n.name.substr(0, n.name.rfind('.'))] += n.m2n_sender ? 1 : -1;
  }
  for (const auto& [name, balance] : p2p) {
    if (balance != 0) {
      return internal_error("verify: transfer '" + name + "' has " + (balance > 0 ? "a send without a recv" :
                                                                       "a recv without a send"));
    }
  }
  if (g.is_acyclic()) return ok_status();
  auto topo = g.topo_order();  // names the nodes on the cycle
  if (!topo.ok()) return topo.status().with_context("verify");
  return internal_error("verify: is_acyclic() and topo_order() disagree");
}

}  // namespace piper::ir
