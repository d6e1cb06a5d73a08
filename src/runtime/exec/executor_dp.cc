// The executor's data-parallel handler (see executor_handlers.h, docs/runtime.md): the gradient all-reduce over dp
// (zero=0) and ZeRO. A rank keeps the optimizer state (zero>=1), the accumulated gradient (zero>=2) and the
// parameters between uses (zero=3) only for its flat shard of each replicated chunk; ZeRO-3's all-gather before an
// F or B/BW materialises the whole parameters until the plan frees that buffer. ZeRO-1/2's all-gather of the updated
// shards runs where the plan put it: after the update, or (no update among its inputs) at the start of the next step,
// with complete_deferred_gathers() for whoever needs whole parameters between steps (docs/runtime.md).
#include <algorithm>
#include <chrono>

#include "piper/kernels/cpu/optimizer.h"
#include "piper/runtime/exec/executor_handlers.h"

namespace piper::runtime::detail {

using compile::Instruction;
using compile::OpKind;

namespace {
// A collective's staging buffer, left unfilled (each element is written before it is read): clearing it first
// cost a pass over every byte of the chunk per collective (docs/runtime.md "Data parallelism's staging copies").
using Floats = std::shared_ptr<float[]>;
Floats uninitialized_floats(size_t n) { return std::make_shared_for_overwrite<float[]>(n); }
}  // namespace

// The collectives of data parallelism: gradient all-reduce (zero=0), gradient reduce-scatter once per step
// (zero=1) or per microbatch (zero=2, 3), the all-gather of the updated parameters (zero=1, 2) and the parameter
// all-gather before each F and B/BW (zero=3).
Status DataParallel::resolve(const Instruction& in, Task* t) {
  const bool zero1_rs = in.comm == ir::NodeKind::kReduceScatter && in.mb < 0;
  const bool zero2_rs = in.comm == ir::NodeKind::kReduceScatter && in.mb >= 0;
  const bool zero1_ag = in.comm == ir::NodeKind::kAllGather && in.pass == ir::Pass::kU;
  const bool zero3_ag =
      in.comm == ir::NodeKind::kAllGather && in.mb >= 0 && (in.pass == ir::Pass::kF || ir::is_backward(in.pass));
  if (in.comm != ir::NodeKind::kAllReduce && !zero1_rs && !zero2_rs && !zero1_ag && !zero3_ag) {
    return unimplemented("executor: '" + in.label + "' (" + ir::to_string(in.comm) + " over " + in.group +
                         ") is not executed yet: the runtime runs pipeline, data (zero=0..3), expert and tensor " +
                         "parallelism; drop what this instruction implements from the strategy (docs/runtime.md)");
  }
  t->comm = core_.dist->group(in.group);
  if (t->comm == nullptr) {
    return internal_error("executor: '" + in.label + "' runs over mesh axis '" + in.group +
                          "', which has degree 1 on this plan");
  }
  t->degree = t->comm->size();
  t->chunk = core_.model->find(in.layer, in.part);
  if (t->chunk == nullptr) {
    return invalid_argument("executor: '" + in.label + "' reduces the gradients of (layer " + std::to_string(in.layer) +
                            ", " + in.part_name() + "), which this rank does not hold");
  }
  // When the plan reduces the experts over its edp group (Plan::experts_reduce_over_edp: folded, etp > 1 or
  // sequence parallelism), that group (DistContext builds it from Plan::group_ranks) spans the tensor ranks whose
  // experts saw other tokens: the reduction is a plain mean over it, which ExpertParallel::prepare_norm scales
  // into the mean over dp of the sum over tp, and every tensor rank owns its shard in the norm.
  const bool plan_edp_experts = core_.plan->experts_reduce_over_edp() && t->chunk->part() == Part::kExperts;
  if (zero1_ag) {
    // The update before it is sharded; nothing to count. Without the update among its inputs the plan defers it to
    // the next step's forward (param_gather "before_forward").
    const bool after_update = std::any_of(in.inputs.begin(), in.inputs.end(),
                                          [&](ir::NodeId id) { return core_.instr_of(id).op == OpKind::kUpdate; });
    if (!after_update) deferred_[t->chunk].comm = t->comm;
    return ok_status();
  }
  if (zero3_ag) {
    t->pass = in.pass;
    t->mb = in.mb;
    Shard& sh = shard_of(t->chunk, t->degree, t->comm->rank(), plan_edp_experts);
    sh.params_sharded = true;
    sh.group = t->comm;
    return ok_status();
  }
  if (zero1_rs || zero2_rs) {
    Shard& sh = shard_of(t->chunk, t->degree, t->comm->rank(), plan_edp_experts);
    sh.group = t->comm;
    sh.per_microbatch = zero2_rs;
    ++sh.count;
    if (zero2_rs) {
      ++reductions_total_;
      return ok_status();
    }
  }
  if (reduced_.count(t->chunk)) {
    return unimplemented("executor: '" + in.label + "' is a second gradient reduction of " + t->chunk->name() +
                         " (bucketed or per-microbatch reduction); the runtime reduces each chunk once per step");
  }
  reduced_.insert(t->chunk);
  ++reductions_total_;
  return ok_status();
}

DataParallel::Shard& DataParallel::shard_of(Chunk* chunk, int degree, int rank, bool every_tp_rank_owns) {
  Shard& sh = shards_[chunk];
  if (!sh.shapes.empty() || sh.per_rank > 0) return sh;
  sh.every_tp_rank_owns = every_tp_rank_owns;
  int64_t total = 0;
  for (const Param& p : chunk->params()) {
    if (!p.trainable) continue;
    total += p.value.numel();
    sh.shapes.push_back(p.value.shape());
  }
  sh.per_rank = (total + degree - 1) / degree;
  sh.begin = std::min(total, sh.per_rank * rank);
  sh.end = std::min(total, sh.begin + sh.per_rank);
  return sh;
}

Status DataParallel::setup() {
  for (const auto& [chunk, d] : deferred_) {
    const auto it = shards_.find(chunk);
    if (it == shards_.end() || it->second.params_sharded) {
      return internal_error("executor: " + chunk->name() + " has a parameter all-gather before its forward but no " +
                            "ZeRO-1/2 gradient reduce-scatter");
    }
  }
  for (auto& [c, sh] : shards_) {
    Chunk* chunk = const_cast<Chunk*>(c);
    if (sh.params_sharded && !sh.per_microbatch) {
      return internal_error("executor: " + chunk->name() + " has ZeRO-3 parameter all-gathers but no gradient " +
                            "reduce-scatter per microbatch");
    }
    // The optimizer state exists only for this rank's shard (ZeRO-1, 2, 3).
    core_.optimizer->shard(*chunk, sh.begin, sh.end);
    if (!sh.per_microbatch) continue;
    // ZeRO-2/3: the gradient is accumulated in a shard-sized tensor; the full one is a per-microbatch transient.
    PIPER_ASSIGN_OR_RETURN(sh.grad, Tensor::zeros({sh.end - sh.begin}, MemCategory::kGradients, core_.allocator));
    int64_t offset = 0;
    for (Param& p : chunk->params()) {
      if (!p.trainable) continue;
      p.grad = Tensor();
      if (sh.params_sharded) {
        // ZeRO-3: keep this rank's elements; the whole tensor exists only between an all-gather and the free of
        // its plan buffer.
        const int64_t n = p.value.numel(), lo = std::max(sh.begin, offset), hi = std::min(sh.end, offset + n);
        PIPER_ASSIGN_OR_RETURN(
            Tensor mine, Tensor::zeros({std::max<int64_t>(0, hi - lo)}, MemCategory::kParameters, core_.allocator));
        if (lo < hi) std::copy(p.value.data() + (lo - offset), p.value.data() + (hi - offset), mine.data());
        sh.values.push_back(std::move(mine));
        p.value = Tensor();
        offset += n;
      }
    }
  }
  return ok_status();
}

void DataParallel::materialize_grads(Chunk* chunk, Shard& sh) {
  size_t i = 0;
  for (Param& p : chunk->params()) {
    if (!p.trainable) continue;
    if (p.grad.numel() == 0) p.grad = Tensor::zeros_or_die(sh.shapes[i], MemCategory::kGradients, core_.allocator);
    ++i;
  }
}

DataParallel::Shard* DataParallel::shard(const Chunk& chunk) {
  auto it = shards_.find(&chunk);
  return it == shards_.end() ? nullptr : &it->second;
}

const DataParallel::Shard* DataParallel::shard(const Chunk& chunk) const {
  auto it = shards_.find(&chunk);
  return it == shards_.end() ? nullptr : &it->second;
}

void DataParallel::begin_step() {
  std::lock_guard<std::mutex> lock(mu_);
  reductions_done_ = 0;
  packs_done_.clear();
  full_grads_live_ = 0;
  for (auto& [chunk, sh] : shards_) {
    if (sh.per_microbatch) sh.grad.fill(0.0f);
    if (sh.gathered > 0) {  // left by a failed step: re-shard
      for (Param& p : const_cast<Chunk*>(chunk)->params()) {
        if (p.trainable) p.value = Tensor();
      }
      sh.gathered = 0;
    }
  }
}

void DataParallel::reduction_done() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++reductions_done_;
  }
  core_.notify();
}

