#include "piper/runtime/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <set>
#include <variant>

#include "piper/balance/migration_cost.h"
#include "piper/base/fault.h"
#include "piper/base/strings.h"
#include "piper/runtime/checkpoint/checkpoint.h"
#include "piper/runtime/data/data_source.h"
#include "piper/runtime/model/chunks/tp_slice.h"
#include "piper/runtime/support.h"
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

Status check_step_finite(double loss, double grad_norm, int64_t step, double lr) {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) return ok_status();
  char text[160];
  std::snprintf(text, sizeof(text), "loss %g, gradient norm %g is not finite; ", loss, grad_norm);
  char fix[64];
  std::snprintf(fix, sizeof(fix), "lower --lr (now %g)", lr);
  return failed_precondition("training diverged at step " + std::to_string(step) + ": " + text +
                             "training stopped, nothing of this step was saved; " + fix + " or check the data");
}

Status MigrationOptions::validate() const {
  if (window_steps < 1) {
    return invalid_argument("--migrate-window must be >= 1 step, got " + std::to_string(window_steps));
  }
  if (horizon_steps < 0) {
    return invalid_argument("--migrate-horizon must be >= 0 steps (0 = the window), got " +
                            std::to_string(horizon_steps));
  }
  if (!(threshold >= 1.0)) {
    return invalid_argument("--migrate-threshold is a max/mean load ratio and must be >= 1, got " +
                            std::to_string(threshold));
  }
  return ok_status();
}

