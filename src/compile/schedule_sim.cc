#include "piper/compile/schedule_sim.h"

#include <algorithm>
#include <map>

namespace piper::compile {
namespace {

// Chunk predecessors of a node, looking through non-chunk nodes (none in a chain graph, sends/recvs later).
std::vector<ir::NodeId> chunk_deps(const ir::Graph& g, ir::NodeId id) {
  std::vector<ir::NodeId> out, stack;
  for (int e : g.in_edges(id)) {
    const ir::Edge& ed = g.edge(e);
    if (ed.alive && ed.kind == ir::EdgeKind::kData) stack.push_back(ed.src);
  }
  while (!stack.empty()) {
    ir::NodeId n = stack.back();
    stack.pop_back();
    if (g.node(n).kind == ir::NodeKind::kChunk) {
      out.push_back(n);
      continue;
    }
    for (int e : g.in_edges(n)) {
      const ir::Edge& ed = g.edge(e);
      if (ed.alive && ed.kind == ir::EdgeKind::kData) stack.push_back(ed.src);
    }
  }
  return out;
}

}  // namespace

double action_cost(ir::Pass pass, const UnitCosts& c) {
  switch (pass) {
    case ir::Pass::kF: return c.f;
    case ir::Pass::kB: return c.b;
    case ir::Pass::kW: return c.w;
    case ir::Pass::kBW: return c.b + c.w;
    default: return 0;
  }
}

Result<ScheduleTimeline> simulate_schedule(const PipelineSchedule& s, const UnitCosts& costs) {
  const ir::Graph& g = s.graph;
  const size_t num_ranks = s.ranks.size();
  std::vector<std::vector<TimedAction>> seq(num_ranks);
  for (size_t r = 0; r < num_ranks; ++r) {
    const auto& slots = s.ranks[r].slots;
    for (size_t k = 0; k < slots.size(); ++k) {
      for (const auto& a : slots[k].actions) {
        seq[r].push_back(TimedAction{a, static_cast<int>(k), slots[k].actions.size() > 1, 0, 0});
      }
    }
  }
  std::vector<double> done(g.num_nodes(), -1);  // finish time, -1 = not yet
  std::vector<std::vector<ir::NodeId>> deps(g.num_nodes());
  for (const auto& row : seq) {
    for (const auto& t : row) deps[static_cast<size_t>(t.action.node)] = chunk_deps(g, t.action.node);
  }
  // Slots run whole: a slot starts when the rank is free and every member's dependencies outside the slot are
  // done (an overlapped pair waits for both inputs, as DualPipe's fused F&B chunk does); members then run one
  // after the other in the listed order.
  std::vector<size_t> next(num_ranks, 0);
  std::vector<double> free_at(num_ranks, 0);
  size_t remaining = 0;
  for (const auto& row : seq) remaining += row.size();
  bool progress = true;
  while (remaining > 0 && progress) {
    progress = false;
    for (size_t r = 0; r < num_ranks; ++r) {
      while (next[r] < seq[r].size()) {
        const int slot = seq[r][next[r]].slot;
        size_t end = next[r];
        while (end < seq[r].size() && seq[r][end].slot == slot) ++end;
        double ready = free_at[r];
        bool ok = true;
        for (size_t k = next[r]; k < end && ok; ++k) {
          for (ir::NodeId d : deps[static_cast<size_t>(seq[r][k].action.node)]) {
            bool inside = false;
            for (size_t q = next[r]; q < end; ++q) inside |= seq[r][q].action.node == d;
            if (inside) continue;
            double f = done[static_cast<size_t>(d)];
            if (f < 0) {
              ok = false;
              break;
            }
            ready = std::max(ready, f);
          }
        }
        if (!ok) break;
        for (size_t k = next[r]; k < end; ++k) {
          TimedAction& t = seq[r][k];
          t.start = ready;
          t.end = ready + action_cost(t.action.pass, costs);
          done[static_cast<size_t>(t.action.node)] = t.end;
          ready = t.end;
        }
        free_at[r] = ready;
        remaining -= end - next[r];
        next[r] = end;
        progress = true;
      }
    }
  }
  if (remaining > 0) {
    std::string msg = "the schedule deadlocks: no rank can make progress;";
    for (size_t r = 0; r < num_ranks; ++r) {
      if (next[r] >= seq[r].size()) continue;
      const TimedAction& t = seq[r][next[r]];
      msg += " rank " + std::to_string(r) + " waits at slot " + std::to_string(t.slot) + " (" +
             slot_text(s.ranks[r].slots[static_cast<size_t>(t.slot)], true) + ") for";
      for (const auto& a : s.ranks[r].slots[static_cast<size_t>(t.slot)].actions) {
        for (ir::NodeId d : deps[static_cast<size_t>(a.node)]) {
          bool inside = g.node(d).order_slot == t.slot && g.node(d).pp_rank == static_cast<int>(r);
          if (done[static_cast<size_t>(d)] >= 0 || inside) continue;
        const ir::Node& n = g.node(d);
        msg += " " + std::to_string(n.tags.stage) + ir::to_string(n.tags.pass) + std::to_string(n.tags.mb) +
               " on rank " + std::to_string(n.pp_rank);
        }
      }
      msg += ";";
    }
    msg.pop_back();
    return failed_precondition(msg);
  }
  ScheduleTimeline out;
  out.ranks.resize(num_ranks);
  for (size_t r = 0; r < num_ranks; ++r) {
    RankTimeline& rt = out.ranks[r];
    rt.actions = seq[r];
    std::map<std::pair<int, int>, int> live;  // (stage, mb) -> 1 while its activations are held
    int inflight = 0;
    for (const auto& t : rt.actions) {
      rt.busy += t.end - t.start;
      out.makespan = std::max(out.makespan, t.end);
      auto key = std::make_pair(t.action.stage, t.action.mb);
      if (t.action.pass == ir::Pass::kF) {
        live[key] = 1;
        rt.peak_inflight_microbatches = std::max(rt.peak_inflight_microbatches, ++inflight);
      } else if ((t.action.pass == ir::Pass::kW || t.action.pass == ir::Pass::kBW) && live.erase(key) > 0) {
        --inflight;
      }
    }
  }
  for (const auto& rt : out.ranks) out.total_idle += out.makespan - rt.busy;
  if (out.makespan > 0) out.bubble_fraction = out.total_idle / (static_cast<double>(num_ranks) * out.makespan);
  return out;
}

}  // namespace piper::compile