bool DataParallel::reductions_complete() {
  std::lock_guard<std::mutex> lock(mu_);
  return reductions_done_ == reductions_total_;
}

Status DataParallel::check_gathered(const Task& t) {
  const Shard* sh = shard(*t.chunk);
  if (sh == nullptr || !sh->params_sharded || t.pass == ir::Pass::kW) return ok_status();
  std::lock_guard<std::mutex> lock(mu_);
  if (sh->gathered == 0) {
    return internal_error("'" + t.in->label + "' runs before the all-gather of its parameters (zero=3)");
  }
  return ok_status();
}

Status DataParallel::before_grad_task(const Task& t) {
  Shard* sh = shard(*t.chunk);
  if (sh == nullptr || !sh->per_microbatch) return ok_status();
  // ZeRO-2/3: the previous microbatch's gradient must have left the full tensors before this one accumulates
  // into them; they are then allocated again, zero.
  // At most kFullGradWindow chunks hold a full gradient at once (the one accumulating and the one its
  // reduce-scatter is about to take), so that compute running ahead of the reductions does not materialise
  // every chunk's gradient (the resource model's gradient bucket). The wait claims its place in the window.
  PIPER_RETURN_IF_ERROR(core_.wait_until(
      [&] {
        std::lock_guard<std::mutex> lock(mu_);
        if (packs_done_[t.chunk] < t.grad_index || full_grads_live_ >= kFullGradWindow) return false;
        ++full_grads_live_;
        return true;
      },
      Core::kWaitTimeout,
      "'" + t.in->label + "' waited 600 s for the gradient reduce-scatter of its previous microbatch or of " +
          "earlier chunks (ZeRO-2/3 keep at most " + std::to_string(kFullGradWindow) + " full gradients)"));
  std::lock_guard<std::mutex> lock(mu_);
  materialize_grads(t.chunk, *sh);
  return ok_status();
}