namespace {

// The balance module's view of one layer's table: ep ranks of `per` slots, one ep group.
balance::ExpertPlacement to_placement(const std::vector<int>& slots, int per) {
  balance::ExpertPlacement p;
  p.num_experts = static_cast<int>(slots.size());
  p.slots_per_rank = per;
  p.num_ranks = p.num_experts / per;
  p.ep_group_size = p.num_ranks;
  p.slot_expert = slots;
  return p;
}

// `piece` of parameter `p` (or of its moments): elements [begin, end) of p's box, with `local` the whole box or
// (extent set) a store of just those elements. A slice made of row blocks (Param::global_blocks: TP's w_qkv)
// becomes one piece per block it touches, each block's elements copied into `copies` (the format's pieces are
// boxes of the whole tensor; the blocks are three of them).
void add_pieces(const Param& p, const TensorPiece& piece, std::deque<Tensor>* copies,
                std::vector<TensorPiece>* pieces) {
  if (p.global_blocks.empty()) {
    pieces->push_back(piece);
    return;
  }
  const Shape& box = piece.extent.empty() ? piece.local->shape() : piece.extent;
  int64_t cols = 1;
  for (size_t d = 1; d < box.size(); ++d) cols *= box[d];
  const int64_t begin = piece.begin, end = piece.end >= 0 ? piece.end : cols * box[0];
  const float* data = piece.extent.empty() ? piece.local->data() : piece.local->data() - begin;  // element 0
  for (const Param::RowBlock& b : p.global_blocks) {
    const int64_t first = b.row * cols, from = std::max(begin, first), to = std::min(end, first + b.rows * cols);
    if (from >= to) continue;
    Shape extent = box;
    extent[0] = b.rows;
    copies->push_back(Tensor::zeros_or_die({to - from}, MemCategory::kBuffers));
    std::copy(data + from, data + to, copies->back().data());
    pieces->push_back(
        {piece.name, piece.global_shape, b.offset, &copies->back(), from - first, to - first, piece.optimizer, extent});
  }
}

// Fills `dst` with elements [begin, end) of tensor `name`'s part that parameter `p` holds: its box of extent
// `box` at global_offset, or its row blocks (Param::global_blocks).
Status restore_param(CheckpointReader& reader, const Param& p, const std::string& name, const Shape& global,
                     const Shape& box, int64_t begin, int64_t end, float* dst) {
  if (p.global_blocks.empty()) return reader.restore_range(name, global, p.global_offset, box, begin, end, dst);
  int64_t cols = 1;
  for (size_t d = 1; d < box.size(); ++d) cols *= box[d];
  for (const Param::RowBlock& b : p.global_blocks) {
    const int64_t first = b.row * cols, from = std::max(begin, first), to = std::min(end, first + b.rows * cols);
    if (from >= to) continue;
    Shape extent = box;
    extent[0] = b.rows;
    PIPER_RETURN_IF_ERROR(
        reader.restore_range(name, global, b.offset, extent, from - first, to - first, dst + (from - begin)));
  }
  return ok_status();
}

// Expert parallelism: slot j of an experts chunk's tensor (elements [j * n, (j + 1) * n)) as the box of logical
// expert `expert` in the whole [num_experts, ...] tensor.
// Where one expert of a rank's box lies in the whole tensor: at `expert` along the experts' dimension and, for an
// expert tensor-parallel slice (make_etp_slice), at the slice's offset along the others (`offset`: the parameter's
// Param::global_offset; empty for whole experts).
Shape expert_offset(const Shape& global, const Shape& offset, int expert) {
  Shape o = offset.size() == global.size() ? offset : Shape(global.size(), 0);
  o[0] = expert;
  return o;
}
int64_t box_numel(const Shape& box) {
  int64_t n = 1;
  for (int64_t d : box) n *= d;
  return n;
}
// One expert of a rank's [E/ep, ...] box.
Shape expert_extent(const Shape& box) {
  Shape e = box;
  e[0] = 1;
  return e;
}

// Where a checkpointed tensor of parameter `p` lives on this rank: its values or one of its AdamW moments, a
// tensor holding flat elements [lo, hi) of the rank's box (`whole`: the tensor is the box itself).
struct ParamStore {
  std::string name;
  Tensor* tensor = nullptr;
  int64_t lo = 0, hi = 0;
  bool optimizer = false;
  bool whole = false;
};

// p's values (whole, or its ZeRO-3 shard `ps`) and, when trainable, its ".m" and ".v" moments (the elements this
// rank updates), as save() writes and restore_local() reads them.
Result<std::vector<ParamStore>> param_stores(Param& p, const Executor::ParamShard* ps,
                                             const std::map<std::string, Optimizer::StateTensor>& moments) {
  std::vector<ParamStore> stores;
  if (ps == nullptr) {
    stores.push_back({p.name, &p.value, 0, p.value.numel(), false, true});
  } else {
    stores.push_back({p.name, ps->values, ps->begin, ps->end, false, false});
  }
  for (const char* suffix : {".m", ".v"}) {
    if (!p.trainable) break;
    auto it = moments.find(p.name + suffix);
    if (it == moments.end()) return internal_error("the optimizer has no state '" + p.name + suffix + "'");
    const Optimizer::StateTensor& st = it->second;
    stores.push_back({st.name, st.tensor, st.begin, st.end, true, false});
  }
  return stores;
}

// Every non-empty store of every parameter this rank holds, chunk by chunk, as save() writes and restore_local()
// reads them: f(chunk, p, box, global, store) with box the rank's part of p (whole, TP block or ZeRO-3 shape) and
// global p's whole shape. Stops at f's first error.
template <class F>
Status for_each_param_store(const Model& model, Executor& executor,
                            const std::map<std::string, Optimizer::StateTensor>& moments, F&& f) {
  for (const auto& chunk : model.chunks()) {
    const std::vector<Executor::ParamShard> sharded = executor.param_shards(*chunk);
    size_t index = 0;
    for (Param& p : chunk->params()) {
      const Executor::ParamShard* ps = p.trainable && !sharded.empty() ? &sharded[index] : nullptr;
      if (p.trainable) ++index;
      const Shape box = ps != nullptr ? ps->shape : p.value.shape();
      const Shape global = p.global_shape.empty() ? box : p.global_shape;
      PIPER_ASSIGN_OR_RETURN(std::vector<ParamStore> stores, param_stores(p, ps, moments));
      for (const ParamStore& store : stores) {
        if (store.lo < store.hi) PIPER_RETURN_IF_ERROR(f(*chunk, p, box, global, store));
      }
    }
  }
  return ok_status();
}

// Expert parallelism: the part [b, e) of slot j (elements [j n, (j + 1) n) of the rank's box) that a store holding
// [lo, hi) covers, for every slot it touches.
template <class F>
void for_each_slot(int slots, int64_t n, int64_t lo, int64_t hi, F&& f) {
  for (int j = 0; j < slots; ++j) {
    const int64_t b = std::max(lo, j * n), e = std::min(hi, (j + 1) * n);
    if (b < e) f(j, b, e);
  }
}

}  // namespace

