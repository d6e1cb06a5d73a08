// runtime_bench: a whole tiny-moe training step run by the executor from the compiled Plan (the same path as
// `piper train`), its achieved model FLOP/s (docs/counting.md: matmul FLOPs, backward = 2x forward) as a fraction
// of the same GEMM library's square sgemm FLOP/s measured in the same run, alternating with the steps.
// Goal: ratio >= 0.5. `ratio` uses wall time, `ratio_cpu` process CPU time (steadier on a shared machine).
//
// Usage: runtime_bench [--steps N] [--threads T,T] [--batch B] [--seq L] [--strategy S] [--size 1024]
// Run with OMP_WAIT_POLICY=passive on a shared machine. Prints the per-task time breakdown of the best step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/trainer.h"
#include "piper/spec/model_loader.h"
#include "piper/tensor/rng.h"

namespace piper::runtime {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Best {
  double wall = 1e30, cpu = 1e30;
  void keep(double w, double c) {
    wall = std::min(wall, w);
    cpu = std::min(cpu, c);
  }
};

Best sgemm_best(int64_t size, int repeats) {
  static std::vector<float> a, b, c;  // filled once
  if (static_cast<int64_t>(a.size()) != size * size) {
    a.assign(static_cast<size_t>(size * size), 0.0f);
    b = a;
    c = a;
    fill_normal(a.data(), size * size, Rng(1), 0, 0.0f, 1.0f);
    fill_normal(b.data(), size * size, Rng(2), 0, 0.0f, 1.0f);
  }
  Best best;
  for (int i = 0; i < repeats + 1; ++i) {
    const double t0 = now_s(), c0 = cpu_s();
    kernels::sgemm(false, false, size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f, c.data(), size);
    if (i > 0) best.keep(now_s() - t0, cpu_s() - c0);
  }
  return best;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t comma = s.find(',', start);
    out.push_back(std::atoi(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start).c_str()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int run(int argc, char** argv) {
  int steps = 6;
  int64_t batch = 16, seq = 128, size = 1024;
  std::string threads = "1,2", strategy;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--steps") steps = std::atoi(argv[i + 1]);
    else if (f == "--threads") threads = argv[i + 1];
    else if (f == "--batch") batch = std::atoll(argv[i + 1]);
    else if (f == "--seq") seq = std::atoll(argv[i + 1]);
    else if (f == "--strategy") strategy = argv[i + 1];
    else if (f == "--size") size = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "runtime_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  kernels::warn_gemm_environment();
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  std::printf("runtime_bench: tiny-moe training step through the compiled Plan, batch %lld x seq %lld, gemm %s, "
              "load average %.1f\n",
              static_cast<long long>(batch), static_cast<long long>(seq), kernels::to_string(kernels::gemm_backend()),
              load);
  std::printf("%7s %13s %13s %10s %9s %7s %10s\n", "threads", "sgemm_gflops", "step_gflops", "step_ms", "tok/s",
              "ratio", "ratio_cpu");
  for (int t : parse_list(threads)) {
    kernels::set_kernel_threads(t);
    TrainOptions o;
    auto model = load_model("tiny-moe");
    if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().to_string().c_str()), 1;
    o.model = *model;
    o.global_batch = strategy.empty() ? batch : 0;
    o.seq_len = seq;
    o.strategy = strategy;
    auto trainer = Trainer::create(o);
    if (!trainer.ok()) return std::fprintf(stderr, "%s\n", trainer.status().to_string().c_str()), 1;
    Best step, gemm;
    std::map<std::string, double> tasks;
    for (int i = 0; i < steps + 1; ++i) {
      const Best g = sgemm_best(size, 1);
      gemm.keep(g.wall, g.cpu);
      const double t0 = now_s(), c0 = cpu_s();
      auto s = (*trainer)->step();
      if (!s.ok()) return std::fprintf(stderr, "%s\n", s.status().to_string().c_str()), 1;
      const double w = now_s() - t0, c = cpu_s() - c0;
      if (i > 0 && w < step.wall) tasks = s->task_seconds;
      if (i > 0) step.keep(w, c);
    }
    const double flops = (*trainer)->flops_per_token() * static_cast<double>((*trainer)->tokens_per_step());
    const double gemm_flops = 2.0 * static_cast<double>(size * size * size);
    std::printf("%7d %13.1f %13.1f %10.1f %9.0f %7.2f %10.2f\n", t, gemm_flops / gemm.wall / 1e9,
                flops / step.wall / 1e9, step.wall * 1e3, static_cast<double>((*trainer)->tokens_per_step()) / step.wall,
                (flops / step.wall) / (gemm_flops / gemm.wall), (flops / step.cpu) / (gemm_flops / gemm.cpu));
    std::printf("        best step by task:");
    for (const auto& [name, sec] : tasks) std::printf(" %s %.1f ms", name.c_str(), sec * 1e3);
    std::printf("\n");
  }
  return 0;
}

}  // namespace
}  // namespace piper::runtime

int main(int argc, char** argv) { return piper::runtime::run(argc, argv); }