Result<bool> DataParallel::free_buffer(const Instruction& in) {
  auto param = param_buffers_.find(in.buffer);
  if (param == param_buffers_.end()) return false;
  // ZeRO-3: re-shard: the gathered copy dies with the last plan buffer that holds it.
  Shard& sh = shards_.at(param->second);
  std::lock_guard<std::mutex> lock(mu_);
  if (sh.gathered <= 0) return internal_error("'" + in.label + "' frees parameters never gathered");
  if (--sh.gathered == 0) {
    for (Param& p : param->second->params()) {
      if (p.trainable) p.value = Tensor();
    }
  }
  return true;
}

void DataParallel::update(Optimizer& optimizer, Chunk& chunk) {
  Shard* sh = shard(chunk);
  if (sh == nullptr) {
    optimizer.update(chunk);
    return;
  }
  optimizer.update_range(chunk, sh->begin, sh->end, sh->per_microbatch ? sh->grad.data() : nullptr,
                         sh->params_sharded ? &sh->values : nullptr);
  if (auto d = deferred_.find(&chunk); d != deferred_.end()) {
    std::lock_guard<std::mutex> lock(mu_);
    d->second.pending = true;
  }
}

Status DataParallel::complete_deferred_gathers() {
  std::vector<std::pair<std::pair<int, Part>, const Chunk*>> order;
  for (const auto& [chunk, d] : deferred_) order.push_back({{chunk->layer(), chunk->part()}, chunk});
  std::sort(order.begin(), order.end());
  for (const auto& [key, chunk] : order) {
    DeferredGather& d = deferred_.at(chunk);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!d.pending) continue;
    }
    Status st = gather_whole(*const_cast<Chunk*>(chunk), shards_.at(chunk), *d.comm);
    if (!st.ok()) return st.with_context("completing the parameter all-gathers the plan defers to the next step");
    std::lock_guard<std::mutex> lock(mu_);
    d.pending = false;
  }
  return ok_status();
}