Trainer::~Trainer() = default;

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& options) {
  if (options.ranks < 1) return invalid_argument("--ranks must be >= 1, got " + std::to_string(options.ranks));
  PIPER_RETURN_IF_ERROR(init_fault_injection());
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
  PIPER_RETURN_IF_ERROR(options.migration.validate());
  auto t = std::unique_ptr<Trainer>(new Trainer());
  t->options_ = options;
  PIPER_RETURN_IF_ERROR(t->resolve_and_compile());
  if (options.migration.enabled && t->compiled_.plan.mesh.ep < 2) {
    return invalid_argument("--migrate moves experts between the ranks of an expert-parallel group, but strategy '" +
                            t->strategy_.to_string() + "' has ep=1: add ep=N (N > 1) or drop --migrate");
  }

  t->allocator_ = std::make_unique<MemoryPool>(&t->tracker_);
  const int rank = options.world != nullptr ? options.world->rank() : 0;
  if (options.world != nullptr) {
    PIPER_ASSIGN_OR_RETURN(t->dist_, DistContext::create(*options.world, t->compiled_.plan));
    if (options.ranks_per_node > 0) PIPER_RETURN_IF_ERROR(t->dist_->set_ranks_per_node(options.ranks_per_node));
  }
  PIPER_RETURN_IF_ERROR(t->build_model(rank));
  t->optimizer_ = std::make_unique<Optimizer>(options.optimizer, options.warmup_steps, *t->model_, t->allocator_.get());
  PIPER_ASSIGN_OR_RETURN(t->executor_,
                         Executor::create(t->compiled_.plan, t->compiled_.plan.program(rank), t->model_.get(),
                                          t->optimizer_.get(), t->allocator_.get(), t->dist_.get()));
  PIPER_ASSIGN_OR_RETURN(Corpus corpus, load_corpus(options.data, options.model.vocab_size));
  PIPER_ASSIGN_OR_RETURN(DataLoader loader, DataLoader::create(std::move(corpus.tokens), options.seq_len,
                                                               t->options_.global_batch, options.seed));
  t->loader_ = std::make_unique<DataLoader>(std::move(loader));

  PIPER_RETURN_IF_ERROR(t->predict_resources());
  t->tracker_.reset_peaks();
  return t;
}

