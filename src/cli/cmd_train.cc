// piper train: training through the compiled Plan (src/runtime/trainer.h; the loop is runtime::run_training), on
// one rank or, with --ranks R > 1, on R MPI ranks: outside an MPI job the command re-executes itself under
// mpirun (comm/launch.h: root and oversubscription flags); under an outside mpirun/srun it joins the job. Rank 0 prints; any rank's error is
// printed with its rank and the job exits non-zero (mpirun then stops the other ranks).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "piper/balance/expert_loads.h"
#include "piper/base/files.h"
#include "piper/base/hash.h"
#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/base/units.h"
#include "piper/cli/calibration_file.h"
#include "piper/cli/command.h"
#include "piper/cli/directive_input.h"
#include "piper/cli/flags.h"
#include "piper/cli/local_plan.h"
#include "piper/cli/train_gpu.h"
#include "piper/cli/train_report.h"
#include "piper/comm/launch.h"
#include "piper/comm/mpi/mpi_communicator.h"
#include "piper/cost/task_profile.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/exec/process_memory.h"
#include "piper/runtime/exec/trace.h"
#include "piper/runtime/trainer.h"
#include "piper/runtime/training_run.h"
#include "piper/spec/model_loader.h"
#include "piper/spec/train_spec.h"

namespace piper::cli {
namespace {

struct TrainCliOptions {
  std::string precision;  // "" = not given; only the runtime's own format is accepted (see the flag's check)
  std::string model = "tiny-moe";
  int ranks = 0;  // 0: not given (the MPI job's size, or 1 outside one)
  std::string data;
  int64_t steps = 20;
  int64_t global_batch = 0;  // 0: not given (16, or the strategy's)
  int64_t seq_len = 128;
  uint64_t seed = 1234;
  std::string strategy;
  std::string directives, mesh;  // --directives FILE --mesh M instead of --strategy
  double lr = 3e-3;
  int64_t warmup = 10;
  int threads = 0;         // 0: not given (all cores, shared by this machine's ranks)
  int ranks_per_node = 0;  // 0: not given (the MPI job's local size; HALO exchanges)
  std::string save;
  int64_t save_every = 0;  // 0: not given (only at the end)
  std::string resume;
  std::string trace;
  std::string sim_trace;
  std::string record_expert_loads;  // --record-expert-loads FILE (balance/expert_loads.h)
  std::string expert_loads;  // --expert-loads FILE: an earlier run's loads, for the predictions and --strategy auto
  std::string calibration;
  std::string comm_calibration;
  bool json = false;
  runtime::MigrationOptions migration;
  double router_skew = 0;
  std::string device = "cpu";  // cpu | cuda (single-rank GPU trainer, cli/train_gpu.h)
};

Json memory_json(const MemoryStats& m) {
  Json j;
  for (int c = 0; c < kNumMemCategories; ++c) j[to_string(static_cast<MemCategory>(c))] = m.peak_bytes[c];
  j["total"] = m.peak_total_bytes;
  return j;
}

Json predicted_json(const cost::MemoryBreakdown& m) {
  return Json{{"parameters", m.params},   {"gradients", m.grads},  {"optimizer", m.optimizer},
              {"activations", m.activations}, {"buffers", m.buffers}, {"total", m.total()}};
}

// Kernel threads of this rank: --threads, or the machine's cores shared by its ranks.
void set_rank_threads(const TrainCliOptions& o, comm::Communicator* world) {
  if (o.threads > 0) {
    kernels::set_kernel_threads(o.threads);
  } else if (world != nullptr && world->size() > 1) {
    kernels::set_kernel_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / world->size()));
  }
}

