#include "piper/base/fault.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "piper/base/check.h"
#include "piper/base/strings.h"

namespace piper {
namespace {

constexpr const char* kFormat = "PIPER_FAULT=POINT:RANK:STEP[:ACTION], e.g. pp_send:1:3:kill";

std::string point_list() {
  std::string s;
  for (const char* p : kFaultPoints) s += (s.empty() ? "" : ", ") + std::string(p);
  return s;
}

// Long values are cut in messages (a spec is a few words; anything longer is not one).
std::string elide(std::string_view v) {
  return v.size() <= 40 ? std::string(v) : std::string(v.substr(0, 40)) + "...";
}

bool known_point(std::string_view p) {
  for (const char* k : kFaultPoints) {
    if (p == k) return true;
  }
  return false;
}

struct Armed {
  std::atomic<bool> on{false};
  std::atomic<bool> fired{false};
  std::atomic<int64_t> step{0};
  FaultSpec spec;
};

Armed& armed() {
  static Armed a;
  return a;
}

}  // namespace

Result<FaultSpec> parse_fault_spec(std::string_view text) {
  std::vector<std::string> f = split(text, ':');
  if (f.size() < 3 || f.size() > 4) {
    return invalid_argument("PIPER_FAULT '" + elide(text) + "' has " + std::to_string(f.size()) +
                            " field(s); expected " + kFormat);
  }
  FaultSpec s;
  s.point = f[0];
  if (!known_point(s.point)) {
    return invalid_argument("PIPER_FAULT: unknown point '" + elide(s.point) + "'; pick one of " + point_list() +
                            " (" + kFormat + ")");
  }
  Result<int64_t> rank = parse_int(f[1], "PIPER_FAULT rank");
  if (!rank.ok() || *rank < 0 || *rank > 1'000'000) {
    return invalid_argument("PIPER_FAULT: rank '" + elide(f[1]) + "' must be a world rank in [0, 1000000] (" +
                            kFormat + ")");
  }
  s.rank = static_cast<int>(*rank);
  Result<int64_t> step = parse_int(f[2], "PIPER_FAULT step");
  if (!step.ok() || *step < 1) {
    return invalid_argument("PIPER_FAULT: step '" + elide(f[2]) + "' must be a training step >= 1 (" + kFormat + ")");
  }
  s.step = *step;
  if (f.size() == 4) {
    if (f[3] == "kill") {
      s.action = FaultAction::kKill;
    } else if (f[3] == "stop") {
      s.action = FaultAction::kStop;
    } else {
      return invalid_argument("PIPER_FAULT: action '" + elide(f[3]) + "' must be kill (SIGKILL) or stop (SIGSTOP) (" +
                              kFormat + ")");
    }
  }
  return s;
}

Status init_fault_injection() {
  static std::once_flag once;
  static Status result;
  std::call_once(once, [] {
    const char* env = std::getenv("PIPER_FAULT");
    if (env == nullptr || *env == '\0') return;
    Result<FaultSpec> spec = parse_fault_spec(env);
    if (!spec.ok()) {
      result = spec.status();
      return;
    }
    armed().spec = *spec;
    armed().on.store(true, std::memory_order_release);
  });
  return result;
}

void set_fault_step(int64_t step) { armed().step.store(step, std::memory_order_relaxed); }

void fault_point(const char* point) {
  Armed& a = armed();
  if (!a.on.load(std::memory_order_acquire)) [[likely]] return;
  if (a.spec.rank != process_rank() || a.spec.step != a.step.load(std::memory_order_relaxed) ||
      std::strcmp(point, a.spec.point.c_str()) != 0) {
    return;
  }
  if (a.fired.exchange(true)) return;
  const bool stop = a.spec.action == FaultAction::kStop;
  std::fprintf(stderr, "piper: fault injection: rank %d %s itself at %s in step %lld (PIPER_FAULT)\n", a.spec.rank,
               stop ? "stops (SIGSTOP)" : "kills (SIGKILL)", point, static_cast<long long>(a.spec.step));
  std::fflush(stderr);
  raise(stop ? SIGSTOP : SIGKILL);
}

}  // namespace piper