// This rank's model: only the chunks its Program computes (all of them on one rank), its ep rank's block of
// experts, and its tp slice of the chunks the compiler split over tp.
Status Trainer::build_model(int rank) {
  // Only the chunks this rank's Program computes (all of them on one rank).
  std::set<std::pair<int, Part>> mine;
  for (const compile::Stream& stream : compiled_.plan.program(rank).streams) {
    for (const compile::Instruction& in : stream.instrs) {
      if (in.op != compile::OpKind::kCompute && in.op != compile::OpKind::kUpdate) continue;
      if (in.part) mine.emplace(in.layer, *in.part);
    }
  }
  // Expert parallelism: this rank's experts chunk holds only its ep rank's block of experts.
  ModelOptions model_options = options_.model_options;
  if (compiled_.plan.mesh.ep > 1) {
    model_options.expert_ranks = compiled_.plan.mesh.ep;
    model_options.expert_rank = dist_ != nullptr ? dist_->coord().ep : 0;
  }
  PIPER_ASSIGN_OR_RETURN(
      model_, Model::create(options_.model, model_options, options_.seed, allocator_.get(), [&](int layer, Part part) {
        return mine.count({layer, part}) > 0;
      }));
  if (dist_ != nullptr && compiled_.plan.mesh.tp > 1) {
    // Tensor parallelism: the chunks the compiler split over tp hold this rank's slice (model/chunks/tp_slice.h).
    // Under vocabulary parallelism (the compile targets' default) embed and head are among them.
    // (A layer has an mlp or shared experts, not both: the order is the one the part names had.)
    std::set<std::pair<int, Part>> split;
    for (const compile::Program& prog : compiled_.plan.templates) {
      for (const compile::Stream& stream : prog.streams) {
        for (const compile::Instruction& in : stream.instrs) {
          if (in.op == compile::OpKind::kCompute && in.shard_axis == "tp" && in.part) {
            split.emplace(in.layer, *in.part);
          }
        }
      }
    }
    for (const auto& [layer, part] : split) {
      const Chunk* whole = model_->find(layer, part);
      if (whole == nullptr) continue;
      PIPER_ASSIGN_OR_RETURN(auto slice, make_tp_slice(*whole, model_->dims(), dist_->coord().tp,
                                                       compiled_.plan.mesh.tp, allocator_.get()));
      PIPER_RETURN_IF_ERROR(model_->replace_chunk(std::move(slice)));
    }
  }
  if (dist_ != nullptr && compiled_.plan.mesh.etp > 1) {
    // Expert tensor parallelism: every experts chunk holds this rank's slice (tp coordinate mod etp, the plan's
    // etp group being etp consecutive tensor ranks) of its local experts (model/chunks/tp_slice.h).
    const int etp = compiled_.plan.mesh.etp;
    for (int layer = 0; layer < compiled_.plan.num_layers; ++layer) {
      const Chunk* whole = model_->find(layer, Part::kExperts);
      if (whole == nullptr) continue;
      PIPER_ASSIGN_OR_RETURN(auto slice,
                             make_etp_slice(*whole, model_->dims(), dist_->coord().tp % etp, etp, allocator_.get()));
      PIPER_RETURN_IF_ERROR(model_->replace_chunk(std::move(slice)));
    }
  }
  num_params_ = model_->num_params();
  return ok_status();
}

// What the resource model predicts for this run (memory per rank, FLOPs per token) and, for a MoE model, the
// migration cost model, from the local CPU cluster description.
Status Trainer::predict_resources() {
  PIPER_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster("local-cpu", 1));
  cluster.node.devices_per_node = options_.ranks;  // the preset describes both cores; this run uses one rank
  // No CUDA context or cuBLAS/NCCL workspace on a CPU rank: the calibration's GPU workspace does not apply.
  cost::Calibration calibration;
  calibration.workspace_bytes = 0;
  PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(options_.model, cluster, train_, calibration));
  // estimate() has no closed-form model of registered schedules, a directive file's own order or af-pipe with tp:
  // none. af-pipe's (cost/estimate_af.cc) has a MemoryBreakdown per pipeline rank of either side.
  if ((!strategy_.disaggregate || strategy_.tp == 1) && strategy_.schedule_kind() != ScheduleKind::kCustom &&
      (options_.directives.empty() || directives_recognised_)) {
    PIPER_ASSIGN_OR_RETURN(cost::Estimate e, cm.estimate(strategy_));
    predicted_ = e.memory;
    const size_t stage = static_cast<size_t>(dist_ != nullptr ? dist_->coord().pp : 0);
    predicted_rank_ = stage < e.ranks.size() ? e.ranks[stage] : e.memory;
  }
  // The planner's cost model (balance/migration_cost.h) from the same cluster description, identical on every
  // rank; a routed token costs the busiest rank its expert's forward and backward FLOPs (3 GEMMs of 2 h f, times 3).
  if (options_.model.is_moe()) {
    expert_loads_.model = options_.model.name;
    expert_loads_.num_experts = options_.model.moe.num_experts;
    const double h = static_cast<double>(options_.model.hidden_size);
    const double f = static_cast<double>(options_.model.moe.expert_intermediate_size);
    migration_cost_ = balance::migration_cost(
        options_.model, train_, cluster, strategy_.etp,
        options_.migration.horizon_steps > 0 ? options_.migration.horizon_steps : options_.migration.window_steps,
        18.0 * h * f / (cluster.device.peak_flops_fp32 * cluster.device.gemm_efficiency));
  }
  flops_per_token_ = cm.flops_per_token();
  return ok_status();
}

