#include "piper/compile/schedule_render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace piper::compile {
namespace {

// A timed action split into drawable parts: a fused BW becomes its B part and its W part.
struct Part {
  char kind;  // 'F', 'B', 'W'
  double start, end;
  const TimedAction* owner;
};

std::vector<Part> parts_of(const TimedAction& t, const UnitCosts& c) {
  switch (t.action.pass) {
    case ir::Pass::kF: return {{'F', t.start, t.end, &t}};
    case ir::Pass::kB: return {{'B', t.start, t.end, &t}};
    case ir::Pass::kW: return {{'W', t.start, t.end, &t}};
    case ir::Pass::kBW: return {{'B', t.start, t.start + c.b, &t}, {'W', t.start + c.b, t.end, &t}};
    default: return {};
  }
}

std::string part_label(const Part& p, bool with_stage) {
  return (with_stage ? std::to_string(p.owner->action.stage) : "") + std::string(1, p.kind) +
         std::to_string(p.owner->action.mb);
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

bool schedule_needs_stage_labels(const PipelineSchedule& s) {
  for (const auto& r : s.ranks) {
    if (r.stages.size() > 1) return true;
  }
  return false;
}

std::string format_action_lists(const PipelineSchedule& s) {
  bool with_stage = schedule_needs_stage_labels(s);
  std::string out;
  for (const auto& r : s.ranks) {
    out += "rank" + std::to_string(r.rank) + ":";
    for (const auto& slot : r.slots) out += " " + slot_text(slot, with_stage);
    out += "\n";
  }
  return out;
}

Result<std::string> format_timeline(const PipelineSchedule& s, const ScheduleTimeline& t, const UnitCosts& c) {
  double quantum = 0;
  for (double q : {1.0, 0.5, 0.25, 0.2, 0.1, 0.05}) {
    bool fits = true;
    for (double v : {c.f, c.b, c.w}) fits &= std::fabs(v / q - std::round(v / q)) < 1e-9;
    if (fits) {
      quantum = q;
      break;
    }
  }
  if (quantum == 0) {
    return invalid_argument("costs " + fmt(c.f) + "," + fmt(c.b) + "," + fmt(c.w) +
                            " are not multiples of 0.05; the ASCII timeline needs a common time quantum");
  }
  bool with_stage = schedule_needs_stage_labels(s);
  const auto cells = static_cast<size_t>(std::llround(t.makespan / quantum));
  size_t width = 1;
  std::vector<std::vector<std::string>> grid(t.ranks.size(), std::vector<std::string>(cells, "."));
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    for (const auto& a : t.ranks[r].actions) {
      for (const Part& p : parts_of(a, c)) {
        std::string label = part_label(p, with_stage) + (a.overlapped ? "*" : "");
        width = std::max(width, label.size());
        auto lo = static_cast<size_t>(std::llround(p.start / quantum));
        auto hi = static_cast<size_t>(std::llround(p.end / quantum));
        for (size_t k = lo; k < hi && k < cells; ++k) grid[r][k] = label;
      }
    }
  }
  std::string out = "time: one cell = " + fmt(quantum) + " (F=" + fmt(c.f) + " B=" + fmt(c.b) + " W=" + fmt(c.w) +
                    "), makespan " + fmt(t.makespan) + ", '*' = overlapped slot\n";
  for (size_t r = 0; r < grid.size(); ++r) {
    std::string line = "rank" + std::to_string(r) + " |";
    for (const auto& cell : grid[r]) line += cell + std::string(width + 1 - cell.size(), ' ');
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

Json schedule_to_json(const PipelineSchedule& s, const ScheduleTimeline& t, const UnitCosts& c) {
  bool with_stage = schedule_needs_stage_labels(s);
  Json ranks = Json::array();
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    Json actions = Json::array();
    for (const auto& slot : s.ranks[r].slots) actions.push_back(slot_text(slot, with_stage));
    Json timeline = Json::array();
    for (const auto& a : t.ranks[r].actions) {
      timeline.push_back(Json{{"action", action_text(a.action, true)}, {"start", a.start}, {"end", a.end},
                              {"overlapped", a.overlapped}});
    }
    ranks.push_back(Json{{"rank", r},
                         {"stages", s.ranks[r].stages},
                         {"actions", actions},
                         {"timeline", timeline},
                         {"busy", t.ranks[r].busy},
                         {"idle", t.makespan - t.ranks[r].busy},
                         {"peak_inflight_microbatches", t.ranks[r].peak_inflight_microbatches}});
  }
  return Json{{"pp", s.pp},
              {"num_stages", s.num_stages},
              {"microbatches", s.microbatches},
              {"costs", Json{{"F", c.f}, {"B", c.b}, {"W", c.w}}},
              {"makespan", t.makespan},
              {"total_idle", t.total_idle},
              {"bubble_fraction", t.bubble_fraction},
              {"ranks", ranks}};
}

std::string schedule_to_svg(const PipelineSchedule& s, const ScheduleTimeline& t, const UnitCosts& c,
                            const std::string& title) {
  bool with_stage = schedule_needs_stage_labels(s);
  const double unit_px = 900.0 / std::max(t.makespan, 1e-9);
  const double left = 70, top = 40, row_h = 28, bar = 4;
  const double width = left + t.makespan * unit_px + 20;
  const double height = top + static_cast<double>(t.ranks.size()) * row_h + 50;
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt(width) + "\" height=\"" + fmt(height) +
                    "\" font-family=\"monospace\" font-size=\"10\">\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += "<text x=\"" + fmt(left) + "\" y=\"20\" font-size=\"13\">" + title + " (makespan " + fmt(t.makespan) +
         ", bubble " + fmt(std::round(t.bubble_fraction * 1000) / 10) + "%)</text>\n";
  auto colour = [](char k) { return k == 'F' ? "#4e79a7" : k == 'B' ? "#59a14f" : "#f28e2b"; };
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    double y = top + static_cast<double>(r) * row_h;
    out += "<text x=\"8\" y=\"" + fmt(y + row_h * 0.6) + "\">rank " + std::to_string(r) + "</text>\n";
    for (const auto& a : t.ranks[r].actions) {
      for (const Part& p : parts_of(a, c)) {
        double x = left + p.start * unit_px, w = (p.end - p.start) * unit_px;
        out += "<rect x=\"" + fmt(x) + "\" y=\"" + fmt(y + bar) + "\" width=\"" + fmt(w) + "\" height=\"" +
               fmt(row_h - bar - 2) + "\" fill=\"" + colour(p.kind) + "\" stroke=\"white\" stroke-width=\"0.5\">" +
               "<title>" + part_label(p, true) + " [" + fmt(p.start) + ", " + fmt(p.end) + ")</title></rect>\n";
        out += "<text x=\"" + fmt(x + w / 2) + "\" y=\"" + fmt(y + row_h * 0.65) +
               "\" fill=\"white\" text-anchor=\"middle\">" +
               (with_stage ? std::to_string(a.action.stage) + ":" : "") + std::to_string(a.action.mb) + "</text>\n";
        if (a.overlapped) {
          out += "<rect x=\"" + fmt(x) + "\" y=\"" + fmt(y) + "\" width=\"" + fmt(w) + "\" height=\"" + fmt(bar - 1) +
                 "\" fill=\"#222\"/>\n";
        }
      }
    }
  }
  double ly = top + static_cast<double>(t.ranks.size()) * row_h + 20;
  const char* names[] = {"F forward", "B input grad", "W weight grad"};
  const char kinds[] = {'F', 'B', 'W'};
  for (int i = 0; i < 3; ++i) {
    double x = left + i * 130;
    out += "<rect x=\"" + fmt(x) + "\" y=\"" + fmt(ly) + "\" width=\"14\" height=\"12\" fill=\"" + colour(kinds[i]) +
           "\"/><text x=\"" + fmt(x + 18) + "\" y=\"" + fmt(ly + 10) + "\">" + names[i] + "</text>\n";
  }
  out += "<rect x=\"" + fmt(left + 390) + "\" y=\"" + fmt(ly + 4) + "\" width=\"14\" height=\"3\" fill=\"#222\"/>" +
         "<text x=\"" + fmt(left + 408) + "\" y=\"" + fmt(ly + 10) + "\">overlapped slot</text>\n";
  out += "</svg>\n";
  return out;
}

}  // namespace piper::compile
