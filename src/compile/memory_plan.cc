// Memory of a rank: where activation and gathered-parameter buffers live, and the resident model state.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "piper/compile/lower_steps.h"

namespace piper::compile {

using ir::Node;
using ir::NodeId;
using ir::NodeKind;

namespace {

// A backward chunk's transient buffers: its working set (ir::Node::backward_scratch_bytes), live while it runs; a B's
// gradients for its W (ir::Node::weight_grad_bytes), live until that W has run; and under ZeRO-2/3 the full
// gradients its weight-gradient task writes, live until its reduce-scatter has sent them (the static state holds
// only the 1/dp shard).
// Whether reduce-scatter `rs` feeds a ZeRO-2/3 update: directly, or through the chunk's tp gradient sum
// (ir::is_tp_grad_sum, which sits between the reduction and the update when the gradient is partial over tp).
bool feeds_sharded_update(const ir::Graph& g, NodeId rs) {
  for (NodeId u : g.succs(rs)) {
    const Node& n = g.node(u);
    if (n.kind == NodeKind::kUpdate && n.zero >= 2) return true;
    if (ir::is_tp_grad_sum(n) && feeds_sharded_update(g, u)) return true;
  }
  return false;
}

void plan_backward_buffers(const ir::Graph& g, const Node& nd, int& next_buffer, BufferPlan& out) {
  if (nd.backward_scratch_bytes > 0) {
    Buffer b{next_buffer++, nd.backward_scratch_bytes, "scratch " + nd.name};
    out.scratch_before[nd.id] = b;
    out.free_after[nd.id].push_back(b);
  }
  if (nd.tags.pass == ir::Pass::kB && nd.weight_grad_bytes > 0) {
    for (NodeId c : g.succs(nd.id)) {
      const Node& w = g.node(c);
      if (w.kind != NodeKind::kChunk || w.tags.pass != ir::Pass::kW || w.tags.layer != nd.tags.layer ||
          w.tags.part != nd.tags.part || w.tags.mb != nd.tags.mb)
        continue;
      Buffer b{next_buffer++, nd.weight_grad_bytes, "wgrad " + nd.name};
      out.weight_grad_before[nd.id] = b;
      out.free_after[w.id].push_back(b);
      break;
    }
  }
  for (NodeId c : g.succs(nd.id)) {
    const Node& rs = g.node(c);
    if (rs.kind != NodeKind::kReduceScatter || rs.group == "tp" || rs.group == "etp") continue;
    if (!feeds_sharded_update(g, rs.id)) continue;  // ZeRO-1 reduce-scatters too, into the static full gradients
    int64_t params = nd.param_count;
    if (nd.shard_axis == "ep") params /= std::max(1, g.mesh.ep) * std::max(1, g.mesh.etp);
    if (nd.shard_axis == "tp") params /= std::max(1, g.mesh.tp);
    if (params <= 0) return;
    Buffer b{next_buffer++, params * g.grad_bytes, "grads " + nd.name};
    out.grads_before[nd.id] = b;
    out.free_after[rs.id].push_back(b);
    return;
  }
}

}  // namespace

BufferPlan plan_buffers(const ir::Graph& g, int r, const std::vector<OrderKey>& keys, int& next_buffer) {
  auto key_of = [&](NodeId id) -> const OrderKey& { return keys[static_cast<size_t>(id)]; };
  BufferPlan out;
  auto& alloc_before = out.alloc_before;
  auto& recompute_before = out.recompute_before;
  auto& free_after = out.free_after;
  std::map<std::tuple<int, std::string, int>, NodeId> last_backward;
  for (const Node& nd : g.nodes()) {
    if (nd.pp_rank != r || nd.kind != NodeKind::kChunk || !ir::is_backward(nd.tags.pass)) continue;
    auto k = std::make_tuple(nd.tags.layer, nd.tags.part, nd.tags.mb);
    auto it = last_backward.find(k);
    if (it == last_backward.end() || key_of(it->second) < key_of(nd.id)) last_backward[k] = nd.id;
  }
  for (const Node& nd : g.nodes()) {
    if (nd.pp_rank != r || skipped(nd)) continue;
    if (nd.kind == NodeKind::kAllGather && nd.group != "tp" && nd.group != "etp" && nd.tags.mb >= 0) {
      // ZeRO-3: the gathered parameters live until the chunk that uses them is done (re-shard).
      Buffer b{next_buffer++, nd.comm_bytes, "params " + nd.name};
      alloc_before[nd.id] = b;
      for (NodeId c : g.succs(nd.id)) {
        if (g.node(c).kind == NodeKind::kChunk) free_after[c].push_back(b);
      }
      continue;
    }
    if (nd.kind == NodeKind::kChunk && ir::is_backward(nd.tags.pass)) {
      plan_backward_buffers(g, nd, next_buffer, out);
      continue;
    }
    if (nd.kind != NodeKind::kChunk || nd.tags.pass != ir::Pass::kF || nd.activation_bytes <= 0) continue;
    Buffer b{next_buffer++, nd.activation_bytes, "act " + nd.name};
    alloc_before[nd.id] = b;
    auto last = last_backward.find(std::make_tuple(nd.tags.layer, nd.tags.part, nd.tags.mb));
    if (!nd.recompute) {
      if (last != last_backward.end()) free_after[last->second].push_back(b);
      continue;
    }
    // Recompute: keep nothing after F; the first backward task (in program order) of the same chunk and
    // microbatch re-runs it, and the re-run's activations serve until the last backward of (layer, part, mb).
    // Only the chunk's own backward counts: F may have edges to other chunks' backward tasks that are ordering
    // constraints, not uses of its activations (under tensor parallelism every forward chunk precedes every
    // backward chunk of the microbatch), and re-running F before each of them computed it many times.
    free_after[nd.id].push_back(b);
    // What the re-run starts from: the chunk's input, kept from F to its last backward.
    if (nd.checkpoint_bytes > 0 && last != last_backward.end()) {
      Buffer keep{next_buffer++, nd.checkpoint_bytes, "checkpoint " + nd.name};
      out.checkpoint_before[nd.id] = keep;
      free_after[last->second].push_back(keep);
    }
    NodeId first = ir::kNoNode;
    for (NodeId c : g.succs(nd.id)) {
      const Node& cn = g.node(c);
      if (cn.kind != NodeKind::kChunk || !ir::is_backward(cn.tags.pass) || cn.pp_rank != r) continue;
      if (cn.tags.layer != nd.tags.layer || cn.tags.part != nd.tags.part || cn.tags.mb != nd.tags.mb) continue;
      if (first == ir::kNoNode || key_of(c) < key_of(first)) first = c;
    }
    if (first != ir::kNoNode && !recompute_before.count(first)) {
      Buffer again{next_buffer++, nd.activation_bytes, "act " + nd.name + " (recompute)"};
      recompute_before[first] = again;
      if (last != last_backward.end()) free_after[last->second].push_back(again);
      out.recompute_of[first] = nd.id;
    }
  }
  return out;
}

int64_t model_state_bytes(const ir::Graph& g, int r) {
  int64_t bytes = 0;
  std::map<std::pair<int, std::string>, const Node*> first_fwd;
  for (const Node& c : g.nodes()) {
    if (c.pp_rank == r && c.kind == NodeKind::kChunk && c.tags.pass == ir::Pass::kF && c.tags.mb <= 0) {
      first_fwd.emplace(std::make_pair(c.tags.layer, c.tags.part), &c);
    }
  }
  for (const Node& nd : g.nodes()) {
    if (nd.pp_rank != r || nd.kind != NodeKind::kUpdate) continue;
    auto it = first_fwd.find({nd.tags.layer, nd.tags.part});
    if (it == first_fwd.end()) continue;
    int64_t params = it->second->param_count;
    const int zero = nd.zero;
    const std::string& axis = it->second->shard_axis;
    if (axis == "ep") params /= std::max(1, g.mesh.ep) * std::max(1, g.mesh.etp);  // sliced over etp too
    if (axis == "tp") params /= std::max(1, g.mesh.tp);
    int64_t deg = nd.group.empty() ? 1 : nd.group == "edp" ? std::max(1, g.mesh.expert_replicas()) : g.mesh.dp;
    bytes += params * g.param_bytes / (zero >= 3 ? deg : 1);
    bytes += params * g.grad_bytes / (zero >= 2 ? deg : 1);
    bytes += params * g.optimizer_bytes / (zero >= 1 ? deg : 1);
  }
  return bytes;
}

}  // namespace piper::compile
