#include "piper/runtime/trainer.h"

#include <set>

#include "piper/runtime/checkpoint.h"
#include "piper/runtime/chunks/tp_slice.h"
#include "piper/runtime/data_source.h"
#include "piper/spec/cluster_loader.h"

namespace piper::runtime {

Result<Strategy> train_strategy(const std::string& text, int64_t global_batch) {
  if (!text.empty()) return Strategy::parse(text);
  if (global_batch < 1) return invalid_argument("--global-batch must be >= 1, got " + std::to_string(global_batch));
  Strategy s;
  s.schedule = "1f1b";
  s.mbs = 1;
  for (int m : {4, 2}) {
    if (global_batch % m == 0) {
      s.mbs = m;
      break;
    }
  }
  s.microbatches = static_cast<int>(global_batch / s.mbs);
  return s;
}

Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& options) {
  if (options.ranks < 1) return invalid_argument("--ranks must be >= 1, got " + std::to_string(options.ranks));
  if (options.ranks > 1 && options.world == nullptr) {
    return invalid_argument("--ranks " + std::to_string(options.ranks) +
                            " needs an MPI job: run `piper train --ranks N`, which starts mpirun itself");
  }
  if (options.world != nullptr && options.world->size() != options.ranks) {
    return invalid_argument("--ranks " + std::to_string(options.ranks) + " but the MPI job has " +
                            std::to_string(options.world->size()) + " ranks; make them equal");
  }
  if (options.seq_len < 1) return invalid_argument("--seq must be >= 1, got " + std::to_string(options.seq_len));
  if (options.seq_len > options.model.max_seq_len) {
    return invalid_argument("--seq " + std::to_string(options.seq_len) + " exceeds the model's max_seq_len " +
                            std::to_string(options.model.max_seq_len));
  }
  auto t = std::unique_ptr<Trainer>(new Trainer());
  t->options_ = options;
  PIPER_ASSIGN_OR_RETURN(t->strategy_, train_strategy(options.strategy, options.global_batch));
  PIPER_RETURN_IF_ERROR(t->strategy_.validate());
  if (t->options_.global_batch == 0 || !options.strategy.empty()) {
    if (options.global_batch != 0 && options.global_batch != t->strategy_.global_batch()) {
      return invalid_argument("--global-batch " + std::to_string(options.global_batch) + " differs from the "
                              "strategy's dp*microbatches*mbs = " + std::to_string(t->strategy_.global_batch()) +
                              "; drop --global-batch or change microbatches/mbs");
    }
    t->options_.global_batch = t->strategy_.global_batch();
  }
  TrainSpec train;
  train.global_batch = t->options_.global_batch;
  train.micro_batch_size = t->strategy_.mbs;
  train.seq_len = options.seq_len;
  train.param_dtype = train.grad_dtype = train.master_dtype = DType::kFP32;
  train.optimizer_dtype = train.activation_dtype = DType::kFP32;
  train.optimizer = options.optimizer;
  PIPER_RETURN_IF_ERROR(train.validate());
  PIPER_RETURN_IF_ERROR(t->strategy_.validate_for(options.model, train, options.ranks));
  t->train_ = train;
  auto compiled = compile::compile_strategy(options.model, train, t->strategy_);
  if (!compiled.ok()) return compiled.status();
  t->compiled_ = std::move(compiled).value();

  t->allocator_ = std::make_unique<MemoryPool>(&t->tracker_);
  const int rank = options.world != nullptr ? options.world->rank() : 0;
  if (options.world != nullptr) {
    PIPER_ASSIGN_OR_RETURN(t->dist_, DistContext::create(*options.world, t->compiled_.plan));
    if (options.model.moe.router_bias && t->compiled_.plan.mesh.tp > 1) {
      return unimplemented("model '" + options.model.name + "' balances experts with a router bias; under tp=" +
                           std::to_string(t->compiled_.plan.mesh.tp) + " with sequence parallelism its expert "
                           "counts are not summed across the token slices yet: use tp=1");
    }
    if (options.model.moe.router_bias && t->compiled_.plan.mesh.dp > 1) {
      return unimplemented("model '" + options.model.name + "' balances experts with a router bias; under dp=" +
                           std::to_string(t->compiled_.plan.mesh.dp) + " its expert counts are not summed across "
                           "replicas yet, so the replicas would diverge: use dp=1 (pipeline parallelism)");
    }
  }
  // Only the chunks this rank's Program computes (all of them on one rank).
  std::set<std::pair<int, std::string>> mine;
  for (const compile::Stream& stream : t->compiled_.plan.program(rank).streams) {
    for (const compile::Instruction& in : stream.instrs) {
      if (in.op != compile::OpKind::kCompute && in.op != compile::OpKind::kUpdate) continue;
      const ir::Node& n = t->compiled_.graph.node(in.node);
      mine.emplace(n.tags.layer, n.tags.part);
    }
  }
  PIPER_ASSIGN_OR_RETURN(t->model_, Model::create(options.model, options.model_options, options.seed,
                                                  t->allocator_.get(), [&](int layer, const std::string& part) {
                                                    return mine.count({layer, part}) > 0;
                                                  }));
  if (t->dist_ != nullptr && t->compiled_.plan.mesh.tp > 1) {
    // Tensor parallelism: the chunks the compiler split over tp hold this rank's slice (chunks/tp_slice.h).
    std::set<std::pair<int, std::string>> split;
    for (const ir::Node& n : t->compiled_.graph.nodes()) {
      if (n.kind == ir::NodeKind::kChunk && n.shard_axis == "tp") split.emplace(n.tags.layer, n.tags.part);
    }
    for (const auto& [layer, part] : split) {
      const Chunk* whole = t->model_->find(layer, part);
      if (whole == nullptr) continue;
      PIPER_ASSIGN_OR_RETURN(auto slice, make_tp_slice(*whole, t->model_->dims(), t->dist_->coord().tp,
                                                       t->compiled_.plan.mesh.tp, t->allocator_.get()));
      PIPER_RETURN_IF_ERROR(t->model_->replace_chunk(std::move(slice)));
    }
  }
  t->optimizer_ = std::make_unique<Optimizer>(options.optimizer, options.warmup_steps, *t->model_,
                                              t->allocator_.get());
  PIPER_ASSIGN_OR_RETURN(t->executor_, Executor::create(t->compiled_.graph, t->compiled_.plan.program(rank),
                                                        t->model_.get(), t->optimizer_.get(), t->allocator_.get(),
                                                        t->dist_.get()));
  PIPER_ASSIGN_OR_RETURN(Corpus corpus, load_corpus(options.data, options.model.vocab_size));
  PIPER_ASSIGN_OR_RETURN(DataLoader loader, DataLoader::create(std::move(corpus.tokens), options.seq_len,
                                                               t->options_.global_batch, options.seed));
  t->loader_ = std::make_unique<DataLoader>(std::move(loader));

  PIPER_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster("local-cpu", 1));
  cluster.node.devices_per_node = options.ranks;  // the preset describes both cores; this run uses one rank
  // No CUDA context or cuBLAS/NCCL workspace on a CPU rank: the calibration's GPU workspace does not apply.
  cost::Calibration calibration;
  calibration.workspace_bytes = 0;
  PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(options.model, cluster, train, calibration));
  PIPER_ASSIGN_OR_RETURN(cost::Estimate e, cm.estimate(t->strategy_));
  t->predicted_ = e.memory;
  t->flops_per_token_ = cm.flops_per_token();
  t->tracker_.reset_peaks();
  return t;
}