std::optional<double> DataParallel::grad_sq(const Chunk& chunk) {
  const Shard* sh = shard(chunk);
  if (sh == nullptr) return std::nullopt;
  // Every data-parallel rank owns its shard (on tensor rank 0, or every tensor rank when the shard spans the plan's
  // edp group, tensor ranks included: Shard::every_tp_rank_owns).
  const bool owner = core_.dist->coord().tp == 0 || sh->every_tp_rank_owns;
  if (sh->per_microbatch) {  // ZeRO-2/3: the accumulated gradient shard
    const double norm = kernels::grad_global_norm({{sh->grad.data(), sh->grad.numel()}});
    return owner ? norm * norm : 0.0;
  }
  // ZeRO-1: the shard of the reduced gradient.
  return owner ? Optimizer::grad_sq_range(chunk, sh->begin, sh->end) : 0.0;
}

std::vector<Executor::ParamShard> DataParallel::param_shards(const Chunk& chunk) {
  std::vector<Executor::ParamShard> out;
  Shard* found = shard(chunk);
  if (found == nullptr || !found->params_sharded) return out;
  Shard& sh = *found;
  int64_t offset = 0;
  size_t i = 0;
  for (const Param& p : chunk.params()) {
    if (!p.trainable) continue;
    int64_t n = 1;
    for (int64_t d : sh.shapes[i]) n *= d;
    const int64_t lo = std::max(sh.begin, offset), hi = std::max(lo, std::min(sh.end, offset + n));
    out.push_back({&p, sh.shapes[i], &sh.values[i], std::min(lo - offset, n), std::min(hi - offset, n)});
    offset += n;
    ++i;
  }
  return out;
}

Status DataParallel::run(const Task& t) {
  if (t.in->comm == ir::NodeKind::kReduceScatter) return reduce_scatter(t);
  if (t.in->comm == ir::NodeKind::kAllGather) return gather_params(t);
  return all_reduce(t);
}

Status DataParallel::all_reduce(const Task& t) {
  size_t total = 0;
  for (const Param& p : t.chunk->params()) total += p.trainable ? static_cast<size_t>(p.grad.numel()) : 0;
  Floats buf = uninitialized_floats(total);
  size_t at = 0;
  for (const Param& p : t.chunk->params()) {
    if (!p.trainable) continue;
    std::copy(p.grad.data(), p.grad.data() + p.grad.numel(), buf.get() + at);
    at += static_cast<size_t>(p.grad.numel());
  }
  // Out of place: in place, the communicator copies a large input first (comm/mpi/mpi_communicator.cc).
  Floats sum = uninitialized_floats(total);
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, t.comm->all_reduce_sum(buf.get(), sum.get(), total));
  std::shared_ptr<const void> keep = std::make_shared<std::pair<Floats, Floats>>(buf, sum);
  PIPER_RETURN_IF_ERROR(core_.wait_comm(*t.comm, h, keep, "gradient all-reduce of " + t.chunk->name()));
  // The data-parallel gradient is the mean of the replicas' (each already a mean over its microbatches).
  const float scale = 1.0f / static_cast<float>(t.degree);
  at = 0;
  for (Param& p : t.chunk->params()) {
    if (!p.trainable) continue;
    float* g = p.grad.data();
    for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] = sum[at + static_cast<size_t>(i)] * scale;
    at += static_cast<size_t>(p.grad.numel());
  }
  reduction_done();
  return ok_status();
}

