// runtime_dist_bench: the distributed runtime's overhead and DualPipeV against 1F1B, on 2 MPI ranks (one per
// core), tiny-moe through the compiled Plan (the `piper train --ranks 2` path).
//
// For each strategy, every rank runs warm-up + N steps and reports, per step, the executor's wall time and the
// wall time its compute and update tasks took (StepResult::task_seconds, all streams). Printed per rank:
//   overhead = step time / compute time       (1.0 = the rank computes all the time; the rest is waiting for
//                                               messages, the pipeline bubble, the norm and loss exchange)
// and, from the same run, dualpipev / 1f1b = median step time of dualpipev / median step time of 1f1b (below 1:
// dualpipev is faster), next to the simulator's prediction of the same ratio (src/sim on local-cpu, 2 ranks).
// Medians over the timed steps; the two strategies' steps alternate. Outside an MPI job the program re-executes itself
// under mpirun -np 2.
//
// Usage: runtime_dist_bench [--steps 8] [--seq 128] [--microbatches 8] [--mbs 2] [--ranks 2]
// Run with OMP_WAIT_POLICY=passive on a shared machine (scripts/env.sh).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "piper/comm/launch.h"
#include "piper/comm/mpi/mpi_communicator.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/trainer.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::runtime {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Measured {
  std::vector<double> step_s, compute_s;  // per rank: medians
  double loss_last = 0;
};

// Both strategies' trainers live side by side and their steps alternate (1f1b, dualpipev, 1f1b, ...), so a change
// in the machine's load hits both alike.
Result<std::vector<Measured>> measure(comm::Communicator& world, const std::vector<std::string>& strategies, int steps,
                                      int64_t seq) {
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (const std::string& strategy : strategies) {
    TrainOptions o;
    PIPER_ASSIGN_OR_RETURN(o.model, load_model("tiny-moe"));
    o.ranks = world.size();
    o.world = &world;
    o.strategy = strategy;
    o.global_batch = 0;
    o.seq_len = seq;
    PIPER_ASSIGN_OR_RETURN(auto trainer, Trainer::create(o));
    trainers.push_back(std::move(trainer));
  }
  std::vector<std::vector<double>> step_s(strategies.size()), compute_s(strategies.size());
  std::vector<Measured> out(strategies.size());
  for (int i = 0; i < steps + 1; ++i) {
    for (size_t k = 0; k < trainers.size(); ++k) {
      PIPER_ASSIGN_OR_RETURN(TrainStepStats s, trainers[k]->step());
      out[k].loss_last = s.loss;
      if (i == 0) continue;  // first touch of every buffer
      double c = 0;
      for (const auto& [task, sec] : s.task_seconds) c += sec;
      step_s[k].push_back(s.seconds);
      compute_s[k].push_back(c);
    }
  }
  for (size_t k = 0; k < trainers.size(); ++k) {
    const double mine[2] = {median(step_s[k]), median(compute_s[k])};
    std::vector<double> all(static_cast<size_t>(2 * world.size()));
    PIPER_ASSIGN_OR_RETURN(comm::Handle h, world.all_gather(mine, all.data(), sizeof(mine)));
    PIPER_RETURN_IF_ERROR(world.wait(h, 120));
    for (int r = 0; r < world.size(); ++r) {
      out[k].step_s.push_back(all[static_cast<size_t>(2 * r)]);
      out[k].compute_s.push_back(all[static_cast<size_t>(2 * r + 1)]);
    }
  }
  return out;
}

Result<double> simulated_step_s(const std::string& strategy, int ranks, int64_t seq) {
  PIPER_ASSIGN_OR_RETURN(ModelSpec model, load_model("tiny-moe"));
  PIPER_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster("local-cpu", 1));
  cluster.node.devices_per_node = ranks;
  PIPER_ASSIGN_OR_RETURN(Strategy s, Strategy::parse(strategy));
  TrainSpec train;
  train.global_batch = s.global_batch();
  train.seq_len = seq;
  train.param_dtype = train.grad_dtype = train.master_dtype = DType::kFP32;
  train.optimizer_dtype = train.activation_dtype = DType::kFP32;
  cost::Calibration cal;
  cal.workspace_bytes = 0;
  PIPER_ASSIGN_OR_RETURN(sim::SimReport r, sim::simulate(model, cluster, train, s, cal));
  return r.step_time_s;
}

