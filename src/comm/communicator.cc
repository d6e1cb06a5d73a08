#include "piper/comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "piper/base/strings.h"

namespace piper::comm {

const char* to_string(CommOp op) {
  switch (op) {
    case CommOp::kSend: return "send";
    case CommOp::kRecv: return "recv";
    case CommOp::kAllReduce: return "all_reduce";
    case CommOp::kReduceScatter: return "reduce_scatter";
    case CommOp::kAllGather: return "all_gather";
    case CommOp::kAllToAllV: return "all_to_all_v";
    case CommOp::kBarrier: return "barrier";
  }
  return "?";
}

Handle::Handle(CommOp op, std::string group, std::unique_ptr<PendingOp> pending)
    : op_(op), group_(std::move(group)), pending_(std::move(pending)) {}

Handle::~Handle() = default;

Handle Handle::completed(CommOp op, std::string group) {
  Handle h(op, std::move(group), nullptr);
  h.done_ = true;
  return h;
}

std::string Communicator::describe(const std::string& what) const {
  std::ostringstream os;
  os << what << " on group '" << name_ << "' (" << world_ranks_.size() << " ranks)";
  return os.str();
}

Result<bool> Communicator::test(Handle& handle) {
  if (handle.done_ || handle.pending_ == nullptr) return true;
  PIPER_ASSIGN_OR_RETURN(bool done, handle.pending_->test());
  if (done) {
    handle.done_ = true;
    handle.pending_.reset();
  }
  return done;
}

namespace {
using Clock = std::chrono::steady_clock;

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), s < 10 ? "%.2f" : "%.0f", s);
  return buf;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Polls until done or deadline. Yields first (short operations finish within microseconds), then sleeps so
// that oversubscribed ranks leave the cores to the ranks doing real work.
template <typename TestFn>
Result<bool> poll_until(TestFn&& test_fn, Clock::time_point deadline) {
  const auto start = Clock::now();
  while (true) {
    PIPER_ASSIGN_OR_RETURN(bool done, test_fn());
    if (done) return true;
    PIPER_RETURN_IF_ERROR(peer_liveness());
    auto now = Clock::now();
    if (now >= deadline) return false;
    idle_while_polling(std::chrono::duration<double>(now - start).count());
  }
}

Clock::time_point deadline_after(double timeout_s) {
  if (timeout_s > 1e8) timeout_s = 1e8;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}
}  // namespace

Result<std::unique_ptr<Heartbeat>> Communicator::start_heartbeat(const HeartbeatOptions&) {
  return std::unique_ptr<Heartbeat>();
}

Status Communicator::stalled_error(Handle& handle, double waited_s) {
  std::vector<int> missing = handle.pending_ ? handle.pending_->missing_ranks() : std::vector<int>{};
  bool exact = handle.pending_ ? handle.pending_->tracks_arrivals() : true;
  std::ostringstream os;
  os << describe(to_string(handle.op_)) << " on rank " << rank() << " timed out after " << seconds_text(waited_s)
     << " s; ";
  if (missing.empty()) {
    os << (exact ? "every rank arrived but the operation has not completed (backend stalled)"
                 : "the backend cannot tell which ranks are missing");
  } else {
    os << (exact ? "ranks that did not arrive: " : "ranks suspected of not arriving: ");
    for (size_t i = 0; i < missing.size(); ++i) {
      int r = missing[i];
      os << (i ? ", " : "") << "rank " << r;
      if (r >= 0 && r < static_cast<int>(world_ranks_.size()) && world_ranks_[r] != r) {
        os << " (world rank " << world_ranks_[r] << ")";
      }
    }
  }
  os << ". Check that every rank of the group posts this operation in the same order, or raise the timeout "
        "(PIPER_COMM_TIMEOUT_S).";
  return deadline_exceeded(os.str());
}

Status Communicator::wait(Handle& handle, double timeout_s) {
  if (handle.done_ || handle.pending_ == nullptr) return ok_status();
  const auto start = Clock::now();
  Result<bool> done = poll_until([&] { return test(handle); }, deadline_after(timeout_s));
  if (!done.ok()) {
    return done.status().with_context(describe(to_string(handle.op_)) + " on rank " + std::to_string(rank()));
  }
  if (!*done) return stalled_error(handle, seconds_since(start));
  return ok_status();
}

Status Communicator::wait_all(std::span<Handle> handles, double timeout_s) {
  const auto start = Clock::now();
  auto deadline = deadline_after(timeout_s);
  // One test per round on the first incomplete handle: a test progresses every transfer of the backend, and
  // with OpenMPI's yield_when_idle each test that finds nothing to do yields the core, so testing every
  // handle per round costs a time slice per handle on a loaded machine.
  size_t first = 0;
  auto all_done = [&]() -> Result<bool> {
    while (first < handles.size()) {
      PIPER_ASSIGN_OR_RETURN(bool done, test(handles[first]));
      if (!done) return false;
      ++first;
    }
    return true;
  };
  Result<bool> done = poll_until(all_done, deadline);
  if (!done.ok()) {
    const CommOp op = first < handles.size() ? handles[first].op_ : CommOp::kBarrier;
    return done.status().with_context(describe(to_string(op)) + " on rank " + std::to_string(rank()));
  }
  if (*done) return ok_status();
  const double waited_s = seconds_since(start);
  for (Handle& h : handles) {
    if (!h.done()) {
      PIPER_ASSIGN_OR_RETURN(bool now_done, test(h));
      if (!now_done) return stalled_error(h, waited_s);
    }
  }
  return ok_status();
}

void idle_while_polling(double waited_s) {
  if (waited_s < 100e-6) {
    std::this_thread::yield();
    return;
  }
  // Sleep ~1/16 of the time waited so far (20 us .. 1 ms): a rank waiting for a peer gives the core to the
  // ranks that have work (a HALO proxy, the TCP stack) instead of spinning in sched_yield, which on an
  // oversubscribed machine keeps a fair share of the core; the added latency stays below ~6% of the wait.
  double sleep_s = std::min(1e-3, std::max(20e-6, waited_s / 16));
  std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
}

Result<double> timeout_from_env() {
  const char* env = std::getenv("PIPER_COMM_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return 300.0;
  const std::string text(env);
  auto parsed = parse_double(text.substr(0, 40), "PIPER_COMM_TIMEOUT_S");
  if (!parsed.ok() || !(*parsed > 0 && *parsed <= 1e6)) {
    return invalid_argument("PIPER_COMM_TIMEOUT_S='" + text.substr(0, 40) + (text.size() > 40 ? "..." : "") +
                            "' must be the seconds a communication may wait, in (0, 1000000] (default 300)");
  }
  return *parsed;
}

double default_timeout_s() {
  const char* env = std::getenv("PIPER_COMM_TIMEOUT_S");
  if (env != nullptr) {
    auto parsed = parse_double(env, "PIPER_COMM_TIMEOUT_S");
    if (parsed.ok() && *parsed > 0) return *parsed;
  }
  return 300.0;
}

}  // namespace piper::comm