// --directives: the strategy the list stands for (every directive the compiler verifies, the CPU runtime executes).
Status Trainer::resolve_directives() {
  const int microbatches = compile::directive_microbatches(options_.directives);
  const int64_t per = static_cast<int64_t>(options_.mesh.dp) * microbatches;
  if (options_.global_batch == 0) options_.global_batch = per;
  if (options_.global_batch % per != 0) {
    return invalid_argument("--global-batch " + std::to_string(options_.global_batch) +
                            " is not a multiple of dp*microbatches = " + std::to_string(per) +
                            " (the mesh's dp and the directives' split); give a multiple of " + std::to_string(per));
  }
  PIPER_ASSIGN_OR_RETURN(compile::DirectiveStrategy ds,
                         compile::strategy_of_directives(options_.model, options_.mesh, options_.directives,
                                                         static_cast<int>(options_.global_batch / per)));
  strategy_ = ds.strategy;
  directives_recognised_ = ds.recognised;
  return ok_status();
}

Status Trainer::resolve_and_compile() {
  if (!options_.directives.empty()) {
    PIPER_RETURN_IF_ERROR(resolve_directives());
  } else {
    PIPER_ASSIGN_OR_RETURN(strategy_, train_strategy(options_.strategy, options_.global_batch));
  }
  PIPER_RETURN_IF_ERROR(strategy_.validate());
  // What the runtime cannot execute, named as `piper plan --runnable` names it (runtime/support.cc).
  PIPER_RETURN_IF_ERROR(check_runnable(strategy_));
  if (options_.directives.empty() && (options_.global_batch == 0 || !options_.strategy.empty())) {
    if (options_.global_batch != 0 && options_.global_batch != strategy_.global_batch()) {
      return invalid_argument("--global-batch " + std::to_string(options_.global_batch) +
                              " differs from the "
                              "strategy's dp*microbatches*mbs = " +
                              std::to_string(strategy_.global_batch()) +
                              "; drop --global-batch or change microbatches/mbs");
    }
    options_.global_batch = strategy_.global_batch();
  }
  TrainSpec train;
  train.global_batch = options_.global_batch;
  train.micro_batch_size = strategy_.mbs;
  train.seq_len = options_.seq_len;
  train.param_dtype = train.grad_dtype = train.master_dtype = DType::kFP32;
  train.optimizer_dtype = train.activation_dtype = DType::kFP32;
  train.optimizer = options_.optimizer;
  PIPER_RETURN_IF_ERROR(train.validate());
  PIPER_RETURN_IF_ERROR(strategy_.validate_for(options_.model, train, options_.ranks));
  train_ = train;
  compile::CompileOptions copts;
  copts.target = compile::cpu_runtime_target();
  // The CPU attention recomputes its s x s probabilities in the backward (runtime/model/chunks/attn.cc).
  copts.materialised_scores = true;
  if (options_.plan_prices) {
    PIPER_ASSIGN_OR_RETURN(copts.cost, options_.plan_prices(strategy_, train));
  }
  auto compiled = options_.directives.empty()
                      ? compile::compile_strategy(options_.model, train, strategy_, copts)
                      : compile::compile_directives(options_.model, train, options_.mesh, options_.directives, copts);
  if (!compiled.ok()) return compiled.status();
  compiled_ = std::move(compiled).value();
  return ok_status();
}

