// The executor's communication instructions (multi-rank programs); see executor.h and docs/runtime.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <type_traits>

#include "piper/base/fault.h"
#include "piper/kernels/cpu/optimizer.h"
#include "piper/runtime/executor_impl.h"

namespace piper::runtime {

using compile::Instruction;
using compile::OpKind;
using detail::Task;

Status Executor::Impl::resolve_comm(const Instruction& in, Task* t) {
  if (in.node == ir::kNoNode) return internal_error("executor: '" + in.label + "' names no graph node");
  if (in.op == OpKind::kSend || in.op == OpKind::kRecv) {
    if (in.comm == ir::NodeKind::kM2N) {  // af-pipe (executor_m2n.cc); a dense m2n is a pipeline message
      PIPER_ASSIGN_OR_RETURN(bool routed, resolve_m2n(in, t));
      if (routed) return ok_status();
    }
    t->peer = dist->pipeline_peer(in.peer);
    if (t->peer < 0 || t->peer == dist->rank()) {
      return invalid_argument("executor: '" + in.label + "' names pipeline rank " + std::to_string(in.peer) +
                              ", which is not another rank of this pipeline");
    }
    if (in.tag < 0 || in.tag > 32767) {
      return invalid_argument("executor: '" + in.label + "' has tag " + std::to_string(in.tag) +
                              " outside the communicator's [0, 32767]");
    }
    const bool sending = in.op == OpKind::kSend;
    int count = 0;
    for (ir::NodeId id : sending ? in.inputs : in.outputs) {
      const Instruction& chunk = instr_of(id);
      // A chunk, an expert combine whose output crosses to the next stage (executor_ep.cc), or a tensor-parallel
      // exchange at a stage boundary (its reduce-scatter feeds the send, the receive feeds its all-gather: the
      // message is then the sequence slice, executor_tp.cc).
      if (chunk.comm != ir::NodeKind::kChunk && chunk.comm != ir::NodeKind::kAllToAll &&
          !detail::is_tp_exchange(chunk)) {
        return internal_error("executor: '" + in.label + "' is linked to non-chunk node '" + chunk.label + "'");
      }
      t->gradient = chunk.pass != ir::Pass::kF;
      if (sending) t->source = id;
      ++count;
    }
    if (sending && count != 1) {
      return internal_error("executor: '" + in.label + "' has " + std::to_string(count) + " producers, expected 1");
    }
    if (!sending) t->consumers = count;
    return ok_status();
  }
  if (detail::is_tp_exchange(in)) return resolve_tp(in, t);
  // Collective: gradient all-reduce (zero=0), gradient reduce-scatter once per step (zero=1) or per microbatch
  // (zero=2, 3), the all-gather of the updated parameters (zero=1, 2) and the parameter all-gather before each
  // F and B/BW (zero=3).
  if (in.comm == ir::NodeKind::kAllToAll) return resolve_ep(in, t);  // executor_ep.cc
  const bool zero1_rs = in.comm == ir::NodeKind::kReduceScatter && in.mb < 0;
  const bool zero2_rs = in.comm == ir::NodeKind::kReduceScatter && in.mb >= 0;
  const bool zero1_ag = in.comm == ir::NodeKind::kAllGather && in.pass == ir::Pass::kU;
  const bool zero3_ag = in.comm == ir::NodeKind::kAllGather && in.mb >= 0 &&
                        (in.pass == ir::Pass::kF || ir::is_backward(in.pass));
  if (in.comm != ir::NodeKind::kAllReduce && !zero1_rs && !zero2_rs && !zero1_ag && !zero3_ag) {
    return unimplemented("executor: '" + in.label + "' (" + ir::to_string(in.comm) + " over " + in.group +
                         ") is not executed yet: the runtime runs pipeline, data (zero=0..3), expert and tensor " +
                         "parallelism; drop what this instruction implements from the strategy (docs/runtime.md)");
  }
  t->comm = dist->group(in.group);
  if (t->comm == nullptr) {
    return internal_error("executor: '" + in.label + "' runs over mesh axis '" + in.group +
                          "', which has degree 1 on this plan");
  }
  t->degree = t->comm->size();
  t->chunk = model->find(in.layer, in.part);
  if (t->chunk == nullptr) {
    return invalid_argument("executor: '" + in.label + "' reduces the gradients of (layer " +
                            std::to_string(in.layer) + ", " + in.part + "), which this rank does not hold");
  }
  // ZeRO under tensor parallelism with sequence parallelism: the experts (not split over tp, etp=1) are replicated
  // over edp x tp and their gradients are partial on each tensor rank, so their shards span both: one
  // reduce-scatter over edp_tp sums over tp and averages over edp (the resource model's expert shard).
  bool over_tp = false;
  if ((zero1_rs || zero2_rs || zero1_ag || zero3_ag) && tp.size > 1 && tp.sequence_parallel &&
      t->chunk->part() == "experts" && t->degree == plan->mesh.dp / std::max(1, plan->mesh.ep)) {
    t->comm = dist->group("edp_tp");
    if (t->comm == nullptr) {
      return internal_error("executor: '" + in.label + "' shards the experts over edp x tp, but this rank has " +
                            "no edp_tp group");
    }
    t->degree = t->comm->size();
    over_tp = true;
  }
  if (zero1_ag) return ok_status();  // the update before it is sharded; nothing to count
  if (zero3_ag) {
    t->pass = in.pass;
    t->mb = in.mb;
    Shard& sh = shard_of(t->chunk, t->degree, t->comm->rank());
    sh.params_sharded = true;
    sh.over_tp = over_tp;
    sh.group = t->comm;
    return ok_status();
  }
  if (zero1_rs || zero2_rs) {
    Shard& sh = shard_of(t->chunk, t->degree, t->comm->rank());
    sh.over_tp = over_tp;
    sh.group = t->comm;
    sh.per_microbatch = zero2_rs;
    ++sh.count;
    if (zero2_rs) {
      ++reductions_total;
      return ok_status();
    }
  }
  if (reduced.count(t->chunk)) {
    return unimplemented("executor: '" + in.label + "' is a second gradient reduction of " + t->chunk->name() +
                         " (bucketed or per-microbatch reduction); the runtime reduces each chunk once per step");
  }
  reduced.insert(t->chunk);
  ++reductions_total;
  return ok_status();
}

Executor::Impl::Shard& Executor::Impl::shard_of(Chunk* chunk, int degree, int rank) {
  Shard& sh = shards[chunk];
  if (!sh.shapes.empty() || sh.per_rank > 0) return sh;
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

Status Executor::Impl::shard_state() {
  for (auto& [c, sh] : shards) {
    Chunk* chunk = const_cast<Chunk*>(c);
    if (sh.params_sharded && !sh.per_microbatch) {
      return internal_error("executor: " + chunk->name() + " has ZeRO-3 parameter all-gathers but no gradient " +
                            "reduce-scatter per microbatch");
    }
    // The optimizer state exists only for this rank's shard (ZeRO-1, 2, 3).
    optimizer->shard(*chunk, sh.begin, sh.end);
    if (!sh.per_microbatch) continue;
    // ZeRO-2/3: the gradient is accumulated in a shard-sized tensor; the full one is a per-microbatch transient.
    PIPER_ASSIGN_OR_RETURN(sh.grad, Tensor::zeros({sh.end - sh.begin}, MemCategory::kGradients, allocator));
    int64_t offset = 0;
    for (Param& p : chunk->params()) {
      if (!p.trainable) continue;
      p.grad = Tensor();
      if (sh.params_sharded) {
        // ZeRO-3: keep this rank's elements; the whole tensor exists only between an all-gather and the free of
        // its plan buffer.
        const int64_t n = p.value.numel(), lo = std::max(sh.begin, offset), hi = std::min(sh.end, offset + n);
        PIPER_ASSIGN_OR_RETURN(Tensor mine,
                               Tensor::zeros({std::max<int64_t>(0, hi - lo)}, MemCategory::kParameters, allocator));
        if (lo < hi) std::copy(p.value.data() + (lo - offset), p.value.data() + (hi - offset), mine.data());
        sh.values.push_back(std::move(mine));
        p.value = Tensor();
        offset += n;
      }
    }
  }
  return ok_status();
}

void Executor::Impl::materialize_grads(Chunk* chunk, Shard& sh) {
  size_t i = 0;
  for (Param& p : chunk->params()) {
    if (!p.trainable) continue;
    if (p.grad.numel() == 0) p.grad = Tensor::zeros_or_die(sh.shapes[i], MemCategory::kGradients, allocator);
    ++i;
  }
}

Status Executor::Impl::wait_comm(comm::Communicator& c, comm::Handle& h, std::shared_ptr<const void> keep,
                                 const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    PIPER_ASSIGN_OR_RETURN(bool done, c.test(h));
    if (done) return ok_status();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Status live = comm::peer_liveness();
    if (stop || !live.ok() || waited > dist->timeout_s()) {
      Status st = ok_status();
      if (stop) {
        st = unavailable(what + ": abandoned, another stream of this rank failed");
      } else if (!live.ok()) {
        st = live.with_context(what + " on rank " + std::to_string(dist->rank()));
      } else {
        st = deadline_exceeded(what + " on rank " + std::to_string(dist->rank()) + " made no progress for " +
                               std::to_string(static_cast<int>(waited)) + " s (PIPER_COMM_TIMEOUT_S): " +
                               c.stalled_error(h, waited).message());
      }
      std::lock_guard<std::mutex> lock(mu);
      abandoned.push_back(std::move(keep));  // MPI may still touch it
      return st.ok() ? ok_status() : st;
    }
    // Ranks share few cores with their own compute threads: after a few quick polls, back off to sleeping
    // (50 us doubling to 1 ms), so that a stream waiting for a peer does not steal the core that peer needs.
    if (polls < 16) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 50 << std::min(polls - 16, 5))));
    }
  }
}