// The trainer's options from the flags; `auto_note` says what --strategy auto chose.
Result<runtime::TrainOptions> train_options(const TrainCliOptions& o, comm::Communicator* world, std::string* auto_note) {
  runtime::TrainOptions t;
  PIPER_ASSIGN_OR_RETURN(t.model, load_model(o.model));
  t.ranks = world != nullptr ? world->size() : 1;
  t.world = world;
  t.strategy = o.strategy;
  t.global_batch = o.global_batch > 0 ? o.global_batch : (o.strategy.empty() ? 16 : 0);
  if (!o.directives.empty()) {
    PIPER_ASSIGN_OR_RETURN(DirectiveInput in, load_directive_input(t.model, o.strategy, o.directives, o.mesh,
                                                                   o.global_batch, t.ranks));
    t.directives = std::move(in.directives);
    t.mesh = in.mesh;
    t.global_batch = o.global_batch;  // 0: one sequence per microbatch
    if (o.device == "cuda") return invalid_argument("--directives runs on --device cpu; drop --device cuda");
  }
  if (o.strategy == "auto") {
    // The planner's best strategy that the runtime executes, for these ranks on this machine. Every rank plans
    // (a pure function of the same inputs); DistContext's plan hash check catches any disagreement.
    t.global_batch = o.global_batch > 0 ? o.global_batch : 16;
    PIPER_ASSIGN_OR_RETURN(AutoStrategy a, auto_strategy(t.model, t.ranks, kernels::kernel_threads(), t.global_batch,
                                                         o.seq_len, o.calibration, o.comm_calibration, o.expert_loads));
    t.strategy = a.strategy.to_string();
    const std::string loads = o.expert_loads.empty() ? "" : " --expert-loads " + o.expert_loads;
    *auto_note = "  (--strategy auto: `piper plan --local-ranks " + std::to_string(t.ranks) + " --runnable" + loads +
                 "` #1 of " + std::to_string(a.scored) + " scored, predicted step " + format_seconds(a.step_time_s) +
                 ")";
  }
  t.seq_len = o.seq_len;
  t.seed = o.seed;
  t.data = o.data;
  t.optimizer.lr = o.lr;
  t.warmup_steps = o.warmup;
  t.ranks_per_node = o.ranks_per_node;
  t.migration = o.migration;
  t.model_options.router_skew = o.router_skew;
  return t;
}

// Resume and --save's probe, both collective, before the first step.
Status prepare_checkpoints(const TrainCliOptions& o, runtime::Trainer& trainer, bool quiet) {
  if (!o.record_expert_loads.empty() && trainer.strategy().ep < 2) {
    return invalid_argument("--record-expert-loads: the strategy has ep=1; expert loads are gathered over the "
                            "expert-parallel ranks: use ep >= 2");
  }
  if (!o.save.empty()) PIPER_RETURN_IF_ERROR(trainer.prepare_save(o.save));  // before the first step
  if (o.resume.empty()) return ok_status();
  PIPER_RETURN_IF_ERROR(trainer.resume(o.resume));
  if (!o.json && !quiet) {
    const CheckpointMeta& r = trainer.resumed();
    std::printf("resumed   from %s: step %lld, written by %d rank(s) under %s\n", trainer.resumed_dir().c_str(),
                static_cast<long long>(r.step), r.world_size, r.strategy.c_str());
  }
  return ok_status();
}

void print_header(const TrainCliOptions& o, runtime::Trainer& trainer, const std::string& auto_note) {
  const auto& plan = trainer.compiled().plan;
  std::printf("model     %s (%s trainable parameters)\n", trainer.options().model.name.c_str(),
              format_count(static_cast<double>(trainer.num_params())).c_str());
  std::printf("strategy  %s%s\n", trainer.strategy().to_string().c_str(), auto_note.c_str());
  if (!o.directives.empty()) std::printf("directives %s (compiled as written)\n", o.directives.c_str());
  std::printf("plan      %zu instructions on %zu stream(s) on rank 0, %d microbatches per rank\n",
              plan.program(0).num_instructions(), plan.program(0).streams.size(),
              trainer.executor().num_microbatches());
  if (trainer.dist() != nullptr) {
    std::printf("ranks     %d MPI ranks (pp=%d dp=%d ep=%d tp=%d), plan hash %016llx equal on every rank\n",
                plan.world_size, plan.mesh.pp, plan.mesh.dp, plan.mesh.ep, plan.mesh.tp,
                static_cast<unsigned long long>(compile::plan_hash(plan)));
  }
  std::printf("batch     %lld x %lld tokens per step, data %s, seed %llu%s\n",
              static_cast<long long>(trainer.options().global_batch), static_cast<long long>(o.seq_len),
              o.data.empty() ? "(default corpus)" : o.data.c_str(), static_cast<unsigned long long>(o.seed),
              o.resume.empty() ? "" : (", resumed at step " + std::to_string(trainer.steps_done())).c_str());
}

