#include "piper/compile/plan_summary.h"

#include <cstdio>

#include "piper/base/units.h"

namespace piper::compile {

std::vector<TemplateSummary> summarize_plan(const Plan& plan, const PlanStats& stats) {
  std::vector<TemplateSummary> out(plan.templates.size());
  for (int t : plan.rank_template) ++out[static_cast<size_t>(t)].num_ranks;
  for (size_t i = 0; i < plan.templates.size(); ++i) {
    const Program& p = plan.templates[i];
    TemplateSummary& s = out[i];
    s.pp_rank = p.pp_rank;
    s.static_bytes = p.static_bytes;
    s.peak_bytes = i < stats.peak_bytes.size() ? stats.peak_bytes[i] : 0;
    for (const Stream& st : p.streams) {
      s.stream_instructions.emplace_back(st.name, st.instrs.size());
      for (const Instruction& in : st.instrs) {
        s.flops += in.flops;
        s.comm_bytes += in.comm_bytes;
        switch (in.op) {
          case OpKind::kCompute:
            ++s.compute;
            break;
          case OpKind::kSend:
            ++s.send;
            break;
          case OpKind::kRecv:
            ++s.recv;
            break;
          case OpKind::kCollective:
            ++s.collective;
            break;
          case OpKind::kUpdate:
            ++s.update;
            break;
          case OpKind::kAlloc:
            ++s.alloc;
            break;
          case OpKind::kFree:
            ++s.free;
            break;
          case OpKind::kRecord:
            ++s.record;
            break;
          case OpKind::kWait:
            ++s.wait;
            break;
        }
      }
    }
  }
  return out;
}

Json summary_to_json(const std::vector<TemplateSummary>& summary) {
  Json arr = Json::array();
  for (const TemplateSummary& s : summary) {
    Json streams = Json::object();
    for (const auto& [name, count] : s.stream_instructions) streams[name] = count;
    arr.push_back(Json{{"pp_rank", s.pp_rank},
                       {"num_ranks", s.num_ranks},
                       {"stream_instructions", streams},
                       {"compute", s.compute},
                       {"send", s.send},
                       {"recv", s.recv},
                       {"collective", s.collective},
                       {"update", s.update},
                       {"alloc", s.alloc},
                       {"free", s.free},
                       {"record", s.record},
                       {"wait", s.wait},
                       {"flops", s.flops},
                       {"comm_bytes", s.comm_bytes},
                       {"static_bytes", s.static_bytes},
                       {"peak_bytes", s.peak_bytes}});
  }
  return arr;
}

std::string format_summary(const std::vector<TemplateSummary>& summary) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-4s %6s %8s %6s %6s %6s %6s %11s %11s %11s  %s\n", "pp", "ranks", "compute",
                "send", "recv", "coll", "events", "model state", "peak mem", "sent", "instructions per stream");
  out += line;
  for (const TemplateSummary& s : summary) {
    std::string streams;
    for (const auto& [name, count] : s.stream_instructions) {
      streams += (streams.empty() ? "" : " ") + name + "=" + std::to_string(count);
    }
    std::snprintf(line, sizeof line, "%-4d %6d %8zu %6zu %6zu %6zu %6zu %11s %11s %11s  %s\n", s.pp_rank, s.num_ranks,
                  s.compute, s.send, s.recv, s.collective, s.record + s.wait,
                  format_bytes(static_cast<double>(s.static_bytes)).c_str(),
                  format_bytes(static_cast<double>(s.peak_bytes)).c_str(),
                  format_bytes(static_cast<double>(s.comm_bytes)).c_str(), streams.c_str());
    out += line;
  }
  return out;
}

}  // namespace piper::compile
