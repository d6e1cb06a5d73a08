#include "piper/cli/plan_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "piper/base/files.h"
#include "piper/base/strings.h"
#include "piper/base/units.h"

namespace piper::cli {
namespace {

struct Series {
  const char* key;    // the field in the plan's JSON
  const char* label;  // the legend's text
  const char* color;  // Tableau 10, distinguishable in colour and in grey
};

// estimate.time: the closed form's step time terms (cost/estimate.h Estimate::time).
const Series kTimeSeries[] = {{"compute", "compute", "#4e79a7"},
                              {"exposed_comm", "exposed communication", "#f28e2b"},
                              {"bubble", "pipeline bubble", "#e15759"},
                              {"optimizer", "optimizer", "#76b7b2"}};
// estimate.ranks[i]: memory of pipeline rank i (cost/estimate.h MemoryBreakdown).
const Series kMemorySeries[] = {{"params", "parameters", "#4e79a7"},
                                {"grads", "gradients", "#59a14f"},
                                {"optimizer", "optimizer state", "#edc948"},
                                {"activations", "activations", "#e15759"},
                                {"buffers", "buffers", "#b07aa1"}};

constexpr double kWidth = 960;
constexpr double kMemWidth = 470, kMemHeight = 280;

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

double get(const Json& j, const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0; }

std::string rect(double x, double y, double w, double h, const char* color, const std::string& title) {
  return "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(0.0, w)) + "\" height=\"" +
         num(std::max(0.0, h)) + "\" fill=\"" + color + "\"><title>" + esc(title) + "</title></rect>\n";
}

std::string text(double x, double y, const std::string& s, const char* anchor = "start", int size = 12) {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" font-size=\"" + std::to_string(size) + "\" text-anchor=\"" +
         anchor + "\">" + esc(s) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const char* color, const char* dash = "") {
  return "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) + "\" stroke=\"" +
         color + "\" stroke-width=\"1.5\"" + (*dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : "") + "/>\n";
}

template <size_t N>
std::string legend(const Series (&series)[N], double x, double y) {
  std::string out;
  for (const Series& s : series) {
    out += rect(x, y - 10, 12, 12, s.color, s.label) + text(x + 16, y, s.label);
    x += 24 + 7.0 * static_cast<double>(std::string(s.label).size());
  }
  return out;
}

std::string svg_open(double w, double h, double x = 0, double y = 0) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) +
         "\" height=\"" + num(h) + "\" viewBox=\"0 0 " + num(w) + " " + num(h) + "\" font-family=\"sans-serif\">\n";
}

std::vector<Json> charted(const Json& plan, int max_plans) {
  std::vector<Json> out;
  for (const Json& p : plan["plans"]) {
    if (static_cast<int>(out.size()) >= max_plans) break;
    out.push_back(p);
  }
  return out;
}

// Stacked horizontal bars: one per plan, the closed form's terms, and the simulated step time as a black tick.
std::string breakdown_chart(const std::vector<Json>& plans, double* height) {
  const double left = 60, right = 30, top = 50, row = 30, plot_w = kWidth - left - right;
  double max_s = 0;
  for (const Json& p : plans) {
    double sum = 0;
    for (const Series& s : kTimeSeries) sum += get(p["estimate"]["time"], s.key);
    max_s = std::max({max_s, sum, get(p, "simulated_step_time_s")});
  }
  max_s = max_s > 0 ? max_s * 1.05 : 1;
  *height = top + row * static_cast<double>(plans.size()) + 50;
  std::string out = svg_open(kWidth, *height);
  out += text(left, 18, "Step time per plan (closed form terms; black tick: simulated step)", "start", 14);
  out += legend(kTimeSeries, left, 38);
  const double axis_y = top + row * static_cast<double>(plans.size());
  for (int k = 0; k <= 5; ++k) {
    const double x = left + plot_w * k / 5;
    out += line(x, top - 4, x, axis_y, "#dddddd") + text(x, axis_y + 16, format_seconds(max_s * k / 5), "middle", 11);
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    const Json& p = plans[i];
    const double y = top + row * static_cast<double>(i) + 5;
    out += text(left - 8, y + 15, "#" + std::to_string(i + 1), "end");
    double x = left;
    for (const Series& s : kTimeSeries) {
      const double v = get(p["estimate"]["time"], s.key), w = plot_w * v / max_s;
      out += rect(x, y, w, row - 10, s.color,
                  "#" + std::to_string(i + 1) + " " + s.label + ": " + format_seconds(v) + " (" +
                      p["strategy"].get<std::string>() + ")");
      x += w;
    }
    if (p["simulated"].get<bool>()) {
      const double sx = left + plot_w * get(p, "simulated_step_time_s") / max_s;
      out += line(sx, y - 3, sx, y + row - 7, "#000000") + "<title>simulated step " +
             esc(format_seconds(get(p, "simulated_step_time_s"))) + "</title>\n";
    }
  }
  out += text(left + plot_w / 2, axis_y + 34, "seconds per optimizer step", "middle", 11);
  return out + "</svg>\n";
}