void print_step(const runtime::TrainStepStats& s, bool expert_parallel) {
  char imb[40] = "";
  if (expert_parallel) std::snprintf(imb, sizeof(imb), "  imbalance %.2f", s.imbalance);
  std::printf("step %5lld  loss %.4f  aux %.4f  |g| %.3f  %8.0f tok/s  %6.2f GFLOP/s  %.3f s%s\n",
              static_cast<long long>(s.step), s.loss, s.aux_loss, s.grad_norm, s.tokens_per_s, s.flops_per_s / 1e9,
              s.seconds, imb);
  if (s.migrated_experts > 0) {
    std::printf("migrate   after step %lld: %d expert(s) moved, window imbalance %.3f -> %.3f, %.2f ms\n",
                static_cast<long long>(s.step), s.migrated_experts, s.window_imbalance_before,
                s.window_imbalance_after, s.migration_seconds * 1e3);
  }
  std::fflush(stdout);
}

Json steps_json(const runtime::RunSummary& r) {
  Json steps = Json::array();
  for (const runtime::StepRecord& s : r.steps) {
    steps.push_back(Json{{"step", s.step}, {"loss", s.loss}, {"aux_loss", s.aux_loss}, {"grad_norm", s.grad_norm},
                         {"seconds", s.seconds}});
    if (r.expert_parallel) {
      steps.back()["imbalance"] = s.imbalance;
      steps.back()["migrated_experts"] = s.migrated_experts;
      steps.back()["migration_seconds"] = s.migration_seconds;
    }
  }
  return steps;
}

// Rank 0's CPU per step beyond its streams': its main thread's and the MPI library's threads'.
double rest_of_process_cpu_s(const runtime::RunSummary& r) {
  double rest = r.mine.cpu_s;
  for (const auto& [stream, cpu] : r.stream_cpu_s) rest -= cpu;
  return rest;
}

// The simulation's CPU per step of rank 0's stream `name` (PredictionReport::sim_stream_cpu_s); < 0: none.
double simulated_stream_cpu_s(const PredictionReport& p, const std::string& name) {
  for (const auto& [stream, cpu] : p.sim_stream_cpu_s) {
    if (stream == name) return cpu;
  }
  return -1;
}

// Rank 0's CPU per step by stream, and the rest of its process; the simulation's by stream where it priced CPU.
Json stream_cpu_json(const runtime::RunSummary& r, const PredictionReport& p) {
  Json streams = Json::object(), simulated = Json::object();
  for (const auto& [stream, cpu] : r.stream_cpu_s) streams[stream] = cpu;
  for (const auto& [stream, cpu] : p.sim_stream_cpu_s) simulated[stream] = cpu;
  return Json{{"streams", streams},
              {"process_s", r.mine.cpu_s},
              {"rest_s", rest_of_process_cpu_s(r)},
              {"simulated_streams", simulated}};
}

void print_stream_cpu(const runtime::RunSummary& r, const PredictionReport& p) {
  std::string line;
  for (const auto& [stream, cpu] : r.stream_cpu_s) {
    line += (line.empty() ? "" : ", ") + stream + " " + format_seconds(cpu);
    const double sim = simulated_stream_cpu_s(p, stream);
    if (sim >= 0) line += " (sim " + format_seconds(sim) + ")";
  }
  std::printf("cpu       rank 0 per step by stream: %s; rest of the process (main thread, MPI) %s\n", line.c_str(),
              format_seconds(rest_of_process_cpu_s(r)).c_str());
}

