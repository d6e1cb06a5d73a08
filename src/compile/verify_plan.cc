#include "piper/compile/verify_plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

namespace piper::compile {
namespace {

struct Loc {
  int prog = -1;
  int stream = -1;
  size_t pos = 0;
};

std::string where(const Plan& plan, int p, int s, size_t pos) {
  const Stream& st = plan.templates[static_cast<size_t>(p)].streams[static_cast<size_t>(s)];
  std::string what = "end";
  if (pos < st.instrs.size()) {
    const std::string op = to_string(st.instrs[pos].op);
    const std::string& label = st.instrs[pos].label;
    what = label.rfind(op + " ", 0) == 0 ? label : op + " " + label;  // labels such as "wait X" name their op
  }
  return "rank " + std::to_string(p) + " stream '" + st.name + "' instruction " + std::to_string(pos) + " (" + what +
         ")";
}

// Every send and receive of the plan, keyed by (sender rank, tag).
struct PairTable {
  int np = 0;
  std::unordered_map<int64_t, Loc> sends, recvs;
  int64_t key(int rank, int64_t tag) const { return tag * np + rank; }
};

// Collects the sends and receives of every rank (counting the plan's instructions into stats) and checks that
// each has exactly one partner with the same tag on its peer rank.
Result<PairTable> match_point_to_point(const Plan& plan, PlanStats& stats) {
  PairTable pairs;
  pairs.np = static_cast<int>(plan.templates.size());
  const int np = pairs.np;
  for (int p = 0; p < np; ++p) {
    const Program& prog = plan.templates[static_cast<size_t>(p)];
    for (int s = 0; s < static_cast<int>(prog.streams.size()); ++s) {
      const auto& instrs = prog.streams[static_cast<size_t>(s)].instrs;
      stats.instructions += instrs.size();
      for (size_t i = 0; i < instrs.size(); ++i) {
        const Instruction& in = instrs[i];
        if (in.op == OpKind::kSend || in.op == OpKind::kRecv) {
          if (in.peer < 0 || in.peer >= np || in.peer == p) {
            return failed_precondition(where(plan, p, s, i) + ": peer rank " + std::to_string(in.peer) + " is invalid");
          }
          auto& table = in.op == OpKind::kSend ? pairs.sends : pairs.recvs;
          int64_t k = pairs.key(in.op == OpKind::kSend ? p : in.peer, in.tag);
          if (!table.emplace(k, Loc{p, s, i}).second) {
            return failed_precondition(where(plan, p, s, i) + ": a second " + to_string(in.op) + " with the same tag");
          }
        }
      }
    }
  }
  for (const auto& [k, loc] : pairs.sends) {
    auto it = pairs.recvs.find(k);
    const Instruction& in =
        plan.templates[static_cast<size_t>(loc.prog)].streams[static_cast<size_t>(loc.stream)].instrs[loc.pos];
    if (it == pairs.recvs.end() || it->second.prog != in.peer) {
      return failed_precondition(where(plan, loc.prog, loc.stream, loc.pos) +
                                 ": send has no matching receive on rank " + std::to_string(in.peer));
    }
  }
  for (const auto& [k, loc] : pairs.recvs) {
    if (!pairs.sends.count(k))
      return failed_precondition(where(plan, loc.prog, loc.stream, loc.pos) + ": receive has no matching send");
  }
  return pairs;
}

// The error naming the first (up to 8) streams that the abstract execution left blocked at `head`.
Status deadlock_error(const Plan& plan, const std::vector<std::vector<size_t>>& head) {
  std::string msg = "deadlock under blocking point-to-point semantics:";
  int shown = 0;
  const int np = static_cast<int>(plan.templates.size());
  for (int p = 0; p < np && shown < 8; ++p) {
    const Program& prog = plan.templates[static_cast<size_t>(p)];
    for (int s = 0; s < static_cast<int>(prog.streams.size()) && shown < 8; ++s) {
      size_t h = head[static_cast<size_t>(p)][static_cast<size_t>(s)];
      if (h >= prog.streams[static_cast<size_t>(s)].instrs.size()) continue;
      msg += " " + where(plan, p, s, h) + " is blocked;";
      ++shown;
    }
  }
  msg.pop_back();
  return failed_precondition(msg);
}

// Abstract execution: advances every stream of every rank as far as it can (a wait needs its record, a send and
// its receive complete together when both are at the head of their streams) and tracks each rank's live bytes
// into stats.peak_bytes. Fails naming the blocked streams when no stream can move before all are done.
Status execute_abstractly(const Plan& plan, PairTable& pairs, PlanStats& stats) {
  const int np = pairs.np;
  std::vector<std::vector<size_t>> head(static_cast<size_t>(np));
  std::vector<std::unordered_map<int, bool>> events(static_cast<size_t>(np));
  std::vector<int64_t> live(static_cast<size_t>(np));
  size_t remaining = 0;
  for (int p = 0; p < np; ++p) {
    const Program& prog = plan.templates[static_cast<size_t>(p)];
    head[static_cast<size_t>(p)].assign(prog.streams.size(), 0);
    live[static_cast<size_t>(p)] = prog.static_bytes;
    stats.peak_bytes[static_cast<size_t>(p)] = prog.static_bytes;
    remaining += prog.num_instructions();
  }
  auto at = [&](const Loc& l) -> const Instruction* {
    const auto& instrs = plan.templates[static_cast<size_t>(l.prog)].streams[static_cast<size_t>(l.stream)].instrs;
    size_t h = head[static_cast<size_t>(l.prog)][static_cast<size_t>(l.stream)];
    return h == l.pos && h < instrs.size() ? &instrs[h] : nullptr;
  };
  auto complete = [&](int p, int s) {
    const Program& prog = plan.templates[static_cast<size_t>(p)];
    const Instruction& in =
        prog.streams[static_cast<size_t>(s)].instrs[head[static_cast<size_t>(p)][static_cast<size_t>(s)]];
    if (in.op == OpKind::kRecord) events[static_cast<size_t>(p)][in.event] = true;
    live[static_cast<size_t>(p)] += in.mem_delta;
    auto& peak = stats.peak_bytes[static_cast<size_t>(p)];
    peak = std::max(peak, live[static_cast<size_t>(p)]);
    ++head[static_cast<size_t>(p)][static_cast<size_t>(s)];
    --remaining;
  };
  bool progress = true;
  while (remaining > 0 && progress) {
    progress = false;
    for (int p = 0; p < np; ++p) {
      const Program& prog = plan.templates[static_cast<size_t>(p)];
      for (int s = 0; s < static_cast<int>(prog.streams.size()); ++s) {
        const auto& instrs = prog.streams[static_cast<size_t>(s)].instrs;
        while (head[static_cast<size_t>(p)][static_cast<size_t>(s)] < instrs.size()) {
          size_t h = head[static_cast<size_t>(p)][static_cast<size_t>(s)];
          const Instruction& in = instrs[h];
          if (in.op == OpKind::kWait) {
            if (!events[static_cast<size_t>(p)].count(in.event)) break;
          } else if (in.op == OpKind::kSend || in.op == OpKind::kRecv) {
            const bool send = in.op == OpKind::kSend;
            const Loc& other = send ? pairs.recvs[pairs.key(p, in.tag)] : pairs.sends[pairs.key(in.peer, in.tag)];
            if (at(other) == nullptr) break;
            complete(other.prog, other.stream);
          }
          complete(p, s);
          progress = true;
        }
      }
    }
  }
  if (remaining > 0) return deadlock_error(plan, head);
  return ok_status();
}

// With a capacity (> 0): every rank's peak along the abstract execution must fit.
Status check_capacity(const PlanStats& stats, int64_t capacity) {
  if (capacity <= 0) return ok_status();
  for (size_t p = 0; p < stats.peak_bytes.size(); ++p) {
    if (stats.peak_bytes[p] > capacity) {
      return resource_exhausted("rank " + std::to_string(p) + " needs " + std::to_string(stats.peak_bytes[p] >> 20) +
                                " MiB at its peak but "
                                "the device has " +
                                std::to_string(capacity >> 20) +
                                " MiB; raise pp/ep/zero, add recompute, or lower microbatch size");
    }
  }
  return ok_status();
}

// Where the programs reduce the experts' gradients against the rule (ir::MeshInfo::experts_reduce_over_edp): when
// the plan reduces them over edp (tensor ranks included), no experts' reduction runs over dp, and each rank with an
// experts update reduces that layer's experts over edp (the runtime then no longer sums them over tp).
Status check_expert_reduction(const Plan& plan) {
  if (!plan.experts_reduce_over_edp()) return ok_status();
  const bool replicated = plan.mesh.expert_replicas() > 1;
  for (const Program& prog : plan.templates) {
    std::set<int> updated, reduced;
    for (const Stream& st : prog.streams) {
      for (const Instruction& in : st.instrs) {
        if (in.part != Part::kExperts) continue;
        if (in.op == OpKind::kUpdate) updated.insert(in.layer);
        if (in.op != OpKind::kCollective ||
            (in.comm != ir::NodeKind::kAllReduce && in.comm != ir::NodeKind::kReduceScatter &&
             in.comm != ir::NodeKind::kAllGather)) {
          continue;
        }
        // A ZeRO all-gather of the experts' parameters runs over the group their reduction sharded them over.
        if (in.group == "dp") {
          return invalid_argument(
              "plan: '" + in.label + "' " +
              (in.comm == ir::NodeKind::kAllGather ? "gathers the experts' parameters"
                                                   : "reduces the experts' gradients") +
              " over dp, but under " +
              (plan.sequence_parallel ? "sequence parallelism" : "expert tensor parallelism or folding") +
              " with tp=" + std::to_string(plan.mesh.tp) +
              " each tensor rank's experts saw other tokens and the plan must reduce them over "
              "edp (ir::MeshInfo::experts_reduce_over_edp); emit the plan again with this piper");
        }
        if (in.group == "edp" && in.comm != ir::NodeKind::kAllGather) reduced.insert(in.layer);
      }
    }
    for (int layer : updated) {
      if (!replicated || reduced.count(layer) > 0) continue;
      return invalid_argument("plan: pipeline rank " + std::to_string(prog.pp_rank) + " updates the experts of layer " +
                              std::to_string(layer) + " without reducing their gradients over edp (" +
                              std::to_string(plan.mesh.expert_replicas()) +
                              " ranks, tensor ranks included: ir::MeshInfo::experts_reduce_over_edp); emit the plan "
                              "again with this piper");
    }
  }
  return ok_status();
}

// A chunk of a program: (layer, part).
using ChunkKey = std::pair<int, Part>;

std::string chunk_label(const ChunkKey& c) {
  return "(layer " + std::to_string(c.first) + ", " + chunk_name(c.second) + ")";
}

// Whether a chunk's gradients are partial sums over tp, the rule of ir::add_tp_grad_sums (ir/passes/passes.h), from
// the mesh axis its compute is split over: true, false, or nullopt for an embedding split over tp, whose whole
// tensors (learned positions) the plan does not record, so either is accepted.
std::optional<bool> partial_over_tp(const Plan& plan, const ChunkKey& c, const std::string& shard_axis) {
  const bool split = shard_axis == "tp";
  if (plan.mesh.tp > 1 && split && c.second == Part::kEmbedding) return std::nullopt;
  return plan.grads_partial_over_tp(split, c.second);
}

// A tp sum's edges: it reads its chunk's finished gradient (the chunk's weight-gradient tasks, or its data-parallel
// reduction) and its chunk's update reads it; `by_node` holds the program's instructions by node.
Status check_tp_sum_edges(const Instruction& sum, const ChunkKey& key,
                          const std::map<ir::NodeId, const Instruction*>& by_node) {
  auto same_chunk = [&](ir::NodeId id, auto&& is) {
    const auto it = by_node.find(id);
    return it != by_node.end() && it->second->part && ChunkKey{it->second->layer, *it->second->part} == key &&
           is(*it->second);
  };
  auto gradient = [](const Instruction& in) {
    return (in.op == OpKind::kCompute && (in.pass == ir::Pass::kW || in.pass == ir::Pass::kBW)) ||
           in.role == CommRole::kGradReduce;
  };
  auto update = [](const Instruction& in) { return in.op == OpKind::kUpdate; };
  const bool reads = !sum.inputs.empty() && std::all_of(sum.inputs.begin(), sum.inputs.end(), [&](ir::NodeId id) {
    return same_chunk(id, gradient);
  });
  const bool feeds =
      std::any_of(sum.outputs.begin(), sum.outputs.end(), [&](ir::NodeId id) { return same_chunk(id, update); });
  if (reads && feeds) return ok_status();
  return invalid_argument("plan: '" + sum.label + "' sums over tp the gradients of " + chunk_label(key) + " but " +
                          (reads ? "its update does not read it"
                                 : "does not read only that chunk's weight-gradient tasks or data-parallel "
                                   "reduction") +
                          "; emit the plan again with this piper");
}

// Every chunk whose gradients are partial over tp has one tp gradient sum (CommRole::kTpGradSum: an all_reduce over
// tp, once per step) before its update, and no other chunk has one: without it the optimizer would step each tensor
// rank's share of those gradients (the runtime no longer sums them by itself).
Status check_tp_grad_sums(const Plan& plan) {
  for (const Program& prog : plan.templates) {
    std::map<ChunkKey, std::string> axis;  // updated chunks -> the axis their compute is split over
    std::map<ChunkKey, const Instruction*> sums;
    std::map<ir::NodeId, const Instruction*> by_node;
    bool data_edges = false;  // a plan compiled without them (CompileOptions) names no inputs or outputs
    for (const Stream& st : prog.streams) {
      for (const Instruction& in : st.instrs) {
        if (in.node != ir::kNoNode) by_node.emplace(in.node, &in);
        data_edges |= !in.inputs.empty() || !in.outputs.empty();
        if (!in.part) continue;
        const ChunkKey key{in.layer, *in.part};
        if (in.op == OpKind::kUpdate) axis.emplace(key, "");
        if (in.op == OpKind::kCompute) axis[key] = in.shard_axis;
        if (in.role != CommRole::kTpGradSum) continue;
        if (in.comm != ir::NodeKind::kAllReduce || in.group != "tp" || in.mb >= 0 || in.comm_bytes <= 0) {
          return invalid_argument("plan: '" + in.label + "' is a tp gradient sum but not one all_reduce over tp " +
                                  "per step with bytes (comm " + ir::to_string(in.comm) + ", group '" + in.group +
                                  "', mb " + std::to_string(in.mb) + ", " + std::to_string(in.comm_bytes) +
                                  " bytes); emit the plan again with this piper");
        }
        if (!sums.emplace(key, &in).second) {
          return invalid_argument("plan: pipeline rank " + std::to_string(prog.pp_rank) + " sums the gradients of " +
                                  chunk_label(key) + " over tp twice ('" + sums[key]->label + "', '" + in.label +
                                  "'); emit the plan again with this piper");
        }
      }
    }
    for (const auto& [key, in] : sums) {
      const auto a = axis.find(key);
      const std::optional<bool> partial =
          a == axis.end() ? std::optional<bool>(false) : partial_over_tp(plan, key, a->second);
      if (partial.value_or(true)) {
        if (data_edges) PIPER_RETURN_IF_ERROR(check_tp_sum_edges(*in, key, by_node));
        continue;
      }
      return invalid_argument(
          "plan: '" + in->label + "' sums over tp the gradients of " + chunk_label(key) + ", which " +
          (a == axis.end() ? "this rank does not update"
                           : "are whole on every "
                             "tensor rank (the chunk is not split over tp and the plan is not sequence parallel, or "
                             "its experts are reduced over edp)") +
          "; emit the plan again with this piper");
    }
    for (const auto& [key, shard_axis] : axis) {
      if (!partial_over_tp(plan, key, shard_axis).value_or(false) || sums.count(key) > 0) continue;
      return invalid_argument(
          "plan: pipeline rank " + std::to_string(prog.pp_rank) + " updates " + chunk_label(key) +
          " without summing over tp its gradients that are partial on each tensor rank (" +
          (shard_axis == "tp" ? "the tensors a chunk split over tp keeps whole"
                              : "a token slice per tensor rank under "
                                "sequence parallelism") +
          "): the plan needs a tp_grad_sum all_reduce over tp before the update (ir::add_tp_grad_sums); emit the plan "
          "again with this piper");
    }
  }
  return ok_status();
}

}  // namespace

Result<PlanStats> verify_plan(const Plan& plan, int64_t capacity) {
  PlanStats stats;
  stats.peak_bytes.assign(plan.templates.size(), 0);
  PIPER_ASSIGN_OR_RETURN(PairTable pairs, match_point_to_point(plan, stats));
  PIPER_RETURN_IF_ERROR(execute_abstractly(plan, pairs, stats));
  PIPER_RETURN_IF_ERROR(check_capacity(stats, capacity));
  PIPER_RETURN_IF_ERROR(check_expert_reduction(plan));
  PIPER_RETURN_IF_ERROR(check_tp_grad_sums(plan));
  return stats;
}

}  // namespace piper::compile