Status bench(int steps, int64_t seq, int microbatches, int mbs);

Status run(const std::vector<std::string>& args) {
  int steps = 8, microbatches = 8, mbs = 2, ranks = 2;
  int64_t seq = 128;
  for (size_t i = 1; i < args.size(); i += 2) {
    if (i + 1 >= args.size()) return invalid_argument("runtime_dist_bench: " + args[i] + " needs a value");
    const std::string& f = args[i];
    const int v = std::atoi(args[i + 1].c_str());
    if (f == "--steps")
      steps = v;
    else if (f == "--seq")
      seq = v;
    else if (f == "--microbatches")
      microbatches = v;
    else if (f == "--mbs")
      mbs = v;
    else if (f == "--ranks")
      ranks = v;
    else
      return invalid_argument("runtime_dist_bench: unknown flag " + f + " (see the usage at the top of the source)");
  }
  if (steps < 1 || seq < 1 || microbatches < 1 || mbs < 1 || ranks < 2) {
    return invalid_argument("runtime_dist_bench: --steps, --seq, --microbatches, --mbs must be >= 1, --ranks >= 2");
  }
  if (!comm::launched_by_mpi()) {
    comm::MpirunOptions launch;
    launch.ranks = ranks;
    std::vector<std::string> argv = args;
    PIPER_ASSIGN_OR_RETURN(argv[0], comm::self_executable());
    return comm::exec_under_mpirun(launch, argv);
  }
  PIPER_RETURN_IF_ERROR(comm::mpi_init(nullptr, nullptr));
  PIPER_RETURN_IF_ERROR(bench(steps, seq, microbatches, mbs));  // frees its communicators before finalising
  return comm::mpi_finalize();
}

Status bench(int steps, int64_t seq, int microbatches, int mbs) {
  PIPER_ASSIGN_OR_RETURN(auto world, comm::mpi_world());
  kernels::set_kernel_threads(1);  // one core per rank
  const bool print = world->rank() == 0;
  const std::string common = "pp=" + std::to_string(world->size()) + ",microbatches=" + std::to_string(microbatches) +
                             ",mbs=" + std::to_string(mbs);
  const std::vector<std::string> schedules = {"1f1b", "dualpipev"};
  if (print) {
    double load = 0;
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%lf", &load) != 1) load = 0;
      std::fclose(f);
    }
    std::printf(
        "runtime_dist_bench: tiny-moe, %d ranks (1 kernel thread each), %s, seq %lld, %d timed steps, "
        "load average %.1f\n",
        world->size(), common.c_str(), static_cast<long long>(seq), steps, load);
    std::printf("%-10s %4s %10s %11s %9s %10s\n", "schedule", "rank", "step_ms", "compute_ms", "overhead", "loss");
  }
  std::vector<std::string> strategies;
  for (const std::string& sched : schedules) strategies.push_back(common + ",schedule=" + sched);
  PIPER_ASSIGN_OR_RETURN(std::vector<Measured> measured, measure(*world, strategies, steps, seq));
  std::vector<double> step_of, sim_of;
  for (size_t k = 0; k < strategies.size(); ++k) {
    const Measured& m = measured[k];
    step_of.push_back(*std::max_element(m.step_s.begin(), m.step_s.end()));
    PIPER_ASSIGN_OR_RETURN(double sim_s, simulated_step_s(strategies[k], world->size(), seq));
    sim_of.push_back(sim_s);
    if (!print) continue;
    for (int r = 0; r < world->size(); ++r) {
      const double st = m.step_s[static_cast<size_t>(r)], c = m.compute_s[static_cast<size_t>(r)];
      std::printf("%-10s %4d %10.1f %11.1f %9.2f %10.4f\n", schedules[k].c_str(), r, st * 1e3, c * 1e3,
                  c > 0 ? st / c : 0, m.loss_last);
    }
  }
  if (print) {
    std::printf("dualpipev / 1f1b step time: measured %.2f, simulated %.2f (simulated steps %.1f ms and %.1f ms)\n",
                step_of[1] / step_of[0], sim_of[1] / sim_of[0], sim_of[0] * 1e3, sim_of[1] * 1e3);
  }
  return ok_status();
}

}  // namespace
}  // namespace piper::runtime

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  piper::Status st = piper::runtime::run(args);
  if (!st.ok()) {
    std::fprintf(stderr, "runtime_dist_bench: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
