// Simulator speed: DeepSeek-V3 on 1,024 H800s (pp=16, dp=ep=64, ZeRO-1, 1F1B, 32 microbatches of 4,096 tokens),
// simulated with one representative rank per pipeline rank and aggregate flows. Prints compile time, simulation
// wall and CPU time (the simulator is single-threaded; on a shared machine CPU time is the one-core figure),
// events per CPU second, and, as a baseline measured in the same run, the same model and schedule on 16 ranks
// (dp = ep = 1: no collectives). The 1,024-rank case runs twice, with FluidNet's local rate recomputation (the
// default) and with the reference (SimOptions::reference_rates: every flow at each change); the bench prints the
// CPU-time ratio and the two step times, and a third time with every pipeline slice's collective templates built
// (SimOptions::reuse_slice_templates = false, the former path) against translated ones (the default): the CPU-time
// ratio and whether the step times are identical, and a fourth time with FluidNet testing every flow in flight for
// completion at each step (SimOptions::due_filter = false, the former scan) against only the flows due (the
// default): the CPU-time ratio and whether the step times are identical. Not a test: no assertion on time.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>

#include "piper/base/check.h"
#include "piper/compile/compile.h"
#include "piper/cost/estimate.h"
#include "piper/sim/plan_exec.h"
#include "piper/sim/task_time.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Figures {
  double cpu_s = 0, step_s = 0;
};

Figures run(const piper::ModelSpec& model, int nodes, const std::string& text, bool reference = false,
            bool reuse_slices = true, bool due_filter = true) {
  auto cluster = piper::load_cluster("h800", nodes);
  PIPER_CHECK_OK(cluster.status());
  auto s = piper::Strategy::parse(text);
  PIPER_CHECK_OK(s.status());
  piper::TrainSpec train;
  train.micro_batch_size = s->mbs;
  train.seq_len = 4096;
  train.global_batch = s->global_batch();
  auto cm = piper::cost::CostModel::create(model, *cluster, train);
  PIPER_CHECK_OK(cm.status());
  auto task_time = piper::sim::cost_task_time(*cm, *s);
  PIPER_CHECK_OK(task_time.status());
  piper::compile::CompileOptions copts;
  copts.verify_each_pass = false;
  auto t0 = Clock::now();
  auto compiled = piper::compile::compile_strategy(model, train, *s, copts);
  PIPER_CHECK_OK(compiled.status());
  const double compile_s = seconds_since(t0);
  auto net = piper::sim::Network::build(*cluster);
  PIPER_CHECK_OK(net.status());
  t0 = Clock::now();
  const std::clock_t c0 = std::clock();
  piper::sim::SimOptions options;
  options.reference_rates = reference;
  options.reuse_slice_templates = reuse_slices;
  options.due_filter = due_filter;
  auto r = piper::sim::simulate_plan(compiled->plan, *net, *task_time, options);
  PIPER_CHECK_OK(r.status());
  const double sim_s = seconds_since(t0);
  const double cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  std::printf("%s on %d ranks (%zu simulated)%s%s%s\n", text.c_str(), compiled->plan.world_size, r->ranks.size(),
              reference ? ", reference rates" : "", reuse_slices ? "" : ", every slice's templates built",
              due_filter ? "" : ", every flow tested for completion");
  // Events: instructions executed + flows started (each also ends) + max-min recomputations.
  const double events = static_cast<double>(r->instructions + 2 * r->flows + r->rate_updates);
  std::printf(
      "  compile %.3f s, simulate %.3f s wall, %.3f s CPU (one thread): %lld instructions, %lld flows, "
      "%lld rate updates, %d comm templates; %.3g events, %.3g events per CPU second\n",
      compile_s, sim_s, cpu_s, static_cast<long long>(r->instructions), static_cast<long long>(r->flows),
      static_cast<long long>(r->rate_updates), r->comm_templates, events, events / cpu_s);
  std::printf("  simulated step %.17g s\n", r->step_time_s);
  return {cpu_s, r->step_time_s};
}

}  // namespace

int main(int argc, char** argv) {
  auto model = piper::load_model("deepseek-v3");
  PIPER_CHECK_OK(model.status());
  const char* big_case = "dp=64,pp=16,ep=64,zero=1,schedule=1f1b,microbatches=32";
  if (argc > 1 && std::string(argv[1]) == "--only-local") {  // for profilers: the 1,024-rank case alone
    run(*model, 128, big_case);
    return 0;
  }
  const Figures base = run(*model, 2, "dp=1,pp=16,ep=1,zero=0,schedule=1f1b,microbatches=32");
  const Figures ref = run(*model, 128, big_case, /*reference=*/true);
  const Figures rebuilt = run(*model, 128, big_case, /*reference=*/false, /*reuse_slices=*/false);
  const Figures scan_all = run(*model, 128, big_case, /*reference=*/false, /*reuse_slices=*/true, /*due_filter=*/false);
  const Figures big = run(*model, 128, big_case);
  std::printf("1,024-rank simulation / 16-rank baseline: %.0fx CPU time\n", big.cpu_s / base.cpu_s);
  std::printf("templates translated between slices / built for every slice (1,024 ranks): %.2fx CPU time; step "
              "times %s\n",
              big.cpu_s / rebuilt.cpu_s, big.step_s == rebuilt.step_s ? "identical" : "DIFFER");
  std::printf("only due flows tested / every flow tested for completion (1,024 ranks): %.2fx CPU time; step times %s\n",
              big.cpu_s / scan_all.cpu_s, big.step_s == scan_all.step_s ? "identical" : "DIFFER");
  std::printf("local rates / reference rates (1,024 ranks): %.2fx CPU time; step times differ by %.2g (relative)\n",
              big.cpu_s / ref.cpu_s, std::abs(big.step_s - ref.step_s) / ref.step_s);
  return 0;
}