// Stacked bars of one plan's memory per pipeline rank, against the device's memory and the usable share.
std::string memory_chart(const Json& p, int index, double memory_fraction, double x0, double y0) {
  const double left = 70, right = 12, top = 54, bottom = 36;
  const double plot_w = kMemWidth - left - right, plot_h = kMemHeight - top - bottom;
  const Json& ranks = p["estimate"]["ranks"];
  const double device = get(p, "device_memory_bytes");
  double max_b = device;
  for (const Json& r : ranks) max_b = std::max(max_b, get(r, "total"));
  max_b = max_b > 0 ? max_b * 1.05 : 1;
  std::string out = svg_open(kMemWidth, kMemHeight, x0, y0);
  out += text(left, 16, "#" + std::to_string(index) + " memory per pipeline rank", "start", 13);
  // The strategy on two lines, cut at a comma (the table has it on one).
  const std::string strategy = p["strategy"].get<std::string>();
  const size_t cut = strategy.size() > 72 ? strategy.rfind(',', 72) : std::string::npos;
  out += text(left, 28, strategy.substr(0, cut == std::string::npos ? strategy.size() : cut + 1), "start", 9);
  if (cut != std::string::npos) out += text(left, 39, strategy.substr(cut + 1), "start", 9);
  const double base = top + plot_h;
  for (int k = 0; k <= 4; ++k) {
    const double y = base - plot_h * k / 4;
    out += line(left, y, left + plot_w, y, "#eeeeee") + text(left - 6, y + 4, format_bytes(max_b * k / 4), "end", 10);
  }
  const double slot = plot_w / static_cast<double>(std::max<size_t>(1, ranks.size()));
  for (size_t r = 0; r < ranks.size(); ++r) {
    double y = base;
    for (const Series& s : kMemorySeries) {
      const double v = get(ranks[r], s.key), h = plot_h * v / max_b;
      out += rect(left + slot * static_cast<double>(r) + slot * 0.15, y - h, slot * 0.7, h, s.color,
                  "pp rank " + std::to_string(r) + " " + s.label + ": " + format_bytes(v));
      y -= h;
    }
    if (ranks.size() <= 16)
      out += text(left + slot * (static_cast<double>(r) + 0.5), base + 14, std::to_string(r), "middle", 10);
  }
  out += text(left + plot_w / 2, base + 30, "pipeline rank", "middle", 10);
  const double dy = base - plot_h * device / max_b, uy = base - plot_h * device * memory_fraction / max_b;
  out += line(left, dy, left + plot_w, dy, "#555555") +
         text(left + plot_w, dy - 3, "device " + format_bytes(device), "end", 10);
  out += line(left, uy, left + plot_w, uy, "#d62728", "5,3");
  return out + "</svg>\n";
}

std::string memory_legend_svg(double memory_fraction) {
  std::string out = svg_open(kWidth, 28);
  out += legend(kMemorySeries, 10, 18);
  out += line(760, 14, 790, 14, "#d62728", "5,3") + text(796, 18, num(100 * memory_fraction) + " % usable");
  return out + "</svg>\n";
}

std::string summary_line(const Json& plan) {
  const Json& s = plan["search"];
  return plan["model"].get<std::string>() + " on " + plan["cluster"].get<std::string>() + " x " +
         std::to_string(plan["nodes"].get<int>()) + " nodes (" + std::to_string(plan["world_size"].get<int>()) +
         " devices), seq " + std::to_string(plan["seq_len"].get<int64_t>()) + ", global batch " +
         std::to_string(plan["global_batch"].get<int64_t>()) + ", " + plan["precision"].get<std::string>() + "; " +
         std::to_string(s["considered"].get<int64_t>()) + " strategies considered, " +
         std::to_string(s["scored"].get<int64_t>()) + " scored, " + std::to_string(s["fitting"].get<int64_t>()) +
         " fit, " + std::to_string(plan["simulated"].get<int64_t>()) + " simulated";
}

