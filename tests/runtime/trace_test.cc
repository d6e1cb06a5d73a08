// TraceRecorder through the executor: every instruction of the Program is recorded once per step, spans of a
// stream are ordered and disjoint, and the memory track follows the tracker (never above its peak).
#include "piper/runtime/exec/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>

#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/trainer.h"
#include "piper/spec/model_loader.h"

namespace piper::runtime::testing {
namespace {

TrainOptions options(const std::string& strategy) {
  kernels::set_kernel_threads(1);  // a shared machine: OpenMP teams on busy cores are slow
  TrainOptions o;
  o.model = load_model("tiny-moe").value();
  o.global_batch = 4;
  o.seq_len = 16;
  o.seed = 3;
  o.strategy = strategy;
  return o;
}

void expect_complete_timeline(const std::string& strategy, int steps) {
  SCOPED_TRACE(strategy);
  auto t = Trainer::create(options(strategy));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  Trainer& trainer = **t;
  const compile::Program& program = trainer.compiled().plan.program(0);
  TraceRecorder recorder(0, 0, &trainer.memory_tracker());
  trainer.executor().set_trace(&recorder);
  recorder.start();
  double total_s = 0;
  for (int i = 0; i < steps; ++i) {
    auto s = trainer.step();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    total_s += s->seconds;
  }
  trainer.executor().set_trace(nullptr);
  ASSERT_TRUE(trainer.step().ok());  // not recorded any more
  const RankTimeline& tl = recorder.timeline();
  std::map<std::pair<int, int>, int> seen;
  std::map<int, double> stream_end;
  for (const InstrSpan& s : tl.spans) {
    ASSERT_GE(s.stream, 0);
    ASSERT_LT(static_cast<size_t>(s.stream), program.streams.size());
    ASSERT_LT(static_cast<size_t>(s.instr), program.streams[static_cast<size_t>(s.stream)].instrs.size());
    EXPECT_LE(s.start_s, s.end_s);
    EXPECT_GE(s.start_s, 0.0);
    // One thread per stream: its spans come in order and do not overlap.
    EXPECT_GE(s.start_s, stream_end[s.stream]);
    stream_end[s.stream] = s.end_s;
    seen[{s.stream, s.instr}]++;
  }
  size_t instructions = 0;
  for (const compile::Stream& st : program.streams) instructions += st.instrs.size();
  EXPECT_EQ(tl.spans.size(), instructions * static_cast<size_t>(steps));
  EXPECT_EQ(seen.size(), instructions);
  for (const auto& [key, n] : seen) EXPECT_EQ(n, steps) << "stream " << key.first << " instr " << key.second;
  // The spans fit in the steps' wall time (plus the gaps between steps, which are short).
  const double last = tl.spans.back().end_s;
  EXPECT_GE(last, total_s * 0.5);
  ASSERT_FALSE(tl.memory.empty());
  int64_t max_live = 0;
  for (size_t i = 0; i < tl.memory.size(); ++i) {
    if (i > 0) {
      EXPECT_GE(tl.memory[i].time_s, tl.memory[i - 1].time_s);
      EXPECT_NE(tl.memory[i].live_bytes, tl.memory[i - 1].live_bytes);  // kept only when it changed
    }
    max_live = std::max(max_live, tl.memory[i].live_bytes);
  }
  EXPECT_LE(max_live, trainer.memory().peak_total_bytes);
  // At least the parameters, gradients and optimizer state are live throughout.
  EXPECT_GE(tl.memory.front().live_bytes, trainer.memory().peak_bytes[static_cast<int>(MemCategory::kParameters)]);
}

TEST(TraceTest, EveryInstructionOncePerStep) { expect_complete_timeline("schedule=1f1b,microbatches=2,mbs=2", 2); }

TEST(TraceTest, SplitBackwardSchedule) { expect_complete_timeline("schedule=zb-h1,microbatches=4,mbs=1", 1); }

TEST(TraceTest, StartDropsWhatWasRecorded) {
  auto t = Trainer::create(options("schedule=1f1b,microbatches=2,mbs=2"));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  TraceRecorder recorder(0, 0, nullptr);
  (*t)->executor().set_trace(&recorder);
  ASSERT_TRUE((*t)->step().ok());
  EXPECT_FALSE(recorder.timeline().spans.empty());
  EXPECT_TRUE(recorder.timeline().memory.empty());  // no tracker, no memory track
  recorder.start();
  EXPECT_TRUE(recorder.timeline().spans.empty());
  (*t)->executor().set_trace(nullptr);
}

}  // namespace
}  // namespace piper::runtime::testing
