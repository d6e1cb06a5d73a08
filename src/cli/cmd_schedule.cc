// piper schedule: show a pipeline schedule per rank, from a built-in schedule or a user's directive file.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/base/files.h"
#include "piper/cli/command.h"
#include "piper/cli/flags.h"
#include "piper/compile/pipeline_schedule.h"
#include "piper/compile/schedule_render.h"
#include "piper/compile/schedule_sim.h"
#include "piper/strategy/schedules/schedule.h"

namespace piper::cli {
namespace {

// Bounds of `piper schedule` (docs/reliability.md): the action lists and the timeline hold one row per
// (rank, stage, microbatch) cell, so their product is bounded too; realising and simulating a schedule grows
// faster than the cells with pp (pp=256 x 512 microbatches, the largest allowed, takes about 30 s; pp=1024 x 128
// took minutes and pp=100000 x 100000 threw bad_alloc).
constexpr int64_t kMaxSchedulePp = 256;
constexpr int64_t kMaxScheduleMicrobatches = 65536;
constexpr int64_t kMaxVpp = 64;
constexpr int64_t kMaxScheduleCells = int64_t{1} << 18;
constexpr double kMaxUnitCost = 1e6;

struct ScheduleOptions {
  std::string schedule;
  std::string directives_file;
  int pp = 0;
  int microbatches = 0;
  int vpp = 0;  // 0: not given (the schedule's default)
  std::string costs = "1,1,1";
  std::string svg;
  std::string emit_directives;
  bool json = false;
};

Result<compile::UnitCosts> parse_costs(const std::string& text) {
  auto parts = split(text, ',');
  if (parts.size() != 3) {
    return invalid_argument("--costs '" + elide(text) + "': expected three numbers F,B,W such as 1,1,1 or 1,2,1");
  }
  double v[3];
  for (int i = 0; i < 3; ++i) {
    PIPER_ASSIGN_OR_RETURN(v[i], parse_double(trim(parts[static_cast<size_t>(i)]), "--costs"));
    if (!std::isfinite(v[i]) || v[i] < 0 || v[i] > kMaxUnitCost) {
      return invalid_argument("--costs '" + elide(text) + "': each cost must be a finite number in [0, " +
                              std::to_string(static_cast<int64_t>(kMaxUnitCost)) + "] (relative time units); e.g. 1,2,1");
    }
  }
  if (v[0] + v[1] + v[2] <= 0) {
    return invalid_argument("--costs '" + elide(text) + "': at least one cost must be positive");
  }
  return compile::UnitCosts{v[0], v[1], v[2]};
}

Status run(const ScheduleOptions& o) {
  if (o.schedule.empty() == o.directives_file.empty()) {
    return invalid_argument("give exactly one of --schedule NAME (" + join(schedules::schedule_names(), ", ") +
                            ") or --directives FILE");
  }
  const int64_t cells = static_cast<int64_t>(o.pp) * std::max(o.vpp, 2) * o.microbatches;
  if (cells > kMaxScheduleCells) {
    return invalid_argument("--pp " + std::to_string(o.pp) + " x --microbatches " + std::to_string(o.microbatches) +
                            " x stages per rank = " + std::to_string(cells) + " pipeline cells; at most " +
                            std::to_string(kMaxScheduleCells) + " (each is a row of the per-rank timeline); " +
                            "lower --pp or --microbatches");
  }
  if (!o.schedule.empty() && o.schedule == "interleaved" && o.vpp == 1) {
    return invalid_argument("--vpp 1: schedule interleaved needs --vpp >= 2 (vpp 1 is plain 1f1b); give --vpp 2 or "
                            "--schedule 1f1b");
  }
  PIPER_ASSIGN_OR_RETURN(compile::UnitCosts costs, parse_costs(o.costs));
  std::vector<ir::Directive> directives;
  int num_stages = 0;
  std::string title;
  if (!o.schedule.empty()) {
    PIPER_ASSIGN_OR_RETURN(schedules::ScheduleInfo info, schedules::find_schedule(o.schedule));
    schedules::ScheduleParams params{o.pp, o.microbatches, o.vpp > 0 ? o.vpp : 1};
    if (o.vpp == 0 && (o.schedule == "interleaved" || o.schedule == "af-pipe")) params.vpp = 2;
    int per_rank = info.stages_per_rank(params);
    if (o.vpp > 0 && per_rank != o.vpp) {
      return invalid_argument("--vpp " + std::to_string(o.vpp) + ": schedule " + o.schedule + " uses " +
                              std::to_string(per_rank) + " stage(s) per rank; drop --vpp");
    }
    PIPER_ASSIGN_OR_RETURN(directives, schedules::schedule_directives(o.schedule, params));
    num_stages = o.pp * per_rank;
    title = o.schedule;
  } else {
    PIPER_ASSIGN_OR_RETURN(directives, ir::load_directives_file(o.directives_file));
    num_stages = o.pp * (o.vpp > 0 ? o.vpp : 1);
    title = o.directives_file;
  }
  PIPER_ASSIGN_OR_RETURN(compile::PipelineSchedule sched,
                         compile::realize_schedule(directives, o.pp, num_stages, o.microbatches));
  PIPER_ASSIGN_OR_RETURN(compile::ScheduleTimeline timeline, compile::simulate_schedule(sched, costs));
  // Output files are written once the schedule is realised and simulated: a failure leaves none behind.
  if (!o.emit_directives.empty()) {
    PIPER_RETURN_IF_ERROR(write_text_file(o.emit_directives, ir::directives_to_json(directives).dump(1) + "\n"));
  }
  if (!o.svg.empty()) {
    PIPER_RETURN_IF_ERROR(write_text_file(o.svg, compile::schedule_to_svg(sched, timeline, costs, title)));
  }
  if (o.json) {
    Json j = compile::schedule_to_json(sched, timeline, costs);
    j["schedule"] = title;
    print_json(j.dump());
    return ok_status();
  }
  std::printf("schedule %s: pp=%d microbatches=%d stages=%d\n\n", title.c_str(), o.pp, sched.microbatches,
              num_stages);
  std::printf("%s\n", compile::format_action_lists(sched).c_str());
  auto text = compile::format_timeline(sched, timeline, costs);
  if (text.ok()) {
    std::printf("%s\n", text->c_str());
  } else {
    std::printf("(no ASCII timeline: %s)\n\n", text.status().message().c_str());
  }
  std::printf("makespan %g, bubble fraction %.4f (idle %g of %g rank-time)\npeak in-flight microbatches per rank:",
              timeline.makespan, timeline.bubble_fraction, timeline.total_idle,
              timeline.makespan * static_cast<double>(o.pp));
  for (const auto& r : timeline.ranks) std::printf(" %d", r.peak_inflight_microbatches);
  std::printf("\n");
  if (!o.svg.empty()) std::printf("wrote %s\n", o.svg.c_str());
  return ok_status();
}

PIPER_REGISTER_COMMAND(g_schedule, "schedule", "Show a pipeline schedule per rank (action lists, timeline, bubble)",
                       [](CLI::App* sub) {
                         auto o = std::make_shared<ScheduleOptions>();
                         sub->add_option("--schedule", o->schedule,
                                         "gpipe|1f1b|interleaved|zb-h1|dualpipev|af-pipe");
                         sub->add_option("--directives", o->directives_file,
                                         "a JSON directive file (place + order) instead of --schedule");
                         add_int_option(sub, "--pp", &o->pp, {1, kMaxSchedulePp, "pipeline ranks"}, "pipeline ranks")
                             ->required();
                         add_int_option(sub, "--microbatches", &o->microbatches,
                                        {1, kMaxScheduleMicrobatches, "microbatches per step"},
                                        "microbatches per step")
                             ->required();
                         add_int_option(sub, "--vpp", &o->vpp, {1, kMaxVpp, "stages per rank"},
                                        "stages per rank (interleaved, af-pipe: default 2)");
                         sub->add_option("--costs", o->costs, "unit costs F,B,W (a fused backward costs B+W)")
                             ->capture_default_str();
                         sub->add_option("--svg", o->svg, "write the pipeline picture to this SVG file");
                         sub->add_option("--emit-directives", o->emit_directives,
                                         "write the schedule's directives to this JSON file");
                         sub->add_flag("--json", o->json, "print one JSON object");
                         return std::function<Status()>([o] { return run(*o); });
                       });

}  // namespace
}  // namespace piper::cli