namespace {
// The chunk's trainable tensors as one flat vector, `padded` long (the tail past them zero).
template <typename Get>
Floats pack(Chunk& chunk, size_t padded, Get get) {
  Floats buf = uninitialized_floats(padded);
  size_t at = 0;
  for (Param& p : chunk.params()) {
    if (!p.trainable) continue;
    const Tensor& t = get(p);
    std::copy(t.data(), t.data() + t.numel(), buf.get() + at);
    at += static_cast<size_t>(t.numel());
  }
  std::fill(buf.get() + at, buf.get() + padded, 0.0f);
  return buf;
}

// Elements [begin, begin + n) of the chunk's trainable parameters flattened (zero past their end): this rank's
// shard, packed without the whole chunk.
Floats pack_range(Chunk& chunk, int64_t begin, int64_t n) {
  Floats buf = uninitialized_floats(static_cast<size_t>(n));
  int64_t offset = 0, filled = 0;
  for (Param& p : chunk.params()) {
    if (!p.trainable) continue;
    const int64_t size = p.value.numel(), lo = std::max(begin, offset), hi = std::min(begin + n, offset + size);
    if (lo < hi) {
      std::copy(p.value.data() + (lo - offset), p.value.data() + (hi - offset), buf.get() + (lo - begin));
      filled = hi - begin;
    }
    offset += size;
  }
  std::fill(buf.get() + filled, buf.get() + n, 0.0f);
  return buf;
}
}  // namespace

Status DataParallel::reduce_scatter(const Task& t) {
  Shard& sh = shards_.at(t.chunk);
  const size_t per_rank = static_cast<size_t>(sh.per_rank);
  auto in = pack(*t.chunk, per_rank * static_cast<size_t>(t.degree), [](Param& p) -> const Tensor& { return p.grad; });
  if (sh.per_microbatch) {
    // ZeRO-2/3: this microbatch's gradient leaves the full tensors, which are freed (the chunk's next
    // weight-gradient task waits for this, executor.cc, and allocates them again from zero), so no contribution
    // is counted twice or lost.
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Param& p : t.chunk->params()) {
        if (p.trainable) p.grad = Tensor();
      }
      --full_grads_live_;
      ++packs_done_[t.chunk];
    }
    core_.notify();
  }
  Floats out = uninitialized_floats(per_rank);
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, t.comm->reduce_scatter_sum(in.get(), out.get(), per_rank));
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(in), decltype(out)>>(in, out);
  PIPER_RETURN_IF_ERROR(core_.wait_comm(*t.comm, h, keep, "gradient reduce-scatter of " + t.chunk->name()));
  // The mean over the group (the experts over edp: scaled by ExpertParallel::prepare_norm).
  const float scale = 1.0f / static_cast<float>(t.degree);
  if (sh.per_microbatch) {
    // Gradients accumulate sharded, as the mean over the group of each microbatch's gradient.
    float* acc = sh.grad.data();
    for (int64_t i = 0; i < sh.end - sh.begin; ++i) acc[i] += out[static_cast<size_t>(i)] * scale;
    reduction_done();
    return ok_status();
  }
  // ZeRO-1: this rank's shard of the mean gradient; the rest of the chunk's gradient is not used by its update
  // or norm.
  int64_t offset = 0;
  for (Param& p : t.chunk->params()) {
    if (!p.trainable) continue;
    const int64_t lo = std::max(sh.begin, offset), hi = std::min(sh.end, offset + p.grad.numel());
    for (int64_t i = lo; i < hi; ++i) {
      p.grad.data()[i - offset] = out[static_cast<size_t>(i - sh.begin)] * scale;
    }
    offset += p.grad.numel();
  }
  reduction_done();
  return ok_status();
}