Result<TrainStepStats> Trainer::step() {
  set_fault_step(optimizer_->step() + 1);
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
  // The update has run by then, so nothing from this step may be saved: the error stops training before a save.
  PIPER_RETURN_IF_ERROR(check_step_finite(r.loss, r.grad_norm, optimizer_->step(), options_.optimizer.lr));
  TrainStepStats s;
  s.step = optimizer_->step();
  s.loss = r.loss;
  s.aux_loss = r.aux_loss;
  s.grad_norm = r.grad_norm;
  s.seconds = r.seconds;
  s.task_seconds = r.task_seconds;
  s.stream_cpu_s = r.stream_cpu_s;
  s.expert_tokens = std::move(r.expert_tokens);
  PIPER_RETURN_IF_ERROR(record_expert_loads(s));
  PIPER_RETURN_IF_ERROR(balance_experts(&s));
  const double tokens = static_cast<double>(tokens_per_step());
  s.tokens_per_s = r.seconds > 0 ? tokens / r.seconds : 0;
  s.flops_per_s = s.tokens_per_s * flops_per_token_;
  return s;
}

Status Trainer::record_expert_loads(const TrainStepStats& s) {
  if (compiled_.plan.mesh.ep < 2 || s.expert_tokens.empty()) return ok_status();
  // Every MoE layer's tokens per logical expert, in layer order (the map's), summed over the world.
  std::vector<std::pair<int, std::vector<int64_t>>> by_layer(s.expert_tokens.begin(), s.expert_tokens.end());
  return expert_loads_.add_step(by_layer);
}

Status Trainer::balance_experts(TrainStepStats* s) {
  const std::map<int, std::vector<int>>& table = executor_->expert_placement();
  if (table.empty()) return ok_status();
  const int per = executor_->experts_per_rank();
  const int window = options_.migration.window_steps;
  if (monitor_ == nullptr) {
    std::vector<balance::ExpertPlacement> placements;
    monitor_layers_.clear();
    for (const auto& [layer, slots] : table) {
      monitor_layers_.push_back(layer);
      placements.push_back(to_placement(slots, per));
    }
    PIPER_ASSIGN_OR_RETURN(balance::LoadMonitor m, balance::LoadMonitor::create(std::move(placements), window));
    monitor_ = std::make_unique<balance::LoadMonitor>(std::move(m));
  }
  std::vector<std::vector<int64_t>> tokens;
  for (int layer : monitor_layers_) {
    auto it = s->expert_tokens.find(layer);
    if (it == s->expert_tokens.end()) {
      return internal_error("expert balance: the step reported no expert loads for layer " + std::to_string(layer));
    }
    tokens.push_back(it->second);
  }
  PIPER_RETURN_IF_ERROR(monitor_->record_step(tokens));
  s->imbalance = 1.0;
  for (int i = 0; i < monitor_->num_layers(); ++i) {
    s->imbalance = std::max(s->imbalance, monitor_->layer_stats(i).last_step_imbalance);
  }
  if (!options_.migration.enabled || monitor_->steps_in_window() < window || s->step - last_plan_step_ < window) {
    return ok_status();
  }
  last_plan_step_ = s->step;
  balance::PlannerOptions planner;
  planner.imbalance_threshold = options_.migration.threshold;
  PIPER_ASSIGN_OR_RETURN(std::vector<balance::MigrationPlan> plans,
                         balance::plan_layers(*monitor_, migration_cost_, planner));
  std::map<int, std::vector<int>> next;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (plans[i].moves.empty()) continue;
    next[monitor_layers_[i]] = plans[i].placement.slot_expert;
    s->window_imbalance_before = std::max(s->window_imbalance_before, plans[i].imbalance_before);
    s->window_imbalance_after = std::max(s->window_imbalance_after, plans[i].imbalance_after);
  }
  if (next.empty()) return ok_status();
  PIPER_ASSIGN_OR_RETURN(ExpertMigration m, executor_->migrate_experts(next));
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i].moves.empty()) {
      PIPER_RETURN_IF_ERROR(monitor_->set_placement(static_cast<int>(i), plans[i].placement));
    }
  }
  s->migrated_experts = m.moved_experts;
  s->migration_seconds = m.seconds;
  return ok_status();
}