void print_json_report(const TrainCliOptions& o, runtime::Trainer& trainer, const runtime::RunSummary& r,
                       const PredictionReport& prediction, const std::optional<PredictionReport>& own) {
  const auto& plan = trainer.compiled().plan;
  const MemoryStats mem = trainer.memory();
  Json j{{"model", trainer.options().model.name},
         {"strategy", trainer.strategy().to_string()},
         {"strategy_auto", o.strategy == "auto"},
         {"steps", steps_json(r)},
         {"loss_first", r.loss_first},
         {"loss_last", r.loss_last},
         {"tokens_per_s", r.tokens_per_s},
         {"achieved_flops", r.achieved_flops},
         {"peak_memory_bytes", mem.peak_total_bytes},
         {"predicted_peak_memory_bytes", trainer.predicted_memory().total()},
         {"peak_memory", memory_json(mem)},
         {"predicted_memory", predicted_json(trainer.predicted_memory())},
         {"plan_activation_peak_bytes", trainer.executor().planned_peak_bytes()},
         {"pool_reserved_peak_bytes", trainer.reserved_peak_bytes()},
         {"seconds", r.seconds},
         {"ranks", plan.world_size},
         {"plan_hash", hex64(compile::plan_hash(plan))}};
  j["predicted_vs_measured"] = prediction.to_json();
  if (own) j["predicted_vs_measured_own_expert_loads"] = own->to_json();
  j["cpu_per_step"] = stream_cpu_json(r, prediction);
  if (!o.trace.empty()) j["trace"] = o.trace;
  if (!o.record_expert_loads.empty()) j["expert_loads"] = o.record_expert_loads;
  if (!o.save.empty()) j["saved"] = o.save;
  if (r.expert_parallel) {
    j["experts"] = Json{{"imbalance_first_window", r.imbalance_first},
                        {"imbalance_last_window", r.imbalance_last},
                        {"window_steps", r.window},
                        {"migrate", trainer.options().migration.enabled},
                        {"migrations", r.migrations},
                        {"migrated_experts", r.migrated_experts},
                        {"migration_seconds", r.migration_seconds},
                        {"migration_share", r.migration_share}};
  }
  print_json(j.dump(2));
}

void print_memory(const TrainCliOptions& o, runtime::Trainer& trainer) {
  const MemoryStats mem = trainer.memory();
  const double predicted = trainer.predicted_memory().total();
  const auto peak = static_cast<long long>(mem.peak_total_bytes);
  const std::string peak_text = format_bytes(static_cast<double>(mem.peak_total_bytes));
  if (predicted <= 0) {  // af-pipe: estimate() has no model (the report below compares with the plan's peak)
    std::printf("peak_memory_bytes %lld (%s)  predicted_peak_memory_bytes: none (no resource model of %s)\n", peak,
                peak_text.c_str(),
                o.directives.empty() ? trainer.strategy().schedule.c_str() : "the directive file's own schedule");
  } else {
    std::printf("peak_memory_bytes %lld (%s)  predicted_peak_memory_bytes %.0f (%s, %+.1f %%)\n", peak,
                peak_text.c_str(), predicted, format_bytes(predicted).c_str(),
                100.0 * (static_cast<double>(mem.peak_total_bytes) - predicted) / predicted);
  }
  std::printf("  by category (measured peak / predicted):");
  const cost::MemoryBreakdown& p = trainer.predicted_memory();
  const double pred[] = {p.params, p.grads, p.optimizer, p.activations, p.buffers};
  for (int c = 0; c < kNumMemCategories; ++c) {
    std::printf(" %s %s / %s", to_string(static_cast<MemCategory>(c)),
                format_bytes(static_cast<double>(mem.peak_bytes[c])).c_str(), format_bytes(pred[c]).c_str());
  }
  std::printf("\n");
}

void print_text_report(const TrainCliOptions& o, runtime::Trainer& trainer, const runtime::RunSummary& r,
                       const PredictionReport& prediction) {
  std::printf("\nloss_first %.4f  loss_last %.4f  (%lld steps, %.1f s)\n", r.loss_first, r.loss_last,
              static_cast<long long>(o.steps), r.seconds);
  std::printf("tokens_per_s %.0f  achieved_flops %s\n", r.tokens_per_s, format_si(r.achieved_flops, "FLOP/s").c_str());
  print_memory(o, trainer);
  prediction.print();
  print_stream_cpu(r, prediction);
  if (r.expert_parallel) {
    std::printf("experts   imbalance (max/mean tokens per ep rank, mean of %zu steps) first %.3f  last %.3f\n",
                r.window, r.imbalance_first, r.imbalance_last);
    if (trainer.options().migration.enabled) {
      std::printf("migration %d migration(s), %d expert(s) moved, %.3f s = %.2f %% of training time (rank 0)\n",
                  r.migrations, r.migrated_experts, r.migration_seconds, 100.0 * r.migration_share);
    }
  }
  if (!o.trace.empty()) std::printf("trace     %s (measured timeline, Chrome/Perfetto)\n", o.trace.c_str());
  if (!o.record_expert_loads.empty()) {
    std::printf("experts   loads of %lld step(s) written to %s (estimate/simulate --expert-loads)\n",
                static_cast<long long>(trainer.expert_loads().steps), o.record_expert_loads.c_str());
  }
  if (!o.save.empty()) {
    std::printf("checkpoint saved to %s/%s\n", o.save.c_str(), checkpoint_step_name(trainer.steps_done()).c_str());
  }
}

