// One timeline type for a Program's execution, simulated (sim::RankStats) or measured (runtime::RankTimeline):
// which instruction ran when, and the live memory over time. Both executors run the same Plan, so both timelines
// index the same instructions and a report (report/chrome_trace.h) draws either one.
#pragma once

#include <cstdint>

namespace piper::compile {

// One instruction's run: Program::streams[stream].instrs[instr], from start_s to end_s (seconds from step start).
struct InstrSpan {
  int stream = 0;
  int instr = 0;
  double start_s = 0;
  double end_s = 0;
};

// The rank's live device bytes at time_s (seconds from step start).
struct MemorySample {
  double time_s = 0;
  int64_t live_bytes = 0;
};

}  // namespace piper::compile