Status DataParallel::gather_params(const Task& t) {
  auto it = shards_.find(t.chunk);
  if (it == shards_.end()) return internal_error("'" + t.in->label + "': parameters gathered without a reduce-scatter");
  Shard& sh = it->second;
  const size_t per_rank = static_cast<size_t>(sh.per_rank);
  if (sh.params_sharded) {
    // ZeRO-3: every rank contributes its kept elements; the whole parameters exist until the plan frees the
    // gathered buffer after the task that uses them. Tasks of one step see the same values (the update comes
    // after every use), so a copy still live from an earlier all-gather is kept and this one's data dropped.
    Floats mine = uninitialized_floats(per_rank);
    size_t at = 0;
    for (const Tensor& v : sh.values) {
      std::copy(v.data(), v.data() + v.numel(), mine.get() + at);
      at += static_cast<size_t>(v.numel());
    }
    std::fill(mine.get() + at, mine.get() + per_rank, 0.0f);
    Floats full = uninitialized_floats(per_rank * static_cast<size_t>(t.degree));
    PIPER_ASSIGN_OR_RETURN(comm::Handle h, t.comm->all_gather(mine.get(), full.get(), per_rank * sizeof(float)));
    std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(mine), decltype(full)>>(mine, full);
    PIPER_RETURN_IF_ERROR(core_.wait_comm(*t.comm, h, keep, "parameter all-gather of " + t.chunk->name()));
    std::lock_guard<std::mutex> lock(mu_);
    if (sh.gathered++ == 0) {
      at = 0;
      size_t i = 0;
      for (Param& p : t.chunk->params()) {
        if (!p.trainable) continue;
        PIPER_ASSIGN_OR_RETURN(p.value, Tensor::zeros(sh.shapes[i++], MemCategory::kBuffers, core_.allocator));
        std::copy(full.get() + at, full.get() + at + p.value.numel(), p.value.data());
        at += static_cast<size_t>(p.value.numel());
      }
    }
    return ok_status();
  }
  auto deferred = deferred_.find(t.chunk);
  if (deferred == deferred_.end()) return gather_whole(*t.chunk, sh, *t.comm);
  // Deferred to this step (before_forward): the previous step's update, if one ran since the last gather (the
  // first step's and one after complete_deferred_gathers() find every replica whole already).
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!deferred->second.pending) return ok_status();
  }
  PIPER_RETURN_IF_ERROR(gather_whole(*t.chunk, sh, *t.comm));
  std::lock_guard<std::mutex> lock(mu_);
  deferred->second.pending = false;
  return ok_status();
}

Status DataParallel::gather_whole(Chunk& chunk, const Shard& sh, comm::Communicator& comm) {
  const size_t per_rank = static_cast<size_t>(sh.per_rank);
  Floats mine = pack_range(chunk, sh.begin, sh.per_rank);
  Floats full = uninitialized_floats(per_rank * static_cast<size_t>(comm.size()));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, comm.all_gather(mine.get(), full.get(), per_rank * sizeof(float)));
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(mine), decltype(full)>>(mine, full);
  PIPER_RETURN_IF_ERROR(core_.wait_comm(comm, h, keep, "parameter all-gather of " + chunk.name()));
  size_t at = 0;
  for (Param& p : chunk.params()) {
    if (!p.trainable) continue;
    std::copy(full.get() + at, full.get() + at + p.value.numel(), p.value.data());
    at += static_cast<size_t>(p.value.numel());
  }
  return ok_status();
}