// --expert-loads FILE, checked against the trainer's model and priced for its ep (nullopt without the flag).
Result<std::optional<PredictionLoads>> given_loads(const TrainCliOptions& o, const runtime::Trainer& trainer) {
  if (o.expert_loads.empty()) return std::optional<PredictionLoads>();
  PIPER_ASSIGN_OR_RETURN(balance::ExpertLoads loads, balance::load_expert_loads(o.expert_loads));
  PredictionLoads p;
  p.label = o.expert_loads + " (an earlier run)";
  PIPER_ASSIGN_OR_RETURN(p.loads,
                         measured_loads(loads, o.expert_loads, trainer.options().model, trainer.strategy().ep));
  return std::optional<PredictionLoads>(std::move(p));
}

// The loads this run measured (what --record-expert-loads writes), placed contiguously as the plan places them.
Result<PredictionLoads> own_loads(const runtime::Trainer& trainer) {
  PredictionLoads p;
  p.label = "this run's own (" + std::to_string(trainer.expert_loads().steps) + " steps" +
            (trainer.options().migration.enabled ? ", contiguous placement: --migrate's moves not followed)" : ")");
  PIPER_ASSIGN_OR_RETURN(
      p.loads, measured_loads(trainer.expert_loads(), "(this run)", trainer.options().model, trainer.strategy().ep));
  p.first_step = trainer.expert_loads().steps > 1 ? 1 : 0;  // the timed steps (runtime/training_run.cc)
  return p;
}

Status train(const TrainCliOptions& o, comm::Communicator* world) {
  const bool quiet = world != nullptr && world->rank() != 0;
  if (!quiet) kernels::warn_gemm_environment();
  set_rank_threads(o, world);
  std::string auto_note;
  PIPER_ASSIGN_OR_RETURN(runtime::TrainOptions t, train_options(o, world, &auto_note));
  if (o.device == "cuda") return train_gpu(t, o.steps, o.json);
  // The machine the predictions are for; loaded now so that a bad calibration file fails before training. Its
  // prices annotate the plan the ranks run, and the prediction simulates that plan (predict_vs_measured).
  PIPER_ASSIGN_OR_RETURN(HostLayout hosts, host_layout(world));
  PIPER_ASSIGN_OR_RETURN(LocalMachine machine,
                         local_cluster(t.ranks, kernels::kernel_threads(), o.calibration, o.comm_calibration, hosts));
  cost::apply_model_sharing(&machine.calibration, t.model, t.seq_len);
  machine.calibration_source = with_task_profile(machine.calibration_source, machine.calibration, t.model, t.seq_len);
  t.plan_prices = local_plan_prices(machine, t.model);
  PIPER_ASSIGN_OR_RETURN(auto trainer, runtime::Trainer::create(t));
  PIPER_RETURN_IF_ERROR(prepare_checkpoints(o, *trainer, quiet));
  if (!o.json && !quiet) print_header(o, *trainer, auto_note);
  runtime::RunOptions run;
  run.steps = o.steps;
  run.save_dir = o.save;
  run.save_every = o.save_every;
  run.trace = !o.trace.empty();
  const bool expert_parallel = trainer->expert_parallel();
  if (!o.json && !quiet) run.on_step = [&](const runtime::TrainStepStats& s) { print_step(s, expert_parallel); };
  PIPER_ASSIGN_OR_RETURN(runtime::RunSummary r, runtime::run_training(*trainer, run));
  if (quiet) return ok_status();
  const auto& plan = trainer->compiled().plan;
  if (!o.trace.empty()) PIPER_RETURN_IF_ERROR(write_train_trace(o.trace, plan, r.timelines, r.mine.step_time_s));
  if (!o.record_expert_loads.empty()) {
    PIPER_RETURN_IF_ERROR(balance::save_expert_loads(o.record_expert_loads, trainer->expert_loads()));
  }
  PIPER_ASSIGN_OR_RETURN(std::optional<PredictionLoads> given, given_loads(o, *trainer));
  PIPER_ASSIGN_OR_RETURN(PredictionReport prediction,
                         predict_vs_measured(*trainer, machine, r.measured, given ? &*given : nullptr,
                                                             o.sim_trace));
  // The same prediction with this run's own loads: a second report, which never fails the run (a note says why
  // it is missing).
  std::optional<PredictionReport> own;
  std::string own_missing;
  if (trainer->expert_loads().steps > 0) {  // an expert-parallel run (the ep executor's or af-pipe's)
    Result<PredictionReport> got = [&]() -> Result<PredictionReport> {
      PIPER_ASSIGN_OR_RETURN(PredictionLoads mine, own_loads(*trainer));
      return predict_vs_measured(*trainer, machine, r.measured, &mine);
    }();
    if (got.ok()) {
      own = std::move(got).value();
      own->title = "predicted vs measured with this run's own measured expert loads (known only after the run)";
    } else {
      own_missing = "no prediction with this run's own expert loads: " + got.status().message();
    }
  }
  if (o.json) {
    print_json_report(o, *trainer, r, prediction, own);
  } else {
    print_text_report(o, *trainer, r, prediction);
    if (own) own->print();
    if (!own_missing.empty()) std::printf("%s\n", own_missing.c_str());
  }
  return ok_status();
}