Status Executor::Impl::send(const Task& t) {
  const Instruction& in = *t.in;
  if (t.m2n_routed) return m2n_exchange(t);
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Tensor> tensor, take_hidden(t, "ranks"));
  if (tensor == nullptr) return internal_error("'" + in.label + "': the message has no hidden tensor");
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, dist->p2p().isend(tensor->data(), static_cast<size_t>(tensor->nbytes()),
                                                           t.peer, static_cast<int>(in.tag)));
  fault_point("pp_send");
  return wait_comm(dist->p2p(), h, tensor, "send to rank " + std::to_string(t.peer));
}

Status Executor::Impl::recv(const Task& t) {
  const Instruction& in = *t.in;
  if (t.m2n_routed) return m2n_exchange(t);
  // Under sequence parallelism every hidden state between chunks of different stages is this rank's slice.
  const int64_t tokens = mbs * batch->seq_len / (tp.sequence_parallel ? tp.size : 1), hidden = model->dims().hidden;
  PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({tokens, hidden}, MemCategory::kBuffers, allocator));
  auto tensor = std::make_shared<Tensor>(std::move(buf));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, dist->p2p().irecv(tensor->data(), static_cast<size_t>(tensor->nbytes()),
                                                           t.peer, static_cast<int>(in.tag)));
  PIPER_RETURN_IF_ERROR(wait_comm(dist->p2p(), h, tensor, "receive from rank " + std::to_string(t.peer)));
  publish_hidden(t, std::move(tensor));
  return ok_status();
}

