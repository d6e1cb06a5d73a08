#include "piper/strategy/schedules/schedule.h"

#include <algorithm>
#include <map>

#include "piper/base/strings.h"
#include "piper/strategy/strategy.h"

namespace piper::schedules {
namespace {

int one(const ScheduleParams&) { return 1; }
int two(const ScheduleParams&) { return 2; }
int vpp(const ScheduleParams& p) { return p.vpp; }

std::map<std::string, ScheduleInfo>& registry() {
  static std::map<std::string, ScheduleInfo> r = [] {
    std::map<std::string, ScheduleInfo> m;
    auto add = [&](std::string name, std::string help, std::function<int(const ScheduleParams&)> spr, ScheduleFn fn) {
      m[name] = ScheduleInfo{name, std::move(help), std::move(spr), std::move(fn)};
    };
    add("gpipe", "all forwards, then all backwards", one, gpipe_schedule);
    add("1f1b", "one forward one backward after a warm-up of p-1-r forwards", one, one_f_one_b_schedule);
    add("interleaved", "interleaved 1F1B over vpp stages per rank", vpp, interleaved_schedule);
    add("zb-h1", "zero-bubble H1: 1F1B with split backward, weight gradients deferred", one, zb_h1_schedule);
    add("dualpipev", "DualPipeV: V-shaped two stages per rank with overlapped F&B pairs", two, dualpipev_schedule);
    add("af-pipe", "attention/FFN disaggregated pipeline with overlapped F&B", vpp, af_pipe_schedule);
    return m;
  }();
  return r;
}

Status check_params(const std::string& name, const ScheduleParams& p) {
  if (p.pp < 1) return invalid_argument("schedule " + name + ": pp=" + std::to_string(p.pp) + " must be >= 1");
  if (p.microbatches < 1) {
    return invalid_argument("schedule " + name + ": microbatches=" + std::to_string(p.microbatches) + " must be >= 1");
  }
  if (p.vpp < 1) return invalid_argument("schedule " + name + ": vpp=" + std::to_string(p.vpp) + " must be >= 1");
  return ok_status();
}

}  // namespace

std::vector<std::string> schedule_names() {
  std::vector<std::string> out;
  for (const auto& [name, info] : registry()) out.push_back(name);
  return out;
}

Result<ScheduleInfo> find_schedule(const std::string& name) {
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::string hint = closest_match(name, schedule_names());
    return invalid_argument("unknown schedule '" + name + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                            " (known: " + join(schedule_names(), ", ") + ")");
  }
  return it->second;
}

void register_schedule(ScheduleInfo info) {
  register_schedule_name(info.name);  // so that a Strategy may name it (schedule=NAME)
  registry()[info.name] = std::move(info);
}

Result<std::vector<ir::Directive>> schedule_directives(const std::string& name, const ScheduleParams& params) {
  PIPER_ASSIGN_OR_RETURN(ScheduleInfo info, find_schedule(name));
  PIPER_RETURN_IF_ERROR(check_params(name, params));
  if (params.ep_overlap && name != "1f1b" && name != "interleaved") {
    return invalid_argument("schedule " + name +
                            ": ep_overlap pairs the steady forward and backward of 1f1b or interleaved only; drop "
                            "ep_overlap or use one of those");
  }
  auto out = info.generate(params);
  if (!out.ok()) return out.status().with_context("schedule " + name);
  return out;
}

Result<int> schedule_num_stages(const std::string& name, const ScheduleParams& params) {
  PIPER_ASSIGN_OR_RETURN(ScheduleInfo info, find_schedule(name));
  PIPER_RETURN_IF_ERROR(check_params(name, params));
  return params.pp * info.stages_per_rank(params);
}

ScheduleBuilder::ScheduleBuilder(int pp) : pp_(pp), rows_(static_cast<size_t>(pp)) {}

void ScheduleBuilder::place(int stage, int rank) { placement_.emplace_back(stage, rank); }

void ScheduleBuilder::add(int rank, int stage, ir::Pass pass, int mb) {
  rows_[static_cast<size_t>(rank)].push_back({ir::stage_filter(stage, mb, pass)});
}

void ScheduleBuilder::add_overlap(int rank, std::vector<ir::TagFilter> filters) {
  rows_[static_cast<size_t>(rank)].push_back(std::move(filters));
}

std::vector<ir::Directive> ScheduleBuilder::finish() const {
  std::vector<ir::Directive> out;
  for (const auto& [stage, rank] : placement_) {
    ir::PlaceDirective d;
    d.filter.stage = ir::IntRange::single(stage);
    d.rank = rank;
    out.push_back(ir::Directive{d});
  }
  for (int r = 0; r < pp_; ++r) {
    ir::OrderDirective d;
    d.rank = r;
    d.slots = rows_[static_cast<size_t>(r)];
    out.push_back(ir::Directive{d});
  }
  return out;
}

Result<std::vector<ir::Directive>> partition_directives(int num_layers, int num_stages) {
  if (num_stages < 1 || num_layers < num_stages) {
    return invalid_argument("cannot cut " + std::to_string(num_layers) + " layers into " + std::to_string(num_stages) +
                            " pipeline stages; use at most " + std::to_string(num_layers) + " stages (pp*vpp)");
  }
  std::vector<ir::Directive> out;
  for (int s = 0; s < num_stages; ++s) {
    const auto [lo, hi] = piper::stage_layers(num_layers, num_stages, s);
    ir::PlaceDirective d;
    d.filter.layer = ir::IntRange{lo, hi - 1};
    d.stage = s;
    out.push_back(ir::Directive{d});
  }
  return out;
}

}  // namespace piper::schedules
