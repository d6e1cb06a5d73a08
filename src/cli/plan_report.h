// `piper plan --report FILE.html|FILE.svg`: the plans of a search as charts a browser shows without Python or
// any file besides this one (inline SVG, no scripts, fonts or links). Drawn from the JSON object `piper plan
// --json` prints (command_json.h plan_json), so the report and the JSON never disagree:
//   - a table of the top plans (strategy, simulated and closed-form step time, MFU, tokens/s, peak memory);
//   - the step-time breakdown of each plan (compute, exposed communication, pipeline bubble, optimizer; the
//     closed form's terms) as stacked horizontal bars, with the simulated step time marked where there is one;
//   - memory per pipeline rank (parameters, gradients, optimizer state, activations, buffers) as stacked bars,
//     one chart per plan, against the device's memory and the share a plan may use.
// The .svg form holds the same charts in one SVG document (the table as text rows).
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"

namespace piper::cli {

// The report of `plan` (plan_json's object) as an HTML page. `memory_fraction` draws the usable-memory line.
// At most `max_plans` plans are charted (the table lists all of them).
std::string plan_report_html(const Json& plan, double memory_fraction, int max_plans = 8);
// The same charts as one standalone SVG document.
std::string plan_report_svg(const Json& plan, double memory_fraction, int max_plans = 8);

// Writes the report to `path`: HTML for *.html / *.htm, SVG for *.svg; any other extension is an error naming them.
Status write_plan_report(const std::string& path, const Json& plan, double memory_fraction);
// The extension check alone (before a search that may take minutes).
Status check_plan_report_path(const std::string& path);

}  // namespace piper::cli
