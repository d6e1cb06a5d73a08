#include "piper/report/chrome_trace.h"

namespace piper::report {

Json chrome_trace(const compile::Plan& plan, const sim::SimResult& result, const std::string& generator) {
  Json events = Json::array();
  constexpr double kUs = 1e6;
  for (const sim::RankStats& r : result.ranks) {
    const compile::Program& prog = plan.program(r.rank);
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", r.rank},
                      {"args", {{"name", "rank " + std::to_string(r.rank) + " (pp " + std::to_string(r.pp_rank) + ")"}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", r.rank}, {"args", {{"sort_index", r.rank}}}});
    for (size_t s = 0; s < prog.streams.size(); ++s) {
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", r.rank},
                        {"tid", s},
                        {"args", {{"name", prog.streams[s].name}}}});
    }
    for (const sim::InstrSpan& sp : r.spans) {
      const compile::Instruction& in = prog.streams[static_cast<size_t>(sp.stream)].instrs[static_cast<size_t>(sp.instr)];
      using compile::OpKind;
      if (in.op == OpKind::kRecord || in.op == OpKind::kWait || in.op == OpKind::kAlloc || in.op == OpKind::kFree) {
        continue;
      }
      Json args = {{"op", compile::to_string(in.op)}, {"pass", ir::to_string(in.pass)}, {"mb", in.mb}};
      if (in.op == OpKind::kCompute || in.op == OpKind::kUpdate) {
        args["flops"] = in.flops;
      } else {
        args["bytes"] = in.comm_bytes;
        args["group"] = in.group;
        if (in.peer >= 0) args["peer_pp_rank"] = in.peer;
      }
      events.push_back({{"name", in.label},
                        {"cat", compile::to_string(in.op)},
                        {"ph", "X"},
                        {"pid", r.rank},
                        {"tid", sp.stream},
                        {"ts", sp.start_s * kUs},
                        {"dur", (sp.end_s - sp.start_s) * kUs},
                        {"args", args}});
    }
    for (const sim::MemorySample& m : r.memory) {
      events.push_back({{"name", "memory"},
                        {"ph", "C"},
                        {"pid", r.rank},
                        {"ts", m.time_s * kUs},
                        {"args", {{"GiB", static_cast<double>(m.live_bytes) / (1024.0 * 1024.0 * 1024.0)}}}});
    }
  }
  Json j;
  j["traceEvents"] = std::move(events);
  j["displayTimeUnit"] = "ms";
  j["otherData"] = {{"step_time_s", result.step_time_s},
                    {"representative_ranks", result.reduced},
                    {"generator", generator}};
  return j;
}

Status write_chrome_trace(const std::string& path, const compile::Plan& plan, const sim::SimResult& result,
                          const std::string& generator) {
  if (path.empty()) return invalid_argument("--trace needs a file name");
  return write_text_file(path, chrome_trace(plan, result, generator).dump());
}

}  // namespace piper::report