// The strategy (the default one too) must be for exactly --ranks ranks; the trainer checks it again on every rank.
Status check_ranks_before_launch(const TrainCliOptions& o) {
  if (o.strategy == "auto") return ok_status();  // the planner sizes it for --ranks
  PIPER_ASSIGN_OR_RETURN(ModelSpec model, load_model(o.model));
  PIPER_RETURN_IF_ERROR(check_seq_len(model, o.seq_len));
  if (!o.directives.empty()) {
    return load_directive_input(model, o.strategy, o.directives, o.mesh, o.global_batch, o.ranks).status();
  }
  const int64_t batch = o.global_batch > 0 || !o.strategy.empty() ? o.global_batch : 16;
  PIPER_ASSIGN_OR_RETURN(Strategy s, runtime::train_strategy(o.strategy, batch));
  PIPER_RETURN_IF_ERROR(s.validate());
  if (s.world_size() == o.ranks) {
    // The rules against the model and the sequence (heads, experts, token slices), once here, not once per rank.
    TrainSpec train;
    train.micro_batch_size = s.mbs;
    train.seq_len = o.seq_len;
    return s.validate_for(model, train, o.ranks);
  }
  std::string fix = "give --ranks " + std::to_string(s.world_size());
  if (!s.disaggregate && o.ranks % (s.tp * s.pp) == 0) fix += " or set dp=" + std::to_string(o.ranks / (s.tp * s.pp));
  return invalid_argument("--ranks " + std::to_string(o.ranks) + " but strategy '" + elide(s.to_string()) +
                          "' runs on " + std::to_string(s.world_size()) + " rank(s) (dp*tp*pp); " + fix);
}

// An output file's directory must exist before training starts, not be found missing after the last step.
Status check_output_directory(const std::string& flag, const std::string& path) {
  if (path.empty()) return ok_status();
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir)) {
    return invalid_argument(flag + " " + elide(path) + ": directory '" + elide(dir.string()) +
                            "' does not exist; create it or write the file elsewhere");
  }
  return ok_status();
}

// --expert-loads: readable, and of this model, before any rank starts (its ep is checked after the plan).
Status check_expert_loads_flag(const TrainCliOptions& o) {
  if (o.expert_loads.empty()) return ok_status();
  if (o.device == "cuda") {
    return invalid_argument("--expert-loads prices the CPU ranks' predictions; drop --device cuda");
  }
  PIPER_ASSIGN_OR_RETURN(balance::ExpertLoads loads, balance::load_expert_loads(o.expert_loads));
  PIPER_ASSIGN_OR_RETURN(ModelSpec model, load_model(o.model));
  return measured_loads(loads, o.expert_loads, model, 1).status();
}