Status Executor::Impl::collective(const Task& t) {
  if (t.in->comm == ir::NodeKind::kAllToAll) return ep_exchange(t);
  if (detail::is_tp_exchange(*t.in)) return tp_exchange(t);
  if (t.in->comm == ir::NodeKind::kReduceScatter) return reduce_scatter(t);
  if (t.in->comm == ir::NodeKind::kAllGather) return gather_params(t);
  size_t total = 0;
  for (const Param& p : t.chunk->params()) total += p.trainable ? static_cast<size_t>(p.grad.numel()) : 0;
  auto buf = std::make_shared<std::vector<float>>(total);
  size_t at = 0;
  for (const Param& p : t.chunk->params()) {
    if (!p.trainable) continue;
    std::copy(p.grad.data(), p.grad.data() + p.grad.numel(), buf->data() + at);
    at += static_cast<size_t>(p.grad.numel());
  }
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, t.comm->all_reduce_sum(buf->data(), buf->data(), total));
  PIPER_RETURN_IF_ERROR(wait_comm(*t.comm, h, buf, "gradient all-reduce of " + t.chunk->name()));
  // The data-parallel gradient is the mean of the replicas' (each already a mean over its microbatches).
  const float scale = 1.0f / static_cast<float>(t.degree);
  at = 0;
  for (Param& p : t.chunk->params()) {
    if (!p.trainable) continue;
    float* g = p.grad.data();
    for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] = (*buf)[at + static_cast<size_t>(i)] * scale;
    at += static_cast<size_t>(p.grad.numel());
  }
  std::lock_guard<std::mutex> lock(mu);
  ++reductions_done;
  cv.notify_all();
  return ok_status();
}