double Trainer::comm_timeout_s() const { return dist_ != nullptr ? dist_->timeout_s() : comm::default_timeout_s(); }

Status Trainer::prepare_save(const std::string& root) {
  return check_checkpoint_root_writable(root, options_.world, comm_timeout_s());
}

Status Trainer::save(const std::string& dir) {
  // ZeRO-1/2 before_forward: each rank's whole parameters hold only its own shard's last update until gathered.
  PIPER_RETURN_IF_ERROR(complete_param_gathers());
  CheckpointMeta meta;
  meta.step = optimizer_->step();
  set_fault_step(meta.step);
  meta.data = loader_->position();
  meta.rng = RngState{options_.seed, 0, 0};
  meta.seq_len = options_.seq_len;
  meta.model = options_.model.name;
  meta.model_arch = model_architecture(options_.model);
  meta.strategy = strategy_.to_string();
  meta.world_size = options_.ranks;
  meta.expert_placement = executor_->expert_placement();
  std::map<std::string, Optimizer::StateTensor> moments;
  for (const Optimizer::StateTensor& st : optimizer_->state()) moments[st.name] = st;
  // Every parameter this rank holds, whole, its slice or (ZeRO-3) its flat shard; the moments of the elements
  // this rank updates (ZeRO: allocated for those only).
  std::vector<TensorPiece> pieces;
  std::deque<Tensor> copies;  // expert slots copied out under their logical index; TP row blocks (add_pieces)
  PIPER_RETURN_IF_ERROR(for_each_param_store(
      *model_, *executor_, moments,
      [&](const Chunk& chunk, Param& p, const Shape& box, const Shape& global, const ParamStore& st) -> Status {
        const auto table =
            chunk.part() == Part::kExperts ? meta.expert_placement.find(chunk.layer()) : meta.expert_placement.end();
        if (table == meta.expert_placement.end()) {
          add_pieces(p,
                     st.whole
                         ? TensorPiece{st.name, global, p.global_offset, st.tensor, 0, -1, st.optimizer}
                         : TensorPiece{st.name, global, p.global_offset, st.tensor, st.lo, st.hi, st.optimizer, box},
                     &copies, &pieces);
          return ok_status();
        }
        // Expert parallelism: every slot under its logical expert, so that the checkpoint does not depend on the
        // placement; of each slot the elements this store holds.
        const int per = executor_->experts_per_rank();
        const int first = static_cast<int>(p.global_offset.at(0));
        const int64_t n = box_numel(box) / per;
        for_each_slot(per, n, st.lo, st.hi, [&](int j, int64_t b, int64_t e) {
          copies.push_back(Tensor::zeros_or_die({e - b}, MemCategory::kBuffers));
          std::memcpy(copies.back().data(), st.tensor->data() + (b - st.lo),
                      static_cast<size_t>(e - b) * sizeof(float));
          const int expert = table->second.at(static_cast<size_t>(first + j));
          pieces.push_back({st.name, global, expert_offset(global, p.global_offset, expert), &copies.back(), b - j * n,
                            e - j * n, st.optimizer, expert_extent(box)});
        });
        return ok_status();
      }));
  return save_checkpoint(dir, meta, pieces, options_.world, comm_timeout_s());
}

