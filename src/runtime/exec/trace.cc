#include "piper/runtime/exec/trace.h"

#include <algorithm>
#include <string>

namespace piper::runtime {

TraceRecorder::TraceRecorder(int rank, int pp_rank, const MemoryTracker* tracker) : tracker_(tracker) {
  timeline_.rank = rank;
  timeline_.pp_rank = pp_rank;
  origin_ = Clock::now();
}

void TraceRecorder::start() {
  std::lock_guard<std::mutex> lock(mu_);
  timeline_.spans.clear();
  timeline_.memory.clear();
  last_live_bytes_ = -1;
  origin_ = Clock::now();
}

void TraceRecorder::record(int stream, int instr, Clock::time_point begin, Clock::time_point end) {
  std::lock_guard<std::mutex> lock(mu_);
  timeline_.spans.push_back(InstrSpan{stream, instr, seconds(begin), seconds(end)});
  if (tracker_ == nullptr) return;
  // Sampled under the lock so that samples stay in time order when several streams finish at once.
  const int64_t live = tracker_->stats().live_total_bytes;
  if (live == last_live_bytes_) return;
  const double t = timeline_.memory.empty() ? seconds(end) : std::max(seconds(end), timeline_.memory.back().time_s);
  timeline_.memory.push_back(MemorySample{t, live});
  last_live_bytes_ = live;
}

namespace {

// Wire form of a timeline, in doubles (exact for the integers involved, all < 2^53):
// [rank, pp_rank, num_spans, num_samples, (stream, instr, start, end) x spans, (time, bytes) x samples].
std::vector<double> pack(const RankTimeline& t) {
  std::vector<double> out = {static_cast<double>(t.rank), static_cast<double>(t.pp_rank),
                             static_cast<double>(t.spans.size()), static_cast<double>(t.memory.size())};
  out.reserve(4 + 4 * t.spans.size() + 2 * t.memory.size());
  for (const InstrSpan& s : t.spans) {
    out.insert(out.end(), {static_cast<double>(s.stream), static_cast<double>(s.instr), s.start_s, s.end_s});
  }
  for (const MemorySample& m : t.memory) out.insert(out.end(), {m.time_s, static_cast<double>(m.live_bytes)});
  return out;
}

Result<RankTimeline> unpack(const std::vector<double>& v, int from) {
  const std::string what = "trace of rank " + std::to_string(from);
  if (v.size() < 4) return internal_error(what + ": truncated header");
  RankTimeline t;
  t.rank = static_cast<int>(v[0]);
  t.pp_rank = static_cast<int>(v[1]);
  const size_t spans = static_cast<size_t>(v[2]), samples = static_cast<size_t>(v[3]);
  if (v.size() != 4 + 4 * spans + 2 * samples) return internal_error(what + ": size does not match its header");
  size_t k = 4;
  for (size_t i = 0; i < spans; ++i, k += 4) {
    t.spans.push_back(InstrSpan{static_cast<int>(v[k]), static_cast<int>(v[k + 1]), v[k + 2], v[k + 3]});
  }
  for (size_t i = 0; i < samples; ++i, k += 2) {
    t.memory.push_back(MemorySample{v[k], static_cast<int64_t>(v[k + 1])});
  }
  return t;
}

constexpr int kTraceTag = 7301;

}  // namespace

Result<std::vector<RankTimeline>> gather_timelines(comm::Communicator& world, const RankTimeline& mine,
                                                   double timeout_s) {
  const std::vector<double> packed = pack(mine);
  const int n = world.size();
  const int64_t my_count = static_cast<int64_t>(packed.size());
  std::vector<int64_t> counts(static_cast<size_t>(n), 0);
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, world.all_gather(&my_count, counts.data(), sizeof(int64_t)));
  PIPER_RETURN_IF_ERROR(world.wait(h, timeout_s));
  std::vector<RankTimeline> out;
  if (world.rank() != 0) {
    PIPER_ASSIGN_OR_RETURN(comm::Handle s, world.isend(packed.data(), packed.size() * sizeof(double), 0, kTraceTag));
    PIPER_RETURN_IF_ERROR(world.wait(s, timeout_s));
    return out;
  }
  out.push_back(mine);
  for (int r = 1; r < n; ++r) {
    std::vector<double> buf(static_cast<size_t>(counts[static_cast<size_t>(r)]));
    PIPER_ASSIGN_OR_RETURN(comm::Handle rh, world.irecv(buf.data(), buf.size() * sizeof(double), r, kTraceTag));
    PIPER_RETURN_IF_ERROR(world.wait(rh, timeout_s));
    PIPER_ASSIGN_OR_RETURN(RankTimeline t, unpack(buf, r));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace piper::runtime
