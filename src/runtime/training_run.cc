#include "piper/runtime/training_run.h"

#include <algorithm>
#include <memory>
#include <string>

#include "piper/base/clock.h"

namespace piper::runtime {
namespace {

constexpr double kGatherTimeoutS = 120;

// All ranks' measurements on every rank (one rank: just `mine`).
Result<std::vector<RankMeasurement>> gather_measurements(comm::Communicator* world, const RankMeasurement& mine) {
  if (world == nullptr) return std::vector<RankMeasurement>{mine};
  const double in[4] = {mine.step_time_s, mine.compute_s, static_cast<double>(mine.peak_bytes), mine.cpu_s};
  std::vector<double> all(static_cast<size_t>(4 * world->size()));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, world->all_gather(in, all.data(), sizeof(in)));
  PIPER_RETURN_IF_ERROR(world->wait(h, kGatherTimeoutS));
  std::vector<RankMeasurement> out;
  for (int r = 0; r < world->size(); ++r) {
    const double* v = &all[static_cast<size_t>(4 * r)];
    out.push_back(RankMeasurement{v[0], v[1], static_cast<int64_t>(v[2]), v[3]});
  }
  return out;
}

// A recorder of this rank's timeline, attached to the executor and started right after a barrier, so that every
// rank's timeline has (nearly) the same origin.
Result<std::unique_ptr<TraceRecorder>> start_trace(Trainer& trainer) {
  comm::Communicator* world = trainer.options().world;
  const int rank = world != nullptr ? world->rank() : 0;
  const auto& plan = trainer.compiled().plan;
  auto recorder = std::make_unique<TraceRecorder>(rank, plan.coords[static_cast<size_t>(rank)].pp,
                                                  &trainer.memory_tracker());
  trainer.executor().set_trace(recorder.get());
  if (world != nullptr) {
    PIPER_ASSIGN_OR_RETURN(comm::Handle b, world->barrier());
    PIPER_RETURN_IF_ERROR(world->wait(b, kGatherTimeoutS));
  }
  recorder->start();
  return recorder;
}

StepRecord record_of(const TrainStepStats& s) {
  return StepRecord{s.step, s.loss, s.aux_loss, s.grad_norm, s.seconds, s.imbalance, s.migrated_experts,
                    s.migration_seconds};
}

bool save_due(const RunOptions& o, int64_t index, int64_t step) {
  if (o.save_dir.empty()) return false;
  return index + 1 == o.steps || (o.save_every > 0 && step % o.save_every == 0);
}

double mean_imbalance(std::vector<StepRecord>::const_iterator begin, std::vector<StepRecord>::const_iterator end) {
  double sum = 0;
  for (auto it = begin; it != end; ++it) sum += it->imbalance;
  return end > begin ? sum / static_cast<double>(end - begin) : 1.0;
}

// Throughput, imbalance windows and migration share from the recorded steps.
void summarise(const Trainer& trainer, int window_steps, RunSummary* r) {
  const double timed = static_cast<double>(r->timed_steps);
  r->mine.step_time_s = r->timed_seconds / timed;
  r->mine.compute_s = r->timed_compute_s / timed;
  r->mine.cpu_s = r->timed_cpu_s / timed;
  for (auto& [stream, cpu] : r->stream_cpu_s) cpu /= timed;
  r->mine.peak_bytes = trainer.memory().peak_total_bytes;
  r->tokens_per_s =
      r->timed_seconds > 0 ? static_cast<double>(trainer.tokens_per_step()) * timed / r->timed_seconds : 0;
  r->achieved_flops = r->tokens_per_s * trainer.flops_per_token();
  r->window = std::min(r->steps.size(), static_cast<size_t>(std::max(0, window_steps)));
  const auto w = static_cast<ptrdiff_t>(r->window);
  r->imbalance_first = mean_imbalance(r->steps.begin(), r->steps.begin() + w);
  r->imbalance_last = mean_imbalance(r->steps.end() - w, r->steps.end());
  r->migration_share = r->migration_seconds / std::max(1e-12, r->seconds + r->migration_seconds);
}

// The steps, with their checkpoints and the caller's callback; accumulates into `r`. The throughput and the
// per-step figures are over the timed steps: all but the first (its warm-up) when there are several.
Status run_steps(Trainer& trainer, const RunOptions& o, RunSummary* r) {
  for (int64_t i = 0; i < o.steps; ++i) {
    const double cpu0 = process_cpu_s();
    PIPER_ASSIGN_OR_RETURN(TrainStepStats s, trainer.step());
    if (i > 0 || o.steps == 1) {
      ++r->timed_steps;
      r->timed_seconds += s.seconds;
      r->timed_cpu_s += process_cpu_s() - cpu0;
      r->timed_compute_s += compute_seconds(s.task_seconds);
      for (const auto& [stream, cpu] : s.stream_cpu_s) r->stream_cpu_s[stream] += cpu;
    }
    r->steps.push_back(record_of(s));
    if (i == 0) r->loss_first = s.loss;
    r->loss_last = s.loss;
    r->seconds += s.seconds;
    r->migration_seconds += s.migration_seconds;
    if (s.migrated_experts > 0) {
      ++r->migrations;
      r->migrated_experts += s.migrated_experts;
    }
    if (save_due(o, i, s.step)) PIPER_RETURN_IF_ERROR(trainer.save(o.save_dir));
    if (o.on_step) o.on_step(s);
  }
  return ok_status();
}

}  // namespace

bool is_exchange_task(const std::string& key) { return key.rfind("a2a.", 0) == 0 || key.rfind("m2n.", 0) == 0; }

double compute_seconds(const std::map<std::string, double>& task_seconds) {
  double sum = 0;
  for (const auto& [task, task_s] : task_seconds) {
    if (!is_exchange_task(task)) sum += task_s;
  }
  return sum;
}

Result<RunSummary> run_training(Trainer& trainer, const RunOptions& o) {
  if (o.steps < 1) return invalid_argument("run_training: steps must be >= 1, got " + std::to_string(o.steps));
  if (o.save_every < 0) return invalid_argument("run_training: save_every must be >= 0");
  RunSummary r;
  r.expert_parallel = trainer.expert_parallel();
  std::unique_ptr<TraceRecorder> recorder;
  if (o.trace) {
    PIPER_ASSIGN_OR_RETURN(recorder, start_trace(trainer));
  }
  const Status ran = run_steps(trainer, o, &r);
  if (recorder != nullptr) trainer.executor().set_trace(nullptr);  // before the recorder goes, failed or not
  PIPER_RETURN_IF_ERROR(ran);
  // The run ends with whole parameters on every rank (ZeRO-1/2 gathers the plan defers to a next step).
  PIPER_RETURN_IF_ERROR(trainer.complete_param_gathers());
  summarise(trainer, trainer.options().migration.window_steps, &r);
  comm::Communicator* world = trainer.options().world;
  PIPER_ASSIGN_OR_RETURN(r.measured, gather_measurements(world, r.mine));
  if (recorder != nullptr) {
    if (world != nullptr) {
      PIPER_ASSIGN_OR_RETURN(r.timelines, gather_timelines(*world, recorder->timeline(), kGatherTimeoutS));
    } else {
      r.timelines.push_back(recorder->timeline());
    }
  }
  return r;
}

}  // namespace piper::runtime
