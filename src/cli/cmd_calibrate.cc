// `piper calibrate`: measures this machine's CPU cores and writes a device calibration (cost/device_model.h) for
// `--calibration FILE` in estimate, simulate, plan and train (docs/calibration.md).
//
// Stages (a progress line each on stderr), for every kernel thread count t = 1..C: the fp32 GEMM the runtime's
// kernels use (kernels::sgemm with t threads) at the token counts of skinny and square GEMMs, fitted to the device
// model's curve; the streaming bandwidth (a triad over arrays far larger than the caches, split over t threads);
// the fixed cost of one kernel call. Then the core sharing of n = 2..2C single-thread processes (calibrate_share.h),
// the attention core's cost beyond its FLOPs on one thread (calibrate_attention.h: attention_score_bytes), and the
// routed experts' cost per expert call and per row beyond their FLOPs (calibrate_experts.h: expert_call_*_s,
// expert_row_*_s). With --model M (repeatable), last, the model's own task profile (calibrate_tasks.h): for every
// thread count and mbs 1, 2, 4, M trained on one rank in this process, each task kind's measured seconds per step
// (the steps after the first) beside the simulator's price of it at the figures just measured ("task_profiles");
// a thread count with a task off its price by more than cost::kMaxTaskScale either way is left out of the file
// (a loaded machine's measurement), said on stderr and in the summary.
// The file holds one core's measured figures (peak_flops_fp32: the fitted curve's large-GEMM asymptote;
// memory_bw_bytes_per_s), which replace the local-cpu preset's, each thread count's own (thread_figures), which
// `local_cluster` (train_report.h) uses for a rank's thread count, and the sharing efficiency (core_sharing).
// With --ranks R the links are measured first, by R ranks under mpirun (calibrate_links.h), into their own file.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "piper/base/clock.h"
#include "piper/base/files.h"
#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/base/units.h"
#include "piper/cli/calibrate_attention.h"
#include "piper/cli/calibrate_experts.h"
#include "piper/cli/calibrate_fit.h"
#include "piper/cli/calibrate_links.h"
#include "piper/cli/calibrate_share.h"
#include "piper/cli/calibrate_tasks.h"
#include "piper/cli/calibration_file.h"
#include "piper/cli/command.h"
#include "piper/cli/flags.h"
#include "piper/comm/launch.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/exec/process_memory.h"
#include "piper/spec/cluster_loader.h"