Status run_train(const TrainCliOptions& o) {
  runtime::keep_freed_memory();  // before MPI's and the runtime's threads (runtime/exec/process_memory.h)
  if (o.device != "cpu" && o.device != "cuda") {
    return invalid_argument("--device must be cpu or cuda, got '" + o.device + "'");
  }
  if (o.device == "cuda") {
    PIPER_RETURN_IF_ERROR(
        check_gpu_train_flags(o.ranks, o.strategy, !o.save.empty(), !o.resume.empty(), !o.trace.empty()));
  }
  PIPER_RETURN_IF_ERROR(check_output_directory("--trace", o.trace));
  PIPER_RETURN_IF_ERROR(check_output_directory("--sim-trace", o.sim_trace));
  PIPER_RETURN_IF_ERROR(check_output_directory("--record-expert-loads", o.record_expert_loads));
  PIPER_RETURN_IF_ERROR(check_expert_loads_flag(o));
  if (o.device == "cuda" && !o.record_expert_loads.empty()) {
    return invalid_argument("--record-expert-loads is recorded by the CPU ranks' trainer; drop --device cuda");
  }
  if (o.save_every > 0 && o.save.empty()) return invalid_argument("--save-every needs --save DIR");
  if (!o.mesh.empty() && o.directives.empty()) {
    return invalid_argument("--mesh is for --directives; a strategy carries its mesh: drop --mesh");
  }
  if (!o.directives.empty() && (!o.strategy.empty() || o.mesh.empty())) {
    return load_directive_input(ModelSpec{}, o.strategy, o.directives, o.mesh, 0, 0).status();  // names the fix
  }
  if (comm::launched_by_mpi()) {
    PIPER_RETURN_IF_ERROR(comm::mpi_init(nullptr, nullptr));
    int rank = 0;
    Status st = [&]() -> Status {
      PIPER_ASSIGN_OR_RETURN(auto world, comm::mpi_world());
      rank = world->rank();
      if (o.ranks != 0 && o.ranks != world->size()) {
        return invalid_argument("--ranks " + std::to_string(o.ranks) + " but this MPI job has " +
                                std::to_string(world->size()) + " ranks; drop --ranks or make them equal");
      }
      return train(o, world.get());
    }();
    // A failed rank exits without finalising: mpirun then stops the others instead of letting them wait.
    if (!st.ok()) return st.with_context("rank " + std::to_string(rank));
    return comm::mpi_finalize();
  }
  if (o.ranks > 1) {
    // Checked here, once, before mpirun starts --ranks copies that would each print the same error.
    PIPER_RETURN_IF_ERROR(check_ranks_before_launch(o));
    PIPER_ASSIGN_OR_RETURN(auto argv, comm::self_argv());
    comm::MpirunOptions launch;
    launch.ranks = o.ranks;
    // A child, not exec: when the job fails, one line says which rank died or stopped (comm/launch.h).
    return comm::run_under_mpirun(launch, argv);
  }
  return train(o, nullptr);
}

