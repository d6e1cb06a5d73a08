// `piper calibrate`: measures this machine's CPU core and writes a device calibration (cost/device_model.h) for
// `--calibration FILE` in estimate, simulate, plan and train (docs/calibration.md).
//
// Stages (a progress line each on stderr): the fp32 GEMM the runtime's kernels use (kernels::sgemm, one thread)
// at the token counts of skinny and square GEMMs, fitted to the device model's curve; the streaming bandwidth of
// one core (a triad over arrays far larger than the caches). The file holds one core's measured figures
// (peak_flops_fp32: the fitted curve's large-GEMM asymptote; memory_bw_bytes_per_s), which replace the local-cpu
// preset's; `local_cluster` (train_report.h) scales them by the cores each rank gets.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "piper/base/files.h"
#include "piper/base/json.h"
#include "piper/base/units.h"
#include "piper/cli/calibrate_fit.h"
#include "piper/cli/calibrate_links.h"
#include "piper/cli/calibration_file.h"
#include "piper/cli/command.h"
#include "piper/cli/flags.h"
#include "piper/comm/launch.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/spec/cluster_loader.h"

namespace piper::cli {
namespace {

constexpr int64_t kGemmWidth = 512;  // n = k: a hidden size of a small model, the runtime's common GEMM width
const std::vector<int64_t> kGemmDims = {8, 16, 32, 64, 128, 256, 512};

using Clock = std::chrono::steady_clock;

// CPU seconds this process has run: time-slicing with other processes on the machine does not count, so a
// loaded machine measures the core's speed rather than the share of it this process happened to get.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// CPU seconds per call of `fn` over one round of at least `min_round_s` of CPU time (and two calls).
template <typename Fn>
double round_seconds(Fn& fn, double min_round_s) {
  int calls = 0;
  const double start = cpu_seconds();
  double elapsed = 0;
  while (elapsed < min_round_s || calls < 2) {
    fn();
    ++calls;
    elapsed = cpu_seconds() - start;
  }
  return elapsed / calls;
}

// One timed kernel: a warm-up call (first-touch page faults, library initialisation), then the fastest round.
// Other processes on the machine only ever slow a round down, so the fastest round is the kernel's own speed.
struct Timed {
  std::function<void()> fn;
  double best_s = std::numeric_limits<double>::infinity();
};

// `rounds` rounds of >= 50 ms, each visiting every kernel in turn: a load that comes and goes during the
// measurement then slows every size alike instead of bending the fitted curve.
void time_interleaved(std::vector<Timed>& timed, int rounds) {
  for (Timed& k : timed) k.fn();
  for (int r = 0; r < rounds; ++r) {
    for (Timed& k : timed) k.best_s = std::min(k.best_s, round_seconds(k.fn, 0.05));
  }
}

// C[d, w] = A[d, w] * B[w, w] on one thread, for every d: (d, efficiency against `peak`).
std::vector<GemmPoint> measure_gemms(double peak, int rounds) {
  std::vector<std::vector<float>> as, cs;
  const std::vector<float> b(static_cast<size_t>(kGemmWidth * kGemmWidth), 0.25f);
  std::vector<Timed> timed;
  as.reserve(kGemmDims.size());
  cs.reserve(kGemmDims.size());
  for (int64_t d : kGemmDims) {
    std::fprintf(stderr, "calibrate: GEMM %lld x %lld x %lld (fp32, one thread)\n", static_cast<long long>(d),
                 static_cast<long long>(kGemmWidth), static_cast<long long>(kGemmWidth));
    as.emplace_back(static_cast<size_t>(d * kGemmWidth), 0.5f);
    cs.emplace_back(static_cast<size_t>(d * kGemmWidth), 0.0f);
    timed.push_back({[d, a = as.back().data(), c = cs.back().data(), pb = b.data()] {
      kernels::sgemm(false, false, d, kGemmWidth, kGemmWidth, 1.0f, a, kGemmWidth, pb, kGemmWidth, 0.0f, c, kGemmWidth);
    }});
  }
  time_interleaved(timed, rounds);
  std::vector<GemmPoint> points;
  for (size_t i = 0; i < kGemmDims.size(); ++i) {
    const double d = static_cast<double>(kGemmDims[i]);
    const double flops = 2.0 * d * kGemmWidth * kGemmWidth;
    points.push_back(GemmPoint{d, flops / timed[i].best_s / peak});
  }
  return points;
}

// a[i] = b[i] + 3 c[i] over 3 x 64 MiB: bytes per second of one core (two reads and one write per element).
double measure_stream_bw(int rounds) {
  const size_t n = 16u << 20;
  std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
  std::vector<Timed> triad{{[&] {
    float* pa = a.data();
    const float* pb = b.data();
    const float* pc = c.data();
    for (size_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.0f * pc[i];
  }}};
  time_interleaved(triad, rounds);
  return 3.0 * sizeof(float) * static_cast<double>(n) / triad[0].best_s;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// --out, or this machine's default calibration file (calibration_file.h), whose folder is created; "" under
// PIPER_CALIBRATION=none.
Result<std::string> output_path(const std::string& out) {
  if (!out.empty()) return out;
  const std::string path = default_calibration_path();
  if (path.empty()) return std::string();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) {
    return failed_precondition("cannot create the folder of the default calibration file " + path + ": " + ec.message() +
                    "; pass --out FILE, or set PIPER_CALIBRATION to a writable path");
  }
  return path;
}

struct CalibrateOptions {
  std::string out;
  int rounds = 9;
  bool json = false;
  LinkStageOptions links;
};

Status run_device_stage(const CalibrateOptions& o, const Json& links, const std::string& links_out);

// Inside an MPI job (the spawned link stage, or under scripts/two-node-emulation.sh) only the links are measured:
// the device stage would run on every rank at once.
Status run_calibrate(const CalibrateOptions& o) {
  if (o.links.spawned || comm::launched_by_mpi()) return run_link_stage(o.links);
  if (o.links.ranks == 0) return run_device_stage(o, Json(), "");
  Json links;
  if (!o.json) std::fprintf(stderr, "calibrate: links, %d ranks under mpirun\n", o.links.ranks);
  PIPER_ASSIGN_OR_RETURN(const std::string links_out, launch_link_stage(o.links, &links));
  return run_device_stage(o, links, links_out);
}

Status run_device_stage(const CalibrateOptions& o, const Json& links, const std::string& links_out) {
  PIPER_ASSIGN_OR_RETURN(ClusterSpec preset, load_cluster("local-cpu", 1));
  const double peak = preset.device.peak_flops_fp32;
  const int threads_before = kernels::kernel_threads();
  kernels::set_kernel_threads(1);
  const auto started = Clock::now();
  const std::vector<GemmPoint> points = measure_gemms(peak, o.rounds);
  std::fprintf(stderr, "calibrate: streaming bandwidth (one core, 3 x 64 MiB)\n");
  const double bw = measure_stream_bw(o.rounds);
  kernels::set_kernel_threads(threads_before);
  PIPER_ASSIGN_OR_RETURN(GemmCurve curve, fit_gemm_curve(points));
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  // The measured figures of one core replace the preset's (its base-clock peak and memcpy bandwidth): the large-GEMM
  // asymptote of the fitted curve and the triad's bandwidth, each then reached in full (efficiency 1).
  Json file{{"peak_flops_fp32", curve.gemm_efficiency * peak},
            {"gemm_efficiency", 1.0},
            {"gemm_half_dim", curve.gemm_half_dim},
            {"memory_bw_bytes_per_s", bw},
            {"memory_bw_efficiency", 1.0},
            {"gemm_table", false},
            {"workspace_bytes", 0},
            {"source", "piper calibrate on " + host_name() + " at " + utc_now() + ": one core, kernels::sgemm (" +
                           kernels::to_string(kernels::gemm_backend()) + ") and a triad"}};
  PIPER_ASSIGN_OR_RETURN(const std::string out, output_path(o.out));
  if (!out.empty()) PIPER_RETURN_IF_ERROR(write_file_atomic(out, file.dump(2) + "\n"));
  Json measured = Json::array();
  for (const GemmPoint& p : points) measured.push_back({{"min_dim", p.min_dim}, {"efficiency", p.efficiency}});
  if (o.json) {
    Json j{{"calibration", file},      {"gemm_points", measured},
           {"stream_bytes_per_s", bw}, {"fit_gemm_efficiency", curve.gemm_efficiency},
           {"seconds", seconds},       {"out", out}};
    if (o.links.ranks > 0) {
      j["links"] = links;
      j["links_out"] = links_out;
    }
    print_json(j.dump(2));
    return ok_status();
  }
  std::printf("GEMM (fp32, one thread, n = k = %lld), fraction of local-cpu's %s per core:\n",
              static_cast<long long>(kGemmWidth), format_si(peak, "FLOP/s").c_str());
  for (const GemmPoint& p : points) {
    std::printf("  d = %4.0f   measured %.3f   fitted %.3f\n", p.min_dim, p.efficiency,
                curve.gemm_efficiency * p.min_dim / (p.min_dim + curve.gemm_half_dim));
  }
  std::printf("fit       %.3f x d / (d + %.1f) of the preset's peak: large GEMMs reach %s per core\n",
              curve.gemm_efficiency, curve.gemm_half_dim, format_si(curve.gemm_efficiency * peak, "FLOP/s").c_str());
  std::printf("stream    %s per core = %.2f x the preset's %s\n", format_si(bw, "B/s").c_str(),
              bw / preset.device.memory_bw_bytes_per_s, format_si(preset.device.memory_bw_bytes_per_s, "B/s").c_str());
  std::printf("took      %.1f s\n", seconds);
  if (out.empty()) {
    std::printf("written   nowhere (PIPER_CALIBRATION=none); pass --out FILE to keep it\n");
  } else if (o.out.empty()) {
    std::printf("written   %s (this machine's default: train, plan --local-ranks and --cluster local-cpu use it)\n",
                out.c_str());
  } else {
    std::printf("written   %s (use it with --calibration %s)\n", out.c_str(), out.c_str());
  }
  if (o.links.ranks > 0) {
    std::printf("links     %s\n", links_out.empty() ? "written nowhere (PIPER_CALIBRATION=none); pass --links-out FILE"
                                                    : (links_out + (o.links.out.empty() ? " (this machine's default "
                                                                                          "link calibration)"
                                                                                        : " (use it with "
                                                                                          "--comm-calibration)"))
                                                          .c_str());
  }
  return ok_status();
}

PIPER_REGISTER_COMMAND(g_calibrate, "calibrate", "Measure this machine's core and write a device calibration",
                       [](CLI::App* sub) {
                         auto o = std::make_shared<CalibrateOptions>();
                         sub->add_option("--out", o->out,
                                         "write the calibration JSON here (for --calibration FILE; default: this "
                                         "machine's calibration file, docs/calibration.md)");
                         add_int_option(sub, "--rounds", &o->rounds, {1, 100, "timed rounds per measurement"},
                                        "timed rounds per measurement (the fastest is kept)")
                             ->capture_default_str();
                         sub->add_flag("--json", o->json, "print one JSON object");
                         add_int_option(sub, "--ranks", &o->links.ranks, {0, kMaxLocalRanks, "MPI ranks"},
                                        "also measure the links: R ranks under mpirun, point-to-point and "
                                        "collective alpha-beta (0: the device only; under mpirun: the links only)");
                         sub->add_option("--links-out", o->links.out,
                                         "write the link calibration here (for --comm-calibration FILE; default: "
                                         "this machine's link calibration file, docs/calibration.md)");
                         sub->add_flag("--links-stage", o->links.spawned, "")->group("");
                         return std::function<Status()>([o] {
                           CalibrateOptions run = *o;
                           run.links.json = run.json;
                           return run_calibrate(run);
                         });
                       });

}  // namespace
}  // namespace piper::cli
