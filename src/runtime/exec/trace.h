// The measured timeline of a training run: when each instruction of this rank's Program ran, on which stream,
// and the rank's live memory over time. `piper train --trace FILE` records it on every rank, gathers it to rank 0
// (gather_timelines) and writes it with the simulator's Chrome-trace writer (src/report/chrome_trace.h), so the
// measured and the simulated step open side by side in Perfetto.
//
// - TraceRecorder: the executor calls record() once per executed instruction (Executor::set_trace), from the
//   stream's own thread; times are seconds since start(). Record, wait, alloc and free instructions are recorded
//   too (the writer leaves out the zero-time kinds; a wait's span is the time the stream was blocked).
//   After each instruction the recorder samples the tracker's live bytes (every tensor of the rank: parameters,
//   gradients, optimizer state, activations, buffers) and keeps a sample when the value changed.
//   Thread-safety: record() may be called from many threads at once; timeline() only while no step runs.
// - Clock: std::chrono::steady_clock. Ranks align their origins by calling start() right after a barrier, so
//   spans of different ranks are comparable to within the barrier's skew (microseconds on one machine).
// - gather_timelines: collective over `world`; rank 0 receives every rank's timeline (ascending rank), the
//   others an empty vector. Errors: communication failures or a timeout, naming the rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"
#include "piper/compile/timeline.h"
#include "piper/tensor/memory.h"

namespace piper::runtime {

using compile::InstrSpan;  // compile/timeline.h: the simulated timeline's type too
using compile::MemorySample;

// One rank's measured timeline (spans in completion order, memory samples in time order).
struct RankTimeline {
  int rank = 0;
  int pp_rank = 0;
  std::vector<InstrSpan> spans;
  std::vector<MemorySample> memory;
};

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // `tracker` (may be null: no memory track) must outlive the recorder.
  TraceRecorder(int rank, int pp_rank, const MemoryTracker* tracker);

  // Sets the time origin to now and drops what was recorded.
  void start();
  void record(int stream, int instr, Clock::time_point begin, Clock::time_point end);
  // Seconds since start() of `t`.
  double seconds(Clock::time_point t) const { return std::chrono::duration<double>(t - origin_).count(); }
  const RankTimeline& timeline() const { return timeline_; }

 private:
  std::mutex mu_;
  Clock::time_point origin_;
  const MemoryTracker* tracker_;
  int64_t last_live_bytes_ = -1;
  RankTimeline timeline_;
};

// Rank 0 gets every rank's timeline; `timeout_s` bounds each wait. Collective over `world`.
Result<std::vector<RankTimeline>> gather_timelines(comm::Communicator& world, const RankTimeline& mine,
                                                   double timeout_s);

}  // namespace piper::runtime