PIPER_REGISTER_COMMAND(g_train, "train", "Train a model through its compiled Plan, on one rank or on --ranks MPI ranks", [](CLI::App* sub) {
  auto o = std::make_shared<TrainCliOptions>();
  sub->add_option("--model", o->model, "model preset or config file")->capture_default_str();
  add_int_option(sub, "--ranks", &o->ranks,
                 {1, kMaxLocalRanks, "MPI ranks; mpirun starts them on this machine, which they share"},
                 "MPI ranks; > 1 starts mpirun on this machine (default: the MPI job's size, or 1)");
  sub->add_option("--data", o->data, "text file, .u16/.bin/.tokens file or directory (default: Debian fortunes)");
  add_int_option(sub, "--steps", &o->steps, {1, kMaxSteps, "optimizer steps"}, "optimizer steps")
      ->capture_default_str();
  add_int_option(sub, "--global-batch", &o->global_batch, {1, kMaxGlobalBatch, "sequences per step"},
                 "sequences per step (default 16, or the strategy's)");
  add_int_option(sub, "--seq", &o->seq_len, {1, kMaxSeqLen, "tokens per sequence; at most the model's max_seq_len"},
                 "sequence length")
      ->capture_default_str();
  add_int_option(sub, "--seed", &o->seed, {0, INT64_MAX, "a non-negative 63-bit integer"},
                 "seed of the initial weights and the data order")
      ->capture_default_str();
  sub->add_option("--strategy", o->strategy, "strategy, e.g. schedule=zb-h1,microbatches=4,mbs=4 (default 1f1b), or auto: the planner's best that the "
                  "runtime runs on these ranks (piper plan --local-ranks R --runnable)");
  sub->add_option("--directives", o->directives, "a directive file instead of --strategy (docs/directives.md)");
  sub->add_option("--mesh", o->mesh, "with --directives: pp=P[,vpp=V,dp=D,ep=E,tp=T]");
  add_real_option(sub, "--lr", &o->lr, {0, kMaxLearningRate, true, "AdamW's peak learning rate"},
                  "peak learning rate (AdamW)")
      ->capture_default_str();
  add_int_option(sub, "--warmup", &o->warmup, {0, kMaxSteps, "linear warm-up steps"}, "linear warm-up steps")
      ->capture_default_str();
  add_int_option(sub, "--threads", &o->threads, {1, kMaxThreads, "kernel threads per rank"},
                 "kernel threads (default: all cores, shared by this machine's ranks)");
  add_int_option(sub, "--ranks-per-node", &o->ranks_per_node, {1, kMaxLocalRanks, "ranks per emulated node"},
                 "ranks per emulated node for a2a=halo (node-major; default: the MPI job's local size)");
  sub->add_option("--save", o->save, "write checkpoints under this directory (DIR/step-N, DIR/latest) at the end");
  add_int_option(sub, "--save-every", &o->save_every, {1, kMaxSteps, "steps between checkpoints"},
                 "also write a checkpoint every N steps (default: only at the end)");
  sub->add_option("--resume", o->resume, "resume from a checkpoint (a --save DIR, or one of its step-N directories)");
  sub->add_option("--trace", o->trace, "write the measured timeline of every rank as a Chrome/Perfetto trace");
  sub->add_option("--sim-trace", o->sim_trace,
                  "write the simulated step of the same plan (every rank) as a Chrome/Perfetto trace");
  sub->add_option("--record-expert-loads", o->record_expert_loads,
                  "write the tokens every routed expert received over the run (ep >= 2) for estimate/simulate "
                  "--expert-loads (docs/balance.md)");
  sub->add_option("--expert-loads", o->expert_loads,
                  "expert loads recorded by an earlier run (--record-expert-loads) for the predictions: the simulation "
                  "prices each ep rank's experts from its own share, the model every rank as the busiest; with "
                  "--strategy auto the planner prices every candidate from them too");
  sub->add_option("--calibration", o->calibration,
                  "device calibration JSON for the predictions (src/cost/device_model.h)");
  sub->add_option("--comm-calibration", o->comm_calibration,
                  "link calibration for the predictions (`piper bench comm --calibration-out F`)");
  sub->add_flag("--migrate", o->migration.enabled,
                "expert-parallel runs: move experts between the ranks of each ep group when their loads are imbalanced "
                "(docs/balance.md)");
  add_int_option(sub, "--migrate-window", &o->migration.window_steps, {1, 1000000, "steps of expert load"},
                 "--migrate: steps of expert load the planner reads; it plans every this many steps")
      ->capture_default_str();
  add_real_option(sub, "--migrate-threshold", &o->migration.threshold,
                  {1, 1000000, false, "max/mean tokens per ep rank, >= 1"},
                  "--migrate: plan a layer when its max/mean tokens per ep rank over the window exceeds this")
      ->capture_default_str();
  add_int_option(sub, "--migrate-horizon", &o->migration.horizon_steps, {0, 1000000, "steps; 0 = the window"},
                 "--migrate: steps a new placement is expected to serve; a move is made when its saving over them "
                  "exceeds its cost (0 = the window)")
      ->capture_default_str();
  add_real_option(sub, "--router-skew", &o->router_skew, {0, 100, false, "added router logit"},
                  "testing: routers prefer low-index experts by this much (selection only) to make loads imbalanced")
      ->capture_default_str();
  sub->add_flag("--json", o->json, "print one JSON object");
  sub->add_option("--device", o->device, "cpu, or cuda: one GPU, bf16 GEMMs with fp32 master weights (docs/gpu.md)")
      ->capture_default_str();
  sub->add_option("--precision", o->precision,
                  "training precision the runtime runs: fp32 on cpu, bf16 with --device cuda (fp8 and mxfp8: "
                  "estimate, simulate and plan model them; the runtime has no fp8 kernels)");
  return std::function<Status()>([o] {
    if (!o->precision.empty()) {
      PIPER_ASSIGN_OR_RETURN(const Precision p, parse_precision(o->precision, "--precision"));
      if (p != Precision::kBF16 || o->device != "cuda") {
        return invalid_argument(
            "--precision " + o->precision + " with --device " + o->device +
            ": the runtime trains fp32 on cpu and bf16 GEMMs on cuda, and has no fp8 kernels; " +
            "drop --precision (or use bf16 with --device cuda), or model fp8 with piper estimate, " +
            "simulate or plan --precision " + o->precision);
      }
    }
    return run_train(*o);
  });
});

}  // namespace
}  // namespace piper::cli
