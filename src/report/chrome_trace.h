// Chrome trace JSON (chrome://tracing, Perfetto) of a simulated step.
//
// Form: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"step_time_s": ..}}. Per simulated rank one
// process (pid = global rank, name "rank R (pp P)"), per stream of its Program one thread (tid = stream index,
// name = the stream's name: compute, p2p_fwd, ep, dp, ...). Every compute, update, send, recv and collective
// instruction is a complete event (ph "X", ts and dur in microseconds) named by its label (chunk, microbatch and
// task: "L3.attn.F.mb2"), with args {op, pass, mb, bytes}; record, wait, alloc and free take no time and are left
// out. Live memory is a counter track per rank (ph "C", name "memory", args {"GiB": live bytes / 2^30}), one sample
// per alloc/free. Needs a SimResult run with SimOptions::record_timeline.
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/compile/plan.h"
#include "piper/sim/plan_exec.h"

namespace piper::report {

// `generator` goes to otherData.generator ("piper train" writes measured timelines in the same form: spans and
// memory samples of every rank and step, step_time_s the measured mean).
Json chrome_trace(const compile::Plan& plan, const sim::SimResult& result,
                  const std::string& generator = "piper simulate");

// Writes chrome_trace() to `path`; errors name the path.
Status write_chrome_trace(const std::string& path, const compile::Plan& plan, const sim::SimResult& result,
                          const std::string& generator = "piper simulate");

}  // namespace piper::report