std::vector<std::pair<float*, int64_t>> DataParallel::grad_pieces(Chunk& chunk,
                                                                  const std::function<bool(const Param&)>& select) {
  std::vector<std::pair<float*, int64_t>> out;
  const Shard* sh = shard(chunk);
  int64_t offset = 0;
  size_t i = 0;
  for (Param& p : chunk.params()) {
    if (!p.trainable) continue;
    // Under ZeRO-2/3 p.grad is empty between microbatches: the element count comes from the recorded shape.
    int64_t n = p.grad.numel();
    if (sh != nullptr && i < sh->shapes.size()) {
      n = 1;
      for (int64_t d : sh->shapes[i]) n *= d;
    }
    ++i;
    if (select(p)) {
      if (sh == nullptr) {
        out.emplace_back(p.grad.data(), n);
      } else {
        const int64_t lo = std::max(sh->begin, offset), hi = std::min(sh->end, offset + n);
        if (lo < hi) {
          float* base = sh->per_microbatch ? const_cast<float*>(sh->grad.data()) + (lo - sh->begin)
                                           : p.grad.data() + (lo - offset);
          out.emplace_back(base, hi - lo);
        }
      }
    }
    offset += n;
  }
  return out;
}

Result<std::vector<std::vector<std::vector<float>>>> DataParallel::gather_shard_state(Chunk& chunk, const Shard& sh) {
  if (sh.group == nullptr) return internal_error("expert migration: " + chunk.name() + " has no shard group");
  std::map<std::string, Tensor*> moments;
  for (const Optimizer::StateTensor& st : core_.optimizer->state()) moments[st.name] = st.tensor;
  const size_t per = static_cast<size_t>(sh.per_rank), degree = static_cast<size_t>(sh.group->size());
  std::vector<std::vector<std::vector<float>>> whole(sh.params_sharded ? 3 : 2);
  for (size_t kind = 0; kind < whole.size(); ++kind) {
    std::vector<float> mine(per, 0.0f), all(per * degree);
    size_t at = 0, index = 0;
    for (const Param& p : chunk.params()) {
      if (!p.trainable) continue;
      const Tensor* piece = nullptr;
      if (kind == 2) {
        piece = &sh.values[index];
      } else {
        auto it = moments.find(p.name + (kind == 0 ? ".m" : ".v"));
        if (it == moments.end()) return internal_error("expert migration: no optimizer state for " + p.name);
        piece = it->second;
      }
      ++index;
      if (at + static_cast<size_t>(piece->numel()) > per) {
        return internal_error("expert migration: the shard of " + chunk.name() + " exceeds its per-rank size");
      }
      std::copy(piece->data(), piece->data() + piece->numel(), mine.data() + at);
      at += static_cast<size_t>(piece->numel());
    }
    PIPER_ASSIGN_OR_RETURN(comm::Handle h, sh.group->all_gather(mine.data(), all.data(), per * sizeof(float)));
    Status st = sh.group->wait(h, core_.dist->timeout_s());
    if (!st.ok()) return st.with_context("expert migration: gathering the ZeRO shards of " + chunk.name());
    size_t offset = 0;  // rank r's shard is flat elements [r * per, (r + 1) * per): `all` is the flat vector
    for (const Shape& shape : sh.shapes) {
      size_t n = 1;
      for (int64_t dim : shape) n *= static_cast<size_t>(dim);
      whole[kind].emplace_back(all.begin() + static_cast<std::ptrdiff_t>(offset),
                               all.begin() + static_cast<std::ptrdiff_t>(offset + n));
      offset += n;
    }
  }
  return whole;
}

void DataParallel::scatter_shard_state(Chunk& chunk, Shard& sh,
                                       const std::vector<std::vector<std::vector<float>>>& whole) {
  std::map<std::string, Tensor*> moments;
  for (const Optimizer::StateTensor& st : core_.optimizer->state()) moments[st.name] = st.tensor;
  for (size_t kind = 0; kind < whole.size(); ++kind) {
    std::vector<float> flat;
    for (const std::vector<float>& t : whole[kind]) flat.insert(flat.end(), t.begin(), t.end());
    size_t at = static_cast<size_t>(sh.begin), index = 0;
    for (const Param& p : chunk.params()) {
      if (!p.trainable) continue;
      Tensor* piece = kind == 2 ? &sh.values[index] : moments.at(p.name + (kind == 0 ? ".m" : ".v"));
      ++index;
      std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at),
                flat.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(piece->numel())), piece->data());
      at += static_cast<size_t>(piece->numel());
    }
  }
}

}  // namespace piper::runtime::detail