// The chunk's trainable tensors as one flat vector, `per_rank * degree` long (zero padded).
namespace {
template <typename Get>
std::shared_ptr<std::vector<float>> pack(Chunk& chunk, size_t padded, Get get) {
  auto buf = std::make_shared<std::vector<float>>(padded, 0.0f);
  size_t at = 0;
  for (Param& p : chunk.params()) {
    if (!p.trainable) continue;
    const Tensor& t = get(p);
    std::copy(t.data(), t.data() + t.numel(), buf->data() + at);
    at += static_cast<size_t>(t.numel());
  }
  return buf;
}
}  // namespace

Status Executor::Impl::reduce_scatter(const Task& t) {
  Shard& sh = shards.at(t.chunk);
  const size_t per_rank = static_cast<size_t>(sh.per_rank);
  auto in = pack(*t.chunk, per_rank * static_cast<size_t>(t.degree), [](Param& p) -> const Tensor& { return p.grad; });
  if (sh.per_microbatch) {
    // ZeRO-2/3: this microbatch's gradient leaves the full tensors, which are freed (the chunk's next
    // weight-gradient task waits for this, executor.cc, and allocates them again from zero), so no contribution
    // is counted twice or lost.
    std::lock_guard<std::mutex> lock(mu);
    for (Param& p : t.chunk->params()) {
      if (p.trainable) p.grad = Tensor();
    }
    --full_grads_live;
    ++packs_done[t.chunk];
    cv.notify_all();
  }
  auto out = std::make_shared<std::vector<float>>(per_rank);
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, t.comm->reduce_scatter_sum(in->data(), out->data(), per_rank));
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(in), decltype(out)>>(in, out);
  PIPER_RETURN_IF_ERROR(wait_comm(*t.comm, h, keep, "gradient reduce-scatter of " + t.chunk->name()));
  // The mean over the data-parallel replicas; over edp x tp the tensor ranks' partial gradients are summed.
  const float scale = 1.0f / static_cast<float>(sh.over_tp ? t.degree / tp.size : t.degree);
  if (sh.per_microbatch) {
    // Gradients accumulate sharded, as the mean over the group of each microbatch's gradient.
    float* acc = sh.grad.data();
    for (int64_t i = 0; i < sh.end - sh.begin; ++i) acc[i] += (*out)[static_cast<size_t>(i)] * scale;
    ++shard_reductions[t.chunk];
    std::lock_guard<std::mutex> lock(mu);
    ++reductions_done;
    cv.notify_all();
    return ok_status();
  }
  // ZeRO-1: this rank's shard of the mean gradient; the rest of the chunk's gradient is not used by its update
  // or norm.
  int64_t offset = 0;
  for (Param& p : t.chunk->params()) {
    if (!p.trainable) continue;
    const int64_t lo = std::max(sh.begin, offset), hi = std::min(sh.end, offset + p.grad.numel());
    for (int64_t i = lo; i < hi; ++i) {
      p.grad.data()[i - offset] = (*out)[static_cast<size_t>(i - sh.begin)] * scale;
    }
    offset += p.grad.numel();
  }
  std::lock_guard<std::mutex> lock(mu);
  ++reductions_done;
  cv.notify_all();
  return ok_status();
}

Status Executor::Impl::gather_params(const Task& t) {
  auto it = shards.find(t.chunk);
  if (it == shards.end()) return internal_error("'" + t.in->label + "': parameters gathered without a reduce-scatter");
  Shard& sh = it->second;
  const size_t per_rank = static_cast<size_t>(sh.per_rank);
  if (sh.params_sharded) {
    // ZeRO-3: every rank contributes its kept elements; the whole parameters exist until the plan frees the
    // gathered buffer after the task that uses them. Tasks of one step see the same values (the update comes
    // after every use), so a copy still live from an earlier all-gather is kept and this one's data dropped.
    auto mine = std::make_shared<std::vector<float>>(per_rank, 0.0f);
    size_t at = 0;
    for (const Tensor& v : sh.values) {
      std::copy(v.data(), v.data() + v.numel(), mine->data() + at);
      at += static_cast<size_t>(v.numel());
    }
    auto full = std::make_shared<std::vector<float>>(per_rank * static_cast<size_t>(t.degree));
    PIPER_ASSIGN_OR_RETURN(comm::Handle h, t.comm->all_gather(mine->data(), full->data(), per_rank * sizeof(float)));
    std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(mine), decltype(full)>>(mine, full);
    PIPER_RETURN_IF_ERROR(wait_comm(*t.comm, h, keep, "parameter all-gather of " + t.chunk->name()));
    std::lock_guard<std::mutex> lock(mu);
    if (sh.gathered++ == 0) {
      at = 0;
      size_t i = 0;
      for (Param& p : t.chunk->params()) {
        if (!p.trainable) continue;
        PIPER_ASSIGN_OR_RETURN(p.value, Tensor::zeros(sh.shapes[i++], MemCategory::kBuffers, allocator));
        std::copy(full->data() + at, full->data() + at + p.value.numel(), p.value.data());
        at += static_cast<size_t>(p.value.numel());
      }
    }
    return ok_status();
  }
  auto full =
      pack(*t.chunk, per_rank * static_cast<size_t>(t.degree), [](Param& p) -> const Tensor& { return p.value; });
  auto mine = std::make_shared<std::vector<float>>(full->begin() + sh.begin, full->begin() + sh.begin + sh.per_rank);
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, t.comm->all_gather(mine->data(), full->data(), per_rank * sizeof(float)));
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(mine), decltype(full)>>(mine, full);
  PIPER_RETURN_IF_ERROR(wait_comm(*t.comm, h, keep, "parameter all-gather of " + t.chunk->name()));
  size_t at = 0;
  for (Param& p : t.chunk->params()) {
    if (!p.trainable) continue;
    std::copy(full->data() + at, full->data() + at + p.value.numel(), p.value.data());
    at += static_cast<size_t>(p.value.numel());
  }
  return ok_status();
}

