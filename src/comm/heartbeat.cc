#include "piper/comm/heartbeat.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "piper/base/strings.h"

namespace piper::comm {
namespace {

constexpr double kMinSilenceS = 1, kMaxSilenceS = 3600;

struct Verdict {
  std::atomic<int> rank{-1};
  std::atomic<double> silent_s{0};
  std::atomic<double> threshold_s{0};
};

Verdict& verdict() {
  static Verdict v;
  return v;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

}  // namespace

Result<HeartbeatOptions> heartbeat_options_from_env() {
  HeartbeatOptions o;
  const char* env = std::getenv("PIPER_HEARTBEAT_S");
  if (env == nullptr || *env == '\0') return o;
  const std::string text(env);
  Result<double> v = parse_double(text.substr(0, 40), "PIPER_HEARTBEAT_S");
  if (!v.ok() || !(*v == 0 || (*v >= kMinSilenceS && *v <= kMaxSilenceS))) {
    return invalid_argument("PIPER_HEARTBEAT_S='" + text.substr(0, 40) + (text.size() > 40 ? "..." : "") +
                            "' must be the seconds of silence after which a rank is declared stopped, in [1, 3600], "
                            "or 0 to turn the heartbeat off (default 4)");
  }
  o.silence_s = *v;
  o.period_s = std::min(0.25, o.silence_s / 16);
  return o;
}

Status peer_liveness() {
  const Verdict& v = verdict();
  const int rank = v.rank.load(std::memory_order_acquire);
  if (rank < 0) [[likely]] return ok_status();
  return unavailable("rank " + std::to_string(rank) + " stopped responding (no heartbeat for " +
                     seconds(v.silent_s.load()) + " s; PIPER_HEARTBEAT_S=" + seconds(v.threshold_s.load()) +
                     " s): it is stopped, hung outside Piper or on a frozen node; the job cannot continue. Restart "
                     "it with --resume from the last checkpoint");
}

void report_silent_peer(int rank, double silent_s, double threshold_s) {
  Verdict& v = verdict();
  if (v.rank.load() >= 0) return;
  v.silent_s.store(silent_s);
  v.threshold_s.store(threshold_s);
  v.rank.store(rank, std::memory_order_release);
}

void clear_silent_peer() { verdict().rank.store(-1, std::memory_order_release); }

}  // namespace piper::comm