namespace piper::cli {
namespace {

constexpr int64_t kGemmWidth = 512;  // n = k: a hidden size of a small model, the runtime's common GEMM width
// The model's own core sharing (measure_model_sharing): each copy steps for at least this long from the common start
// (and kShareMinSteps steps), about 20 of tiny-moe's steps alone.
constexpr double kModelShareWindowS = 1.0;
const std::vector<int64_t> kGemmDims = {8, 16, 32, 64, 128, 256, 512};

using Clock = std::chrono::steady_clock;

// Seconds per call of `fn` over one round of at least `min_round_s` (and two calls). One thread: the process's CPU
// time over the round (time-slicing with other processes does not count). More threads: the fastest single call in
// wall time among the calls during which no thread of the process was preempted (calibrate_share.h), since a
// parallel call lasts until its last thread is done and the CPU time of several threads counts a thread that waits
// for a descheduled one as idle; on a loaded machine most calls wait for a time slice (on the 2-core build machine
// at load average 5, the mean call of a 2-thread GEMM took about 20 ms, whatever its size). Infinity when no call
// ran undisturbed.
template <typename Fn>
double round_seconds(Fn& fn, double min_round_s, int threads) {
  if (threads > 1) return fastest_single_call_s(fn, min_round_s);
  int calls = 0;
  const double start = process_cpu_s();
  double elapsed = 0;
  while (elapsed < min_round_s || calls < 2) {
    fn();
    ++calls;
    elapsed = process_cpu_s() - start;
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
void time_interleaved(std::vector<Timed>& timed, int rounds, int threads) {
  for (Timed& k : timed) k.fn();
  for (int r = 0; r < rounds; ++r) {
    for (Timed& k : timed) k.best_s = std::min(k.best_s, round_seconds(k.fn, 0.05, threads));
  }
}

// C[d, w] = A[d, w] * B[w, w] on `threads` kernel threads (set by the caller), for every d: (d, efficiency
// against `peak`).
std::vector<GemmPoint> measure_gemms(double peak, int rounds, int threads) {
  std::vector<std::vector<float>> as, cs;
  const std::vector<float> b(static_cast<size_t>(kGemmWidth * kGemmWidth), 0.25f);
  std::vector<Timed> timed;
  as.reserve(kGemmDims.size());
  cs.reserve(kGemmDims.size());
  for (int64_t d : kGemmDims) {
    std::fprintf(stderr, "calibrate: GEMM %lld x %lld x %lld (fp32, %d thread%s)\n", static_cast<long long>(d),
                 static_cast<long long>(kGemmWidth), static_cast<long long>(kGemmWidth), threads,
                 threads == 1 ? "" : "s");
    as.emplace_back(static_cast<size_t>(d * kGemmWidth), 0.5f);
    cs.emplace_back(static_cast<size_t>(d * kGemmWidth), 0.0f);
    timed.push_back({[d, a = as.back().data(), c = cs.back().data(), pb = b.data()] {
      kernels::sgemm(false, false, d, kGemmWidth, kGemmWidth, 1.0f, a, kGemmWidth, pb, kGemmWidth, 0.0f, c, kGemmWidth);
    }});
  }
  time_interleaved(timed, rounds, threads);
  std::vector<GemmPoint> points;
  for (size_t i = 0; i < kGemmDims.size(); ++i) {
    const double d = static_cast<double>(kGemmDims[i]);
    const double flops = 2.0 * d * kGemmWidth * kGemmWidth;
    points.push_back(GemmPoint{d, flops / timed[i].best_s / peak});
  }
  return points;
}

// a[i] = b[i] + 3 c[i] over 3 x 64 MiB on `threads` kernel threads (the runtime's elementwise kernels' OpenMP
// split): bytes per second (two reads and one write per element).
double measure_stream_bw(int rounds, int threads) {
  const int64_t n = 16 << 20;
  std::vector<float> a(static_cast<size_t>(n), 0.0f), b(static_cast<size_t>(n), 1.0f), c(static_cast<size_t>(n), 2.0f);
  std::vector<Timed> triad{{[&] {
    float* pa = a.data();
    const float* pb = b.data();
    const float* pc = c.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.0f * pc[i];
  }}};
  time_interleaved(triad, rounds, threads);
  return 3.0 * sizeof(float) * static_cast<double>(n) / triad[0].best_s;
}

// One thread's std::copy of 64 MiB into another 64 MiB (as the runtime stages a data-parallel collective,
// runtime/exec/executor_dp.cc): bytes moved per second (one read and one write per byte).
double measure_copy_bw(int rounds) {
  const size_t n = 16 << 20;
  std::vector<float> from(n, 1.0f), to(n, 0.0f);
  std::vector<Timed> copy{{[&] { std::copy(from.begin(), from.end(), to.begin()); }}};
  time_interleaved(copy, rounds, 1);
  return 2.0 * sizeof(float) * static_cast<double>(n) / copy[0].best_s;
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
  int sharing_rounds = 3;
  bool json = false;
  std::string share_worker;  // hidden: run as a core-sharing worker with this prefix (calibrate_share.h)
  std::string model_share_worker;  // hidden: run as a model's core-sharing worker (calibrate_tasks.h)
  double share_window_s = 0.25;
  LinkStageOptions links;
  TaskProfileOptions profile;  // --model (none: no task profile), --seq; its thread counts are 1..C, as above
};

// What one thread count measured: the GEMM curve, the triad's bandwidth, a kernel call's fixed cost.
struct ThreadRun {
  int threads = 1;
  std::vector<GemmPoint> points;
  GemmCurve curve;
  double bw = 0;
  double copy_bw = 0;  // one thread only (measure_copy_bw)
  double overhead_s = 0;
};

Result<ThreadRun> measure_threads(double peak, int rounds, int threads) {
  kernels::set_kernel_threads(threads);
  ThreadRun t;
  t.threads = threads;
  t.points = measure_gemms(peak, rounds, threads);
  std::fprintf(stderr, "calibrate: streaming bandwidth (%d thread%s, 3 x 64 MiB)\n", threads, threads == 1 ? "" : "s");
  t.bw = measure_stream_bw(rounds, threads);
  if (threads == 1) {
    std::fprintf(stderr, "calibrate: copy rate (1 thread, 64 MiB)\n");
    t.copy_bw = measure_copy_bw(rounds);
  }
  std::fprintf(stderr, "calibrate: fixed cost of a kernel call (%d thread%s)\n", threads, threads == 1 ? "" : "s");
  t.overhead_s = measure_task_overhead_s(threads, rounds);
  std::vector<std::string> disturbed;
  for (const GemmPoint& p : t.points) {
    if (!(p.efficiency > 0)) disturbed.push_back("the GEMM at d = " + std::to_string(static_cast<int>(p.min_dim)));
  }
  if (!(t.bw > 0)) disturbed.push_back("the triad");
  if (!std::isfinite(t.overhead_s)) disturbed.push_back("the kernel call");
  if (!disturbed.empty()) {
    return unavailable("no call of " + join(disturbed, ", ") + " ran undisturbed on " + std::to_string(threads) +
                       " threads (other processes took a core every time): the machine is too loaded");
  }
  Result<GemmCurve> curve = fit_gemm_curve(t.points);
  if (!curve.ok()) return curve.status().with_context("calibrate with " + std::to_string(threads) + " threads");
  t.curve = *curve;
  return t;
}

// "thread_figures" (cost::Calibration::ThreadFigures): each thread count's own measured figures.
Json thread_figures_json(const std::vector<ThreadRun>& runs, double peak) {
  Json list = Json::array();
  for (const ThreadRun& t : runs) {
    list.push_back({{"threads", t.threads},
                    {"peak_flops_fp32", t.curve.gemm_efficiency * peak},
                    {"gemm_half_dim", t.curve.gemm_half_dim},
                    {"memory_bw_bytes_per_s", t.bw},
                    {"task_overhead_s", t.overhead_s}});
  }
  return list;
}

// "core_sharing" (cost::Calibration::core_sharing): the GEMM's efficiency per CPU second is the one the model
// uses; the triad's and the per-wall-second figures are kept beside it for the record.
Json core_sharing_json(const std::vector<SharingRow>& rows) {
  Json list = Json::array();
  for (const SharingRow& r : rows) {
    list.push_back({{"ranks", r.ranks},
                    {"efficiency", r.gemm.per_cpu},
                    {"stream_efficiency", r.stream.per_cpu},
                    {"wall_efficiency", r.gemm.per_wall},
                    {"stream_wall_efficiency", r.stream.per_wall}});
  }
  return list;
}

// "attention" in --json: the attention stage's shape and, per length, what was measured and fitted (the file keeps
// only their mean, attention_score_bytes).
Json attention_json(const AttentionFit& a) {
  Json points = Json::array();
  for (const AttentionShapePoint& p : a.points) {
    points.push_back({{"seq", p.seq},
                      {"forward_s", p.forward_s},
                      {"backward_s", p.backward_s},
                      {"flops_s", p.flops_s},
                      {"bytes_per_score", p.bytes_per_score}});
  }
  return Json{
      {"batch", a.batch}, {"heads", a.heads}, {"kv_heads", a.kv_heads}, {"head_dim", a.head_dim}, {"points", points}};
}

void print_thread_runs(const std::vector<ThreadRun>& runs, double peak, const DeviceSpec& preset) {
  for (const ThreadRun& t : runs) {
    std::printf("GEMM (fp32, %d thread%s, n = k = %lld), fraction of local-cpu's %s per core:\n", t.threads,
                t.threads == 1 ? "" : "s", static_cast<long long>(kGemmWidth), format_si(peak, "FLOP/s").c_str());
    for (const GemmPoint& p : t.points) {
      std::printf("  d = %4.0f   measured %.3f   fitted %.3f\n", p.min_dim, p.efficiency,
                  t.curve.gemm_efficiency * p.min_dim / (p.min_dim + t.curve.gemm_half_dim));
    }
    std::printf("fit       %.3f x d / (d + %.1f) of the preset's peak: large GEMMs reach %s (%.2f x one thread)\n",
                t.curve.gemm_efficiency, t.curve.gemm_half_dim,
                format_si(t.curve.gemm_efficiency * peak, "FLOP/s").c_str(),
                t.curve.gemm_efficiency / runs[0].curve.gemm_efficiency);
    std::printf("stream    %s = %.2f x the preset's %s per core (%.2f x one thread)\n", format_si(t.bw, "B/s").c_str(),
                t.bw / preset.memory_bw_bytes_per_s, format_si(preset.memory_bw_bytes_per_s, "B/s").c_str(),
                t.bw / runs[0].bw);
    if (t.copy_bw > 0) {
      std::printf("copy      %s moved (std::copy of 64 MiB; the staging of data-parallel collectives)\n",
                  format_si(t.copy_bw, "B/s").c_str());
    }
    std::printf("overhead  %.2f us per kernel call\n", 1e6 * t.overhead_s);
  }
}

// A stage that times kernels on one thread against the file's own one-thread figures (the attention and experts
// stages): `measure` gets that device model and a timer giving the fastest of `rounds` calls.
template <typename Fit>
Result<Fit> measure_on_one_thread(const Json& file, const DeviceSpec& preset, int rounds,
                                  Result<Fit> (*measure)(const cost::DeviceModel&,
                                                         const std::function<double(const std::function<void()>&)>&)) {
  PIPER_ASSIGN_OR_RETURN(cost::Calibration cal, cost::Calibration::from_json(file, "the measured figures"));
  const cost::DeviceModel device(preset, DType::kFP32, cal, 1.0);
  const int threads_before = kernels::kernel_threads();
  kernels::set_kernel_threads(1);
  Result<Fit> fit = measure(device, [rounds](const std::function<void()>& fn) {
    std::vector<Timed> timed{{fn}};
    time_interleaved(timed, rounds, 1);
    return timed[0].best_s;
  });
  kernels::set_kernel_threads(threads_before);
  return fit;
}

void print_attention(const AttentionFit& a) {
  std::printf("attention causal core, %lld x %lld heads of %lld (GQA %lld), 1 thread, against its FLOPs at the "
              "fitted rate:\n",
              static_cast<long long>(a.batch), static_cast<long long>(a.heads), static_cast<long long>(a.head_dim),
              static_cast<long long>(a.kv_heads));
  for (const AttentionShapePoint& p : a.points) {
    std::printf("  seq %4lld   forward %.3f ms  backward %.3f ms  FLOPs priced %.3f ms: %.1f B per score\n",
                static_cast<long long>(p.seq), 1e3 * p.forward_s, 1e3 * p.backward_s, 1e3 * p.flops_s,
                p.bytes_per_score);
  }
  std::printf("scores    %.1f B per score element (attention_score_bytes: the mean)\n", a.bytes_per_score);
}

// "experts" in --json: the experts stage's shape and, per row count and task, what was measured and priced, and
// the fit (the file keeps the non-negative line's intercepts and slopes, expert_call_*_s and expert_row_*_s).
Json experts_json(const ExpertFit& e) {
  Json points = Json::array();
  for (const ExpertRowsPoint& p : e.points) {
    Json tasks = Json::object();
    for (int k = 0; k < 3; ++k) {
      tasks[kExpertTaskNames[k]] = Json{
          {"measured_s", p.measured_s[k]}, {"priced_s", p.priced_s[k]}, {"excess_per_call_s", p.excess_per_call_s[k]}};
    }
    points.push_back({{"rows_per_expert", p.rows_per_expert}, {"per_layer", tasks}});
  }
  Json fit = Json::object();
  for (int k = 0; k < 3; ++k) {
    fit[kExpertTaskNames[k]] = Json{{"call_s", e.call_s[k]},
                                    {"per_row_s", e.per_row_s[k]},
                                    {"line_intercept_s", e.fitted_a[k]},
                                    {"line_slope_s", e.fitted_b[k]}};
  }
  return Json{
      {"hidden", e.hidden},
      {"width", e.width},
      {"experts_per_layer", e.experts},
      {"top_k", e.top_k},
      {"layers_cycled", e.layers},
      {"weight_bytes_cycled", e.weight_bytes},
      {"method",
       "each task of one layer of SwiGLU experts timed at one thread (fastest of the rounds, CPU time), the "
       "layers' weights cycled so every call reads them from memory; (measured - the model's price of the "
       "layer) / experts fitted by least squares as a line in the rows per expert; the file keeps its intercept as "
       "call_s (expert_call_*_s) and its slope as per_row_s (expert_row_*_s), each clamped at 0"},
      {"points", points},
      {"fit", fit}};
}

void print_experts(const ExpertFit& e) {
  std::printf(
      "experts   %lld SwiGLU experts of %lld x %lld a layer, %lld layers' weights cycled (%.0f MiB), "
      "1 thread, per layer against its FLOPs and bytes at the fitted rate:\n",
      static_cast<long long>(e.experts), static_cast<long long>(e.hidden), static_cast<long long>(e.width),
      static_cast<long long>(e.layers), e.weight_bytes / (1024.0 * 1024.0));
  for (const ExpertRowsPoint& p : e.points) {
    std::printf(
        "  %4lld rows each   forward %.3f ms (priced %.3f)  input grad %.3f ms (%.3f)  weight grad %.3f ms "
        "(%.3f)\n",
        static_cast<long long>(p.rows_per_expert), 1e3 * p.measured_s[0], 1e3 * p.priced_s[0], 1e3 * p.measured_s[1],
        1e3 * p.priced_s[1], 1e3 * p.measured_s[2], 1e3 * p.priced_s[2]);
  }
  std::printf(
      "per call  %.1f us forward, %.1f us input grad, %.1f us weight grad beyond the price "
      "(expert_call_*_s), and per row %.3f / %.3f / %.3f us (expert_row_*_s)\n",
      1e6 * e.call_s[0], 1e6 * e.call_s[1], 1e6 * e.call_s[2], 1e6 * e.per_row_s[0], 1e6 * e.per_row_s[1],
      1e6 * e.per_row_s[2]);
}

void print_sharing(const std::vector<SharingRow>& rows, double cores, const std::vector<TaskProfile>& profiles) {
  if (rows.empty()) return;
  std::printf("sharing   %g cores; per process against one alone, per CPU second (the model's) / per wall second "
              "against min(1, cores / n):\n", cores);
  for (size_t k = 0; k < rows.size(); ++k) {
    const SharingRow& r = rows[k];
    std::printf("  n = %d   GEMM %.3f / %.3f   triad %.3f / %.3f", r.ranks, r.gemm.per_cpu, r.gemm.per_wall,
                r.stream.per_cpu, r.stream.per_wall);
    for (const TaskProfile& p : profiles) {
      if (k < p.sharing.size()) std::printf("   %s's steps %.3f", p.model.c_str(), p.sharing[k]);
    }
    std::printf("\n");
  }
}

void print_written(const std::string& out, const CalibrateOptions& o) {
  if (out.empty()) {
    std::printf("written   nowhere (PIPER_CALIBRATION=none); pass --out FILE to keep it\n");
  } else if (o.out.empty()) {
    std::printf("written   %s (this machine's default: train, plan --local-ranks and --cluster local-cpu use it)\n",
                out.c_str());
  } else {
    std::printf("written   %s (use it with --calibration %s)\n", out.c_str(), out.c_str());
  }
}

void print_links_written(const std::string& links_out, const CalibrateOptions& o) {
  if (links_out.empty()) {
    std::printf("links     written nowhere (PIPER_CALIBRATION=none); pass --links-out FILE\n");
  } else if (o.links.out.empty()) {
    std::printf("links     %s (this machine's default link calibration)\n", links_out.c_str());
  } else {
    std::printf("links     %s (use it with --comm-calibration)\n", links_out.c_str());
  }
}

Status run_device_stage(const CalibrateOptions& o, const Json& links, const std::string& links_out);

// Inside an MPI job (the spawned link stage, or under scripts/two-node-emulation.sh) only the links are measured:
// the device stage would run on every rank at once.
Status run_calibrate(const CalibrateOptions& o) {
  runtime::keep_freed_memory();  // measure what a training process pays (runtime/exec/process_memory.h)
  if (!o.share_worker.empty()) return run_share_worker(o.share_worker, o.share_window_s);
  if (!o.model_share_worker.empty()) {
    if (o.profile.models.size() != 1) return invalid_argument("calibrate --model-share-worker needs one --model");
    return run_model_share_worker(o.model_share_worker, o.profile.models[0], o.profile.seq_len, o.share_window_s);
  }
  if (o.links.spawned || comm::launched_by_mpi()) return run_link_stage(o.links);
  // A bad --model or --seq fails now, not after the links' mpirun or the device's measurements.
  PIPER_RETURN_IF_ERROR(load_task_profile_models(o.profile).status());
  if (o.links.ranks == 0) return run_device_stage(o, Json(), "");
  Json links;
  if (!o.json) std::fprintf(stderr, "calibrate: links, %d ranks under mpirun\n", o.links.ranks);
  PIPER_ASSIGN_OR_RETURN(const std::string links_out, launch_link_stage(o.links, &links));
  return run_device_stage(o, links, links_out);
}

// One curve per thread count 1..cores. A count > 1 that the load made unfittable gets no entry (priced as t x one
// core, as before it was measured, so a loaded machine still gets a calibration) and is named in *unfitted; one
// core's figures are the file's core, so its failure is the stage's.
Result<std::vector<ThreadRun>> measure_thread_counts(double peak, int rounds, int cores,
                                                     std::vector<std::string>* unfitted) {
  const int threads_before = kernels::kernel_threads();
  std::vector<ThreadRun> runs;
  for (int t = 1; t <= cores; ++t) {
    Result<ThreadRun> run = measure_threads(peak, rounds, t);
    kernels::set_kernel_threads(threads_before);
    if (run.ok()) {
      runs.push_back(*run);
      continue;
    }
    if (t == 1) return run.status();
    std::fprintf(stderr, "calibrate: %s; no entry for %d threads (priced as %d x one core)\n",
                 run.status().message().c_str(), t, t);
    unfitted->push_back(std::to_string(t));
  }
  return runs;
}

// ", load average L" for the file's source ("" when unknown); warns when the machine was loaded: several threads
// need several idle cores at once, so their figures are what the machine gave at this load.
std::string load_note(int cores) {
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) != 3) return "";
  if (load[0] > 0.5 * cores) {
    std::fprintf(stderr,
                 "calibrate: load average %.2f on %d cores: the figures of more than one thread (and the kernel-call "
                 "cost) are those of a loaded machine; calibrate again when it is idle\n",
                 load[0], cores);
  }
  char text[64];
  std::snprintf(text, sizeof(text), ", load average %.2f", load[0]);
  return text;
}

// The device calibration file's core: the measured figures of one core replace the preset's (its base-clock peak
// and memcpy bandwidth): the large-GEMM asymptote of the fitted curve and the triad's bandwidth, each then reached
// in full (efficiency 1). Each thread count's own figures and the core sharing follow (cost/device_model.h).
Json device_file(const std::vector<ThreadRun>& runs, const std::vector<SharingRow>& sharing, double peak, int cores,
                 const std::string& load_text) {
  const ThreadRun& one = runs[0];
  Json file{{"peak_flops_fp32", one.curve.gemm_efficiency * peak},
            {"gemm_efficiency", 1.0},
            {"gemm_half_dim", one.curve.gemm_half_dim},
            {"memory_bw_bytes_per_s", one.bw},
            {"memory_bw_efficiency", 1.0},
            {"gemm_table", false},
            {"workspace_bytes", 0},
            {"thread_figures", thread_figures_json(runs, peak)},
            {"source", "piper calibrate on " + host_name() + " at " + utc_now() + ": 1.." + std::to_string(cores) +
                           " threads, kernels::sgemm (" + kernels::to_string(kernels::gemm_backend()) +
                           "), a triad, the attention and expert kernels" +
                           (sharing.empty() ? "" : ", core sharing of 2.." + std::to_string(2 * cores) + " processes") +
                           load_text}};
  if (!sharing.empty()) file["core_sharing"] = core_sharing_json(sharing);
  // A copy too fast for the clock (or none) is left out: the staging then falls back to the triad's figure.
  if (std::isfinite(one.copy_bw) && one.copy_bw >= 1e6 && one.copy_bw <= 1e15)
    file["copy_bw_bytes_per_s"] = one.copy_bw;
  return file;
}

// The attention and experts stages, each on one thread at the figures already in `file`; their keys added to it.
Status add_kernel_stages(const DeviceSpec& preset, int rounds, Json* file, AttentionFit* attention,
                         ExpertFit* experts) {
  PIPER_ASSIGN_OR_RETURN(*attention, measure_on_one_thread(*file, preset, rounds, &measure_attention));
  (*file)["attention_score_bytes"] = attention->bytes_per_score;
  PIPER_ASSIGN_OR_RETURN(*experts, measure_on_one_thread(*file, preset, rounds, &measure_experts));
  (*file)["expert_shape"] = Json{{"hidden", experts->hidden}, {"ffn", experts->width}};
  for (int k = 0; k < 3; ++k) {
    (*file)[std::string("expert_call_") + kExpertTaskNames[k] + "_s"] = experts->call_s[k];
    (*file)[std::string("expert_row_") + kExpertTaskNames[k] + "_s"] = experts->per_row_s[k];
  }
  return ok_status();
}

// --model's task profiles (calibrate_tasks.h) at every thread count 1..cores the stages above measured, priced with
// `file`'s figures (a count the load left unfitted too: it is priced as t x one core, as the simulator then prices
// it, so measured / priced still corrects that price); empty without --model. Each with its own core sharing when
// the core-sharing stage runs; one that failed is left out, named in *notes (the profile stays). *seconds: the
// stage's time.
Result<std::vector<TaskProfile>> profile_tasks(const CalibrateOptions& o, int cores, const Json& file, double* seconds,
                                               std::vector<std::string>* notes) {
  if (o.profile.models.empty()) return std::vector<TaskProfile>();
  const auto started = Clock::now();
  TaskProfileOptions profile = o.profile;
  profile.threads.clear();
  for (int t = 1; t <= cores; ++t) profile.threads.push_back(t);
  PIPER_ASSIGN_OR_RETURN(std::vector<TaskProfile> got, measure_task_profiles(profile, file));
  // One profile per --model, in order; their own core sharing beside the GEMM's (when that stage runs).
  for (size_t i = 0; o.sharing_rounds > 0 && i < got.size() && i < o.profile.models.size(); ++i) {
    Result<std::vector<double>> sharing = measure_model_sharing(o.profile.models[i], o.profile.seq_len, 2 * cores,
                                                                kModelShareWindowS, cores, o.sharing_rounds);
    if (sharing.ok()) {
      got[i].sharing = *sharing;
    } else {
      notes->push_back("core sharing of " + got[i].model + "'s own steps not written (" + sharing.status().message() +
                       "); its runs take the GEMM's core sharing; run `piper calibrate --model " + got[i].model +
                       "` again on a quiet machine");
    }
  }
  *seconds = std::chrono::duration<double>(Clock::now() - started).count();
  return got;
}

Status run_device_stage(const CalibrateOptions& o, const Json& links, const std::string& links_out) {
  PIPER_ASSIGN_OR_RETURN(ClusterSpec preset, load_cluster("local-cpu", 1));
  const double peak = preset.device.peak_flops_fp32;
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const auto started = Clock::now();
  std::vector<std::string> unfitted;  // thread counts > 1 whose curve the load made unfittable
  PIPER_ASSIGN_OR_RETURN(std::vector<ThreadRun> runs, measure_thread_counts(peak, o.rounds, cores, &unfitted));
  std::vector<SharingRow> sharing;
  if (o.sharing_rounds > 0) {
    PIPER_ASSIGN_OR_RETURN(sharing, measure_core_sharing(2 * cores, o.sharing_rounds, o.share_window_s, cores));
  }
  const ThreadRun& one = runs[0];
  Json file = device_file(runs, sharing, peak, cores, load_note(cores));
  AttentionFit attention;
  ExpertFit experts;
  PIPER_RETURN_IF_ERROR(add_kernel_stages(preset.device, o.rounds, &file, &attention, &experts));
  // Priced by the figures above, before the file holds a task profile (the raw price).
  double profile_seconds = 0;
  std::vector<std::string> notes;
  PIPER_ASSIGN_OR_RETURN(const std::vector<TaskProfile> all_profiles,
                         profile_tasks(o, cores, file, &profile_seconds, &notes));
  // A thread count with a task far off its price is a loaded machine's: the file keeps none of its points.
  std::vector<TaskProfile> profiles = all_profiles;
  Json unscaled = Json::array();
  for (const std::string& note : notes) {
    unscaled.push_back(note);
    std::fprintf(stderr, "calibrate: %s\n", note.c_str());
  }
  for (const UnscaledThreads& u : drop_implausible_threads(&profiles)) {
    unscaled.push_back(unscaled_threads_note(u));
    std::fprintf(stderr, "calibrate: %s\n", unscaled.back().get<std::string>().c_str());
  }
  if (!profiles.empty()) file["task_profiles"] = task_profiles_json(profiles);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  PIPER_ASSIGN_OR_RETURN(const std::string out, output_path(o.out));
  if (!out.empty()) PIPER_RETURN_IF_ERROR(write_file_atomic(out, file.dump(2) + "\n"));
  if (o.json) {
    Json measured = Json::array();
    for (const GemmPoint& p : one.points) measured.push_back({{"min_dim", p.min_dim}, {"efficiency", p.efficiency}});
    Json j{{"calibration", file},
           {"gemm_points", measured},
           {"stream_bytes_per_s", one.bw},
           {"fit_gemm_efficiency", one.curve.gemm_efficiency},
           {"seconds", seconds},
           {"threads_not_fitted", unfitted},
           {"attention", attention_json(attention)},
           {"experts", experts_json(experts)},
           {"task_profile_seconds", profile_seconds},
           {"task_profiles_left_out", unscaled},
           {"out", out}};
    if (o.links.ranks > 0) {
      j["links"] = links;
      j["links_out"] = links_out;
    }
    print_json(j.dump(2));
    return ok_status();
  }
  print_thread_runs(runs, peak, preset.device);
  if (!unfitted.empty()) {
    std::printf("not fitted %s threads: the machine was too loaded (calibrate again when it is idle)\n",
                join(unfitted, ", ").c_str());
  }
  print_sharing(sharing, cores, all_profiles);
  print_attention(attention);
  print_experts(experts);
  print_task_profiles(all_profiles);
  for (const Json& note : unscaled) std::printf("left out  %s\n", note.get<std::string>().c_str());
  char profiled[48] = "";
  if (!all_profiles.empty()) std::snprintf(profiled, sizeof(profiled), " (the task profiles %.1f s)", profile_seconds);
  std::printf("took      %.1f s%s\n", seconds, profiled);
  print_written(out, o);
  if (o.links.ranks > 0) print_links_written(links_out, o);
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
                         add_int_option(sub, "--sharing-rounds", &o->sharing_rounds,
                                        {0, 100, "rounds of the core-sharing stage"},
                                        "rounds of the core-sharing stage (2..2C processes at once, the GEMM and each "
                                        "--model's own steps; 0: skip both)")
                             ->capture_default_str();
                         CLI::Option* model =
                             sub->add_option("--model", o->profile.models,
                                             "also profile this model's own tasks on one rank, measured against their "
                                             "price (a preset or config file, as train's --model; repeatable)");
                         add_int_option(sub, "--seq", &o->profile.seq_len,
                                        {1, kMaxSeqLen, "tokens per sequence; at most the model's max_seq_len"},
                                        "--model: sequence length of the profiled runs")
                             ->capture_default_str()
                             ->needs(model);
                         sub->add_flag("--json", o->json, "print one JSON object");
                         // The core-sharing stage's worker processes (calibrate_share.h); not for users.
                         sub->add_option("--share-worker", o->share_worker)->group("");
                         sub->add_option("--model-share-worker", o->model_share_worker)->group("");
                         sub->add_option("--share-window", o->share_window_s)->group("");
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