Status Trainer::restore_local(CheckpointReader& reader) {
  const CheckpointMeta& m = reader.meta();
  const std::string where = "resume from '" + reader.dir() + "'";
  PIPER_RETURN_IF_ERROR(check_checkpoint_model(reader.dir(), m, options_.model));
  if (m.rng.seed != options_.seed) {
    return invalid_argument(where + ": the checkpoint was trained with --seed " + std::to_string(m.rng.seed) +
                            ", this run uses " + std::to_string(options_.seed) +
                            "; the data order would differ: pass --seed " + std::to_string(m.rng.seed));
  }
  if (m.seq_len != options_.seq_len) {
    return invalid_argument(where + ": the checkpoint was trained with --seq " + std::to_string(m.seq_len) +
                            ", this run uses " + std::to_string(options_.seq_len) +
                            "; the data windows would differ: pass --seq " + std::to_string(m.seq_len));
  }
  std::map<std::string, Optimizer::StateTensor> moments;
  for (const Optimizer::StateTensor& st : optimizer_->state()) moments[st.name] = st;
  // Expert parallelism: adopt the writer's placement when it fits this run (every MoE layer, each a
  // permutation of the experts: any ep degree); otherwise keep this run's. Either way every slot loads its
  // logical expert.
  const std::map<int, std::vector<int>>& table = executor_->expert_placement();
  if (!table.empty() && !m.expert_placement.empty()) {
    bool fits = m.expert_placement.size() == table.size();
    for (const auto& [layer, slots] : table) fits = fits && m.expert_placement.count(layer) > 0;
    if (fits) {
      Status s = executor_->set_expert_placement(m.expert_placement);
      if (!s.ok()) return s.with_context(where + ": its expert_placement");
    }
  }
  PIPER_RETURN_IF_ERROR(for_each_param_store(
      *model_, *executor_, moments,
      [&](const Chunk& chunk, Param& p, const Shape& box, const Shape& global, const ParamStore& store) -> Status {
        const auto slots = chunk.part() == Part::kExperts ? table.find(chunk.layer()) : table.end();
        float* data = store.tensor->data();
        Status s = ok_status();
        if (slots == table.end()) {
          s = restore_param(reader, p, store.name, global, box, store.lo, store.hi, data);
        } else {
          // Slot j of this rank holds logical expert slots->second[first + j].
          const int per = executor_->experts_per_rank();
          const int first = static_cast<int>(p.global_offset.at(0));
          const int64_t n = box_numel(box) / per;
          for_each_slot(per, n, store.lo, store.hi, [&](int j, int64_t b, int64_t e) {
            if (!s.ok()) return;
            const int expert = slots->second.at(static_cast<size_t>(first + j));
            s = reader.restore_range(store.name, global, expert_offset(global, p.global_offset, expert),
                                     expert_extent(box), b - j * n, e - j * n, data + (b - store.lo));
          });
        }
        if (!s.ok()) return s.with_context(where);
        return ok_status();
      }));
  Status s = loader_->seek(m.data);
  if (!s.ok()) return s.with_context(where + " (was it written for another data set?)");
  optimizer_->set_step(m.step);
  return ok_status();
}

Status Trainer::resume(const std::string& dir) {
  const double timeout_s = comm_timeout_s();
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::open(dir);
  Status st = reader.status();
  if (st.ok()) st = restore_local(**reader);
  PIPER_RETURN_IF_ERROR(agree_on_status(options_.world, st, timeout_s));
  // Every tensor of the checkpoint must be held by some rank of this run (its architecture was checked above).
  std::string mine;
  for (const Param* p : model_->params()) mine += p->name + "\n";
  PIPER_ASSIGN_OR_RETURN(std::vector<std::string> all, all_gather_strings(options_.world, mine, timeout_s));
  std::set<std::string> held;
  for (const std::string& names : all) {
    for (const std::string& n : split(names, '\n')) held.insert(n);
  }
  for (const auto& [name, info] : (*reader)->tensors()) {
    const std::string param = info.optimizer ? name.substr(0, name.rfind('.')) : name;
    if (!held.count(param)) {
      return data_loss("resume from '" + (*reader)->dir() + "': its index lists tensor '" + name +
                       "', which model '" + options_.model.name + "' does not have although the checkpoint's " +
                       "architecture is this model's (the index is inconsistent); resume from an earlier checkpoint");
    }
  }
  resumed_ = (*reader)->meta();
  resumed_dir_ = (*reader)->dir();
  // The load monitor restarts from the (possibly adopted) placement; the next plan is a window away.
  monitor_.reset();
  last_plan_step_ = resumed_.step;
  return ok_status();
}

}  // namespace piper::runtime