Result<TrainStepStats> Trainer::step() {
  loader_->next_batch(&batch_);
  const Batch* batch = &batch_;
  if (dist_ != nullptr && data_parallel() > 1) {
    // This rank's data-parallel slice: contiguous sequences, so dp ranks together see the whole batch.
    const int64_t rows = batch_.batch_size / data_parallel();
    const int64_t begin = rows * dist_->coord().dp * batch_.seq_len, count = rows * batch_.seq_len;
    local_batch_.batch_size = rows;
    local_batch_.seq_len = batch_.seq_len;
    local_batch_.inputs.assign(batch_.inputs.begin() + begin, batch_.inputs.begin() + begin + count);
    local_batch_.targets.assign(batch_.targets.begin() + begin, batch_.targets.begin() + begin + count);
    batch = &local_batch_;
  }
  PIPER_ASSIGN_OR_RETURN(StepResult r, executor_->run_step(*batch));
  TrainStepStats s;
  s.step = optimizer_->step();
  s.loss = r.loss;
  s.aux_loss = r.aux_loss;
  s.grad_norm = r.grad_norm;
  s.seconds = r.seconds;
  s.task_seconds = r.task_seconds;
  const double tokens = static_cast<double>(tokens_per_step());
  s.tokens_per_s = r.seconds > 0 ? tokens / r.seconds : 0;
  s.flops_per_s = s.tokens_per_s * flops_per_token_;
  return s;
}

Status Trainer::save(const std::string& dir) {
  if (dist_ != nullptr) {
    return unimplemented("--save: checkpoints of multi-rank runs are not written yet; save from a --ranks 1 run");
  }
  CheckpointMeta meta;
  meta.step = optimizer_->step();
  meta.data = loader_->position();
  meta.rng = RngState{options_.seed, 0, 0};
  NamedTensors model, opt;
  for (const Param* p : model_->params()) model.emplace_back(p->name, &p->value);
  for (const auto& [name, t] : optimizer_->state()) opt.emplace_back(name, t);
  return save_checkpoint(dir, meta, model, opt);
}

Status Trainer::resume(const std::string& dir) {
  if (dist_ != nullptr) {
    return unimplemented("--resume: multi-rank runs do not load checkpoints yet; resume with --ranks 1");
  }
  PIPER_ASSIGN_OR_RETURN(Checkpoint ck, load_checkpoint(dir));
  const std::string hint = " (was the checkpoint written for another model? resume with the same --model)";
  for (Param* p : model_->params()) {
    Status s = restore_tensor(ck.model, p->name, &p->value);
    if (!s.ok()) return s.with_context("resume from '" + dir + "'" + hint);
  }
  for (const auto& [name, t] : optimizer_->state()) {
    Status s = restore_tensor(ck.optimizer, name, t);
    if (!s.ok()) return s.with_context("resume from '" + dir + "'" + hint);
  }
  if (ck.model.size() != model_->params().size()) {
    return invalid_argument("resume from '" + dir + "': the checkpoint has " + std::to_string(ck.model.size()) +
                            " model tensors, this model " + std::to_string(model_->params().size()) + hint);
  }
  if (ck.meta.rng.seed != options_.seed) {
    return invalid_argument("resume from '" + dir + "': the checkpoint was trained with --seed " +
                            std::to_string(ck.meta.rng.seed) + ", this run uses " + std::to_string(options_.seed) +
                            "; the data order would differ");
  }
  Status s = loader_->seek(ck.meta.data);
  if (!s.ok()) return s.with_context("resume from '" + dir + "' (was it written for another data set or --seq?)");
  optimizer_->set_step(ck.meta.step);
  return ok_status();
}

}  // namespace piper::runtime
