#include "piper/compile/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <set>

#include "piper/ir/layer_chain.h"
#include "piper/ir/passes/passes.h"

namespace piper::compile {

Result<PipelineSchedule> realize_schedule(const std::vector<ir::Directive>& directives, int pp, int num_stages,
                                          int microbatches) {
  if (pp < 1 || num_stages < pp || num_stages % pp != 0) {
    return invalid_argument("a pipeline of pp=" + std::to_string(pp) + " ranks needs a multiple of pp stages, got " +
                            std::to_string(num_stages));
  }
  ir::MeshInfo mesh;
  mesh.pp = pp;
  mesh.vpp = num_stages / pp;
  ir::Graph g = ir::build_layer_chain(num_stages, mesh);
  std::vector<ir::Directive> all;
  bool has_split = std::any_of(directives.begin(), directives.end(),
                               [](const ir::Directive& d) { return std::holds_alternative<ir::SplitDirective>(d.body); });
  if (!has_split) all.push_back(ir::Directive{ir::SplitDirective{microbatches}});
  for (int s = 0; s < num_stages; ++s) {
    ir::PlaceDirective d;
    d.filter.layer = ir::IntRange::single(s);
    d.stage = s;
    all.push_back(ir::Directive{d});
  }
  const int prefix = static_cast<int>(all.size());
  all.insert(all.end(), directives.begin(), directives.end());
  // Apply one by one so that errors carry the index in the caller's list.
  for (size_t i = 0; i < all.size(); ++i) {
    int index = static_cast<int>(i) - prefix;
    Status s = ir::apply_directive(g, all[i]);
    if (!s.ok()) {
      return s.with_context(index >= 0 ? ir::directive_label(all[i], index) : std::string("schedule set-up"));
    }
  }
  PipelineSchedule out;
  out.pp = pp;
  out.num_stages = num_stages;
  out.microbatches = g.num_microbatches;
  out.ranks.resize(static_cast<size_t>(pp));
  std::vector<std::set<int>> stages(static_cast<size_t>(pp));
  std::vector<std::set<std::string>> streams(static_cast<size_t>(pp));
  std::vector<std::map<int, std::vector<const ir::Node*>>> by_slot(static_cast<size_t>(pp));
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::kChunk) continue;
    if (n.pp_rank < 0) {
      return invalid_argument("stage " + std::to_string(n.tags.stage) +
                              " is not placed on any rank; add {\"directive\": \"place\", \"filter\": {\"stage\": " +
                              std::to_string(n.tags.stage) + "}, \"rank\": R}");
    }
    if (n.order_slot < 0) {
      return invalid_argument("rank " + std::to_string(n.pp_rank) + ": " + ir::describe(n) +
                              " is not in any order row; every chunk task needs a slot");
    }
    auto r = static_cast<size_t>(n.pp_rank);
    stages[r].insert(n.tags.stage);
    streams[r].insert(n.stream);
    by_slot[r][n.order_slot].push_back(&n);
  }
  for (int r = 0; r < pp; ++r) {
    auto ri = static_cast<size_t>(r);
    if (streams[ri].size() > 1) {
      return unimplemented("rank " + std::to_string(r) + " orders compute on " + std::to_string(streams[ri].size()) +
                           " streams; the schedule view needs one compute stream per rank");
    }
    RankSchedule& rs = out.ranks[ri];
    rs.rank = r;
    rs.stages.assign(stages[ri].begin(), stages[ri].end());
    for (auto& [slot, nodes] : by_slot[ri]) {
      std::sort(nodes.begin(), nodes.end(), [](const ir::Node* a, const ir::Node* b) {
        return std::tie(a->order_filter, a->id) < std::tie(b->order_filter, b->id);
      });
      ScheduleSlot s;
      for (const ir::Node* n : nodes) s.actions.push_back(ScheduleAction{n->tags.stage, n->tags.mb, n->tags.pass, n->id});
      rs.slots.push_back(std::move(s));
    }
  }
  out.graph = std::move(g);
  return out;
}

std::string action_text(const ScheduleAction& a, bool with_stage) {
  return (with_stage ? std::to_string(a.stage) : "") + ir::to_string(a.pass) + std::to_string(a.mb);
}

std::string slot_text(const ScheduleSlot& s, bool with_stage) {
  if (s.actions.size() == 1) return action_text(s.actions[0], with_stage);
  std::string out = "(";
  for (size_t i = 0; i < s.actions.size(); ++i) out += (i ? ";" : "") + action_text(s.actions[i], with_stage);
  return out + ")";
}

}  // namespace piper::compile
