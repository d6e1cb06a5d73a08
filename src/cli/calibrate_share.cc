#include "piper/cli/calibrate_share.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <thread>

#include "piper/base/clock.h"
#include "piper/comm/launch.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/kernels/cpu/ops.h"

namespace piper::cli {
namespace {

constexpr int64_t kShareGemmDim = 128;      // the GEMM's rows: a microbatch's tokens of a small model
constexpr int64_t kShareGemmWidth = 512;    // n = k, as cmd_calibrate.cc's curve
constexpr size_t kTriadFloats = 16u << 20;  // 3 x 64 MiB, far beyond the 32 MiB L3 of the build machine
constexpr double kStreamOffset = 1.25;      // the triad's window starts 0.25 windows after the GEMM's ends
constexpr double kStartLead_s = 0.05;       // from every worker ready to the window's start: time to see it

// Runs `fn` from wall time `from_s` until `to_s` (the call in progress then completes).
ShareSample run_window(const std::function<void()>& fn, double from_s, double to_s) {
  while (wall_s() < from_s) std::this_thread::sleep_for(std::chrono::microseconds(200));
  ShareSample s;
  const double cpu0 = process_cpu_s(), wall0 = wall_s();
  double now = wall0;
  while (now < to_s) {
    fn();
    ++s.calls;
    now = wall_s();
  }
  s.cpu_s = process_cpu_s() - cpu0;
  s.wall_s = now - wall0;
  return s;
}

// Waits until `path` exists (polling every millisecond) or `timeout_s` has passed; whether it exists.
bool wait_for_file(const std::string& path, double timeout_s) {
  const double until = wall_s() + timeout_s;
  while (!std::filesystem::exists(path)) {
    if (wall_s() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

std::string shell_quote(const std::string& word) {
  std::string out = "'";
  for (char ch : word) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

Result<std::vector<std::string>> run_share_workers(int n, const std::function<std::string(const std::string&)>& args,
                                                   double ready_timeout_s) {
  PIPER_ASSIGN_OR_RETURN(const std::string self, comm::self_executable());
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("piper_calibrate_share_" + std::to_string(::getpid()) + "_" + std::to_string(n));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) return unavailable("calibrate: cannot create " + dir.string() + " for the sharing workers: " + ec.message());
  std::vector<FILE*> pipes;
  for (int i = 0; i < n; ++i) {
    const std::string cmd = shell_quote(self) + " calibrate " + args((dir / std::to_string(i)).string()) + " 2>&1";
    FILE* f = popen(cmd.c_str(), "r");
    if (f == nullptr) {
      for (FILE* p : pipes) pclose(p);
      return internal_error("calibrate: cannot start a sharing worker (" + cmd + "): " + std::strerror(errno));
    }
    pipes.push_back(f);
  }
  bool ready = true;
  for (int i = 0; i < n; ++i) {
    ready = ready && wait_for_file((dir / (std::to_string(i) + ".ready")).string(), ready_timeout_s);
  }
  // Every worker waits for this file: the start time, or 0 (stop now) when one of them never got ready.
  const int64_t start_ns = ready ? static_cast<int64_t>((wall_s() + kStartLead_s) * 1e9) : 0;
  std::ofstream((dir / "go.tmp").string()) << start_ns << "\n";
  std::filesystem::rename(dir / "go.tmp", dir / "go", ec);
  std::vector<std::string> out;
  std::string errors;
  for (FILE* f : pipes) {
    std::string text;
    std::array<char, 512> buf;
    while (size_t got = fread(buf.data(), 1, buf.size(), f)) text.append(buf.data(), got);
    if (pclose(f) != 0) {
      errors += (errors.empty() ? "" : "; ") + text;
    } else {
      out.push_back(text);
    }
  }
  std::filesystem::remove_all(dir, ec);
  if (!ready) {
    errors += (errors.empty() ? "" : "; ") + std::string("a worker was not ready after ") +
              std::to_string(static_cast<int>(ready_timeout_s)) + " s";
  }
  if (!errors.empty()) return unavailable("calibrate: a sharing worker failed: " + errors);
  return out;
}

namespace {

// n GEMM-and-triad workers (run_share_worker): their samples, or an error naming what failed.
Result<std::vector<std::array<ShareSample, 2>>> run_workers(int n, double window_s) {
  PIPER_ASSIGN_OR_RETURN(std::vector<std::string> texts, run_share_workers(
                                                             n,
                                                             [window_s](const std::string& prefix) {
                                                               return "--share-worker " + shell_quote(prefix) +
                                                                      " --share-window " + std::to_string(window_s);
                                                             },
                                                             60.0));
  std::vector<std::array<ShareSample, 2>> out;
  for (const std::string& text : texts) {
    std::array<ShareSample, 2> s;
    const int fields = std::sscanf(text.c_str(), "gemm %lf %lf %lf stream %lf %lf %lf", &s[0].calls, &s[0].cpu_s,
                                   &s[0].wall_s, &s[1].calls, &s[1].cpu_s, &s[1].wall_s);
    if (fields != 6) return unavailable("calibrate: a sharing worker printed no samples: " + text);
    out.push_back(s);
  }
  return out;
}

// The better of two efficiencies measured for the same n (other load only ever lowers one).
void keep_best(SharingEfficiency* best, const SharingEfficiency& e) {
  best->per_cpu = std::max(best->per_cpu, e.per_cpu);
  best->per_wall = std::max(best->per_wall, e.per_wall);
}

// Involuntary context switches of every thread of this process so far: a thread preempted for another process.
long involuntary_switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nivcsw;
}

}  // namespace

double fastest_single_call_s(const std::function<void()>& fn, double round_s) {
  double best = std::numeric_limits<double>::infinity();
  const double start = wall_s();
  double now = start;
  int calls = 0;
  while (now - start < round_s || calls < 2) {
    const long switches = involuntary_switches();
    const double before = wall_s();
    fn();
    now = wall_s();
    ++calls;
    if (involuntary_switches() == switches) best = std::min(best, now - before);
  }
  return best;
}

double measure_task_overhead_s(int threads, int rounds) {
  constexpr int64_t kWidth = 128;
  const int threads_before = kernels::kernel_threads();
  kernels::set_kernel_threads(threads);
  const size_t n = static_cast<size_t>(threads);
  std::vector<float> x(n * kWidth, 0.5f), y(n * kWidth), w(kWidth, 1.0f), rstd(n);
  const std::function<void()> call = [&] {
    kernels::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), threads, kWidth, 1e-6);
  };
  call();
  double s = std::numeric_limits<double>::infinity();
  for (int r = 0; r < rounds; ++r) s = std::min(s, fastest_single_call_s(call, 0.05));
  kernels::set_kernel_threads(threads_before);
  return s;
}

Result<double> meet_share_workers(const std::string& prefix) {
  if (!(std::ofstream(prefix + ".ready") << "ready\n")) {
    return unavailable("calibrate: a sharing worker cannot write " + prefix + ".ready (the meeting folder is gone?)");
  }
  const std::string go = (std::filesystem::path(prefix).parent_path() / "go").string();
  if (!wait_for_file(go, 120.0)) return unavailable("calibrate: a sharing worker had no start time in " + go);
  int64_t start_ns = 0;
  std::ifstream(go) >> start_ns;
  const double start_s = 1e-9 * static_cast<double>(start_ns);
  if (!(start_s > 0)) return unavailable("calibrate: a sharing worker was told to stop (another never got ready)");
  return start_s;
}

Status run_share_worker(const std::string& prefix, double window_s) {
  kernels::set_kernel_threads(1);
  const std::vector<float> a(static_cast<size_t>(kShareGemmDim * kShareGemmWidth), 0.5f),
      b(static_cast<size_t>(kShareGemmWidth * kShareGemmWidth), 0.25f);
  std::vector<float> c(static_cast<size_t>(kShareGemmDim * kShareGemmWidth));
  std::vector<float> ta(kTriadFloats, 0.0f), tb(kTriadFloats, 1.0f), tc(kTriadFloats, 2.0f);
  const std::function<void()> gemm = [&] {
    kernels::sgemm(false, false, kShareGemmDim, kShareGemmWidth, kShareGemmWidth, 1.0f, a.data(), kShareGemmWidth,
                   b.data(), kShareGemmWidth, 0.0f, c.data(), kShareGemmWidth);
  };
  const std::function<void()> triad = [&] {
    float* pa = ta.data();
    const float* pb = tb.data();
    const float* pc = tc.data();
    for (size_t i = 0; i < kTriadFloats; ++i) pa[i] = pb[i] + 3.0f * pc[i];
  };
  gemm();
  triad();
  PIPER_ASSIGN_OR_RETURN(const double start_s, meet_share_workers(prefix));
  const ShareSample g = run_window(gemm, start_s, start_s + window_s);
  const ShareSample t = run_window(triad, start_s + kStreamOffset * window_s, start_s + (kStreamOffset + 1) * window_s);
  std::printf("gemm %.0f %.9f %.9f stream %.0f %.9f %.9f\n", g.calls, g.cpu_s, g.wall_s, t.calls, t.cpu_s, t.wall_s);
  return ok_status();
}

Result<std::vector<SharingRow>> measure_core_sharing(int max_ranks, int rounds, double window_s, double cores) {
  // The one-alone baseline: the fastest time per call over every round, per CPU and per wall second (other load
  // only ever slows a process down); each n's best round is then compared with it.
  std::array<ShareSample, 2> alone{ShareSample{1, 1e30, 1e30}, ShareSample{1, 1e30, 1e30}};
  using Run = std::vector<std::array<ShareSample, 2>>;  // per process: the GEMM's and the triad's samples
  std::vector<std::vector<Run>> runs(static_cast<size_t>(std::max(0, max_ranks - 1)));
  for (int r = 0; r < rounds; ++r) {
    std::fprintf(stderr, "calibrate: core sharing, round %d of %d: 1..%d processes at once\n", r + 1, rounds,
                 max_ranks);
    PIPER_ASSIGN_OR_RETURN(auto one, run_workers(1, window_s));
    for (int k = 0; k < 2; ++k) {
      alone[k].cpu_s = std::min(alone[k].cpu_s, one[0][k].cpu_s / one[0][k].calls);
      alone[k].wall_s = std::min(alone[k].wall_s, one[0][k].wall_s / one[0][k].calls);
    }
    for (int n = 2; n <= max_ranks; ++n) {
      PIPER_ASSIGN_OR_RETURN(auto got, run_workers(n, window_s));
      runs[static_cast<size_t>(n - 2)].push_back(std::move(got));
    }
  }
  std::vector<SharingRow> rows;
  for (int n = 2; n <= max_ranks; ++n) {
    SharingRow row{n, {}, {}};
    for (const auto& run : runs[static_cast<size_t>(n - 2)]) {
      std::vector<ShareSample> g, t;
      for (const auto& s : run) {
        g.push_back(s[0]);
        t.push_back(s[1]);
      }
      PIPER_ASSIGN_OR_RETURN(SharingEfficiency eg, sharing_efficiency(alone[0], g, cores));
      PIPER_ASSIGN_OR_RETURN(SharingEfficiency et, sharing_efficiency(alone[1], t, cores));
      keep_best(&row.gemm, eg);
      keep_best(&row.stream, et);
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace piper::cli