std::string table_html(const Json& plan) {
  std::string out =
      "<table>\n<tr><th>#</th><th>simulated step</th><th>step (closed form)</th><th>MFU</th><th>tokens/s</th>"
      "<th>peak memory</th><th>verified</th><th>strategy</th></tr>\n";
  int i = 0;
  for (const Json& p : plan["plans"]) {
    out += "<tr><td>" + std::to_string(++i) + "</td><td>" +
           (p["simulated"].get<bool>() ? esc(format_seconds(get(p, "simulated_step_time_s"))) : "-") + "</td><td>" +
           esc(format_seconds(get(p, "step_time_s"))) + "</td><td>" + num(100 * get(p, "mfu")) + " %</td><td>" +
           esc(format_count(get(p, "tokens_per_s"))) + "</td><td>" + esc(format_bytes(get(p, "peak_memory_bytes"))) +
           "</td><td>" + (p["verified"].get<bool>() ? "yes" : "no") + "</td><td><code>" +
           esc(p["strategy"].get<std::string>()) + "</code></td></tr>\n";
  }
  return out + "</table>\n";
}

const char* kStyle =
    "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "td:last-child{text-align:left;max-width:420px;overflow-wrap:anywhere;font-size:12px}"
    "svg{display:inline-block;vertical-align:top}h2{margin-top:28px}";

}  // namespace

std::string plan_report_html(const Json& plan, double memory_fraction, int max_plans) {
  const std::vector<Json> plans = charted(plan, max_plans);
  std::string out = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>piper plan: " +
                    esc(plan["model"].get<std::string>()) + "</title><style>" + kStyle + "</style></head><body>\n";
  out += "<h1>piper plan: " + esc(plan["model"].get<std::string>()) + "</h1>\n<p>" + esc(summary_line(plan)) + "</p>\n";
  if (plans.empty()) return out + "<p>No plan fits (see `piper plan` for the closest one).</p></body></html>\n";
  out += "<h2>Top plans</h2>\n" + table_html(plan);
  double h = 0;
  out += "<h2>Step-time breakdown</h2>\n" + breakdown_chart(plans, &h);
  out += "<h2>Memory per pipeline rank</h2>\n" + memory_legend_svg(memory_fraction) + "<div>\n";
  for (size_t i = 0; i < plans.size(); ++i)
    out += memory_chart(plans[i], static_cast<int>(i) + 1, memory_fraction, 0, 0);
  if (plan["plans"].size() > plans.size()) {
    out += "<p>Charts show the first " + std::to_string(plans.size()) + " of " + std::to_string(plan["plans"].size()) +
           " plans.</p>\n";
  }
  return out + "</div>\n</body></html>\n";
}

std::string plan_report_svg(const Json& plan, double memory_fraction, int max_plans) {
  const std::vector<Json> plans = charted(plan, max_plans);
  double h = 0;
  const std::string breakdown = plans.empty() ? "" : breakdown_chart(plans, &h);
  const double rows = static_cast<double>((plans.size() + 1) / 2);
  const double total = 60 + h + 30 + rows * kMemHeight;
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg_open(kWidth, total);
  out += "<rect x=\"0\" y=\"0\" width=\"" + num(kWidth) + "\" height=\"" + num(total) + "\" fill=\"#ffffff\"/>\n";
  out += text(10, 22, "piper plan: " + summary_line(plan), "start", 12);
  if (plans.empty()) return out + text(10, 44, "No plan fits.") + "</svg>\n";
  out += "<g transform=\"translate(0,40)\">\n" + breakdown + "</g>\n";
  out += "<g transform=\"translate(0," + num(40 + h) + ")\">\n" + memory_legend_svg(memory_fraction) + "</g>\n";
  for (size_t i = 0; i < plans.size(); ++i) {
    out += memory_chart(plans[i], static_cast<int>(i) + 1, memory_fraction, kMemWidth * static_cast<double>(i % 2),
                        70 + h + kMemHeight * static_cast<double>(i / 2));
  }
  return out + "</svg>\n";
}

Status check_plan_report_path(const std::string& path) {
  const std::string lower = to_lower(path);
  if (!ends_with(lower, ".html") && !ends_with(lower, ".htm") && !ends_with(lower, ".svg")) {
    return invalid_argument("--report " + elide(path) +
                            ": the report is HTML (FILE.html) or SVG (FILE.svg); name the file with one of those "
                            "extensions");
  }
  // Checked before a search that may take minutes, not found missing after it.
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir)) {
    return invalid_argument("--report " + elide(path) + ": directory '" + elide(dir.string()) +
                            "' does not exist; create it or write the report elsewhere");
  }
  return ok_status();
}

Status write_plan_report(const std::string& path, const Json& plan, double memory_fraction) {
  PIPER_RETURN_IF_ERROR(check_plan_report_path(path));
  const bool svg = ends_with(to_lower(path), ".svg");
  return write_file_atomic(path,
                           svg ? plan_report_svg(plan, memory_fraction) : plan_report_html(plan, memory_fraction));
}

}  // namespace piper::cli