Result<double> Executor::Impl::global_grad_norm() {
  ep_scale_grads();
  double local = 0;
  for (const auto& c : model->chunks()) {
    auto it = norm_owner.find(c.get());
    auto shard = shards.find(c.get());
    if (tp.sliced.count(c.get())) {
      // Split chunk: each tensor rank owns its slice; under ZeRO each data-parallel rank its shard of it.
      if (shard != shards.end() || dist->coord().dp == 0) local += tp_grad_sq(*c);
    } else if (shard != shards.end() && shard->second.per_microbatch) {
      // ZeRO-2/3: every data-parallel rank owns its accumulated gradient shard.
      const Tensor& g = shard->second.grad;
      const double norm = kernels::grad_global_norm({{g.data(), g.numel()}});
      if (dist->coord().tp == 0 || shard->second.over_tp) local += norm * norm;
    } else if (shard != shards.end()) {
      // ZeRO-1: every data-parallel rank owns its shard of the reduced gradient.
      if (dist->coord().tp == 0 || shard->second.over_tp) {
        local += Optimizer::grad_sq_range(*c, shard->second.begin, shard->second.end);
      }
    } else if (it != norm_owner.end() && it->second) {
      local += Optimizer::grad_sq(*c);
    }
  }
  auto all = std::make_shared<std::vector<double>>(static_cast<size_t>(dist->world_size()));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, dist->ctl().all_gather(&local, all->data(), sizeof(double)));
  PIPER_RETURN_IF_ERROR(wait_comm(dist->ctl(), h, all, "gradient norm exchange"));
  double sum = 0;
  for (double v : *all) sum += v;  // rank order: the same bits on every rank
  return std::sqrt(sum);
}

Status Executor::Impl::reduce_losses(double* loss, double* aux) {
  // Ranks of one tensor-parallel group see the same tokens: only tp rank 0 reports. With sequence parallelism
  // each sees a slice: the loss is the mean of the slices' means and the aux losses are parts of one sum.
  const int shards = tp.sequence_parallel ? tp.size : 1;
  const bool reports = dist->coord().tp == 0 || shards > 1;
  double local[2] = {0, 0};
  for (int k = 0; k < num_mb && reports; ++k) {
    local[0] += loss_mb[static_cast<size_t>(k)];
    local[1] += aux_mb[static_cast<size_t>(k)];
  }
  auto all = std::make_shared<std::vector<double>>(2 * static_cast<size_t>(dist->world_size()));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, dist->ctl().all_gather(local, all->data(), sizeof(local)));
  PIPER_RETURN_IF_ERROR(wait_comm(dist->ctl(), h, all, "loss exchange"));
  double sum_loss = 0, sum_aux = 0;
  for (int r = 0; r < dist->world_size(); ++r) {
    sum_loss += (*all)[2 * static_cast<size_t>(r)];
    sum_aux += (*all)[2 * static_cast<size_t>(r) + 1];
  }
  const double dp = std::max(1, plan->mesh.dp);
  *loss = sum_loss / (dp * num_mb * shards);
  *aux = sum_aux / dp;
  return ok_status();
}

}  // namespace piper::runtime
