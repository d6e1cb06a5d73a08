// The executor's communication instructions (multi-rank programs); see executor.h and docs/runtime.md.
#include <chrono>
#include <algorithm>
#include <cmath>
#include <thread>
#include <type_traits>

#include "piper/runtime/executor_impl.h"

namespace piper::runtime {

using compile::Instruction;
using compile::OpKind;
using detail::Task;

Status Executor::Impl::resolve_comm(const Instruction& in, Task* t) {
  if (in.node == ir::kNoNode) return internal_error("executor: '" + in.label + "' names no graph node");
  const ir::Node& n = graph->node(in.node);
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
    for (int e : sending ? graph->in_edges(n.id) : graph->out_edges(n.id)) {
      const ir::Edge& ed = graph->edge(e);
      if (!ed.alive || ed.kind != ir::EdgeKind::kData) continue;
      const ir::Node& chunk = graph->node(sending ? ed.src : ed.dst);
      // A chunk, an expert combine whose output crosses to the next stage (executor_ep.cc), or a tensor-parallel
      // exchange at a stage boundary (its reduce-scatter feeds the send, the receive feeds its all-gather: the
      // message is then the sequence slice, executor_tp.cc).
      if (chunk.kind != ir::NodeKind::kChunk && chunk.kind != ir::NodeKind::kAllToAll &&
          !detail::is_tp_exchange(chunk)) {
        return internal_error("executor: '" + in.label + "' is linked to non-chunk node '" + chunk.name + "'");
      }
      t->gradient = chunk.tags.pass != ir::Pass::kF;
      if (sending) t->source = chunk.id;
      ++count;
    }
    if (sending && count != 1) {
      return internal_error("executor: '" + in.label + "' has " + std::to_string(count) + " producers, expected 1");
    }
    if (!sending) t->consumers = count;
    return ok_status();
  }
  if (detail::is_tp_exchange(n)) return resolve_tp(in, t);
  // Collective: gradient all-reduce (zero=0), gradient reduce-scatter once per step (zero=1) or per microbatch
  // (zero=2), and the all-gather of the updated parameters (zero=1, 2).
  if (in.comm == ir::NodeKind::kAllToAll) return resolve_ep(in, t);  // executor_ep.cc
  const bool zero1_rs = in.comm == ir::NodeKind::kReduceScatter && n.tags.mb < 0;
  const bool zero2_rs = in.comm == ir::NodeKind::kReduceScatter && n.tags.mb >= 0;
  const bool zero1_ag = in.comm == ir::NodeKind::kAllGather && n.tags.pass == ir::Pass::kU;
  if (in.comm != ir::NodeKind::kAllReduce && !zero1_rs && !zero2_rs && !zero1_ag) {
    return unimplemented("executor: '" + in.label + "' (" + ir::to_string(in.comm) + " over " + in.group +
                         ") is not executed yet: the runtime runs pipeline parallelism and data parallelism with " +
                         "zero=0, 1 or 2 and expert parallelism; drop zero=3/tp from the strategy (docs/runtime.md)");
  }
  t->comm = dist->group(in.group);
  if (t->comm == nullptr) {
    return internal_error("executor: '" + in.label + "' runs over mesh axis '" + in.group +
                          "', which has degree 1 on this plan");
  }
  t->degree = t->comm->size();
  t->chunk = model->find(n.tags.layer, n.tags.part);
  if (t->chunk == nullptr) {
    return invalid_argument("executor: '" + in.label + "' reduces the gradients of (layer " +
                            std::to_string(n.tags.layer) + ", " + n.tags.part + "), which this rank does not hold");
  }
  if (zero1_ag) return ok_status();  // the update before it is sharded; nothing to count
  if (zero1_rs || zero2_rs) {
    int64_t total = 0;
    for (const Param& p : t->chunk->params()) total += p.trainable ? p.grad.numel() : 0;
    Shard sh;
    sh.per_rank = (total + t->degree - 1) / t->degree;
    sh.begin = std::min(total, sh.per_rank * t->comm->rank());
    sh.end = std::min(total, sh.begin + sh.per_rank);
    sh.per_microbatch = zero2_rs;
    sh.count = shards.count(t->chunk) ? shards[t->chunk].count + 1 : 1;
    shards[t->chunk] = sh;
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

Status Executor::Impl::wait_comm(comm::Communicator& c, comm::Handle& h, std::shared_ptr<const void> keep,
                                 const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    PIPER_ASSIGN_OR_RETURN(bool done, c.test(h));
    if (done) return ok_status();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (stop || waited > dist->timeout_s()) {
      Status st = ok_status();
      if (stop) {
        st = unavailable(what + ": abandoned, another stream of this rank failed");
      } else {
        st = c.wait(h, 1e-3);
        if (!st.ok()) {
          st = deadline_exceeded(what + " on rank " + std::to_string(dist->rank()) + " made no progress for " +
                                 std::to_string(static_cast<int>(waited)) + " s (PIPER_COMM_TIMEOUT_S): " +
                                 st.message());
        }
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
  std::shared_ptr<const Tensor> tensor;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto take = [&](auto& map) -> Status {
      auto it = map.find(t.source);
      if (it == map.end()) {
        return internal_error("'" + in.label + "': the output of '" + graph->node(t.source).name +
                              "' is not available: the plan sends it before it is computed");
      }
      auto msg = it->second.msg;
      if (--it->second.remaining == 0) map.erase(it);
      if constexpr (std::is_same_v<decltype(msg), Activation>) {
        if (msg.routed) return unimplemented("'" + in.label + "': a router -> experts edge crosses ranks");
        tensor = msg.hidden;
      } else {
        if (msg.dnormed || msg.dtopk_w) return unimplemented("'" + in.label + "': an experts -> router edge crosses ranks");
        tensor = msg.dhidden;
      }
      return ok_status();
    };
    PIPER_RETURN_IF_ERROR(t.gradient ? take(bwd) : take(fwd));
  }
  if (tensor == nullptr) return internal_error("'" + in.label + "': the message has no hidden tensor");
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, dist->p2p().isend(tensor->data(), static_cast<size_t>(tensor->nbytes()),
                                                           t.peer, static_cast<int>(in.tag)));
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
  std::lock_guard<std::mutex> lock(mu);
  if (t.gradient) {
    Gradient g;
    g.dhidden = tensor;
    bwd[in.node] = detail::Pending<Gradient>{std::move(g), t.consumers};
  } else {
    Activation a;
    a.hidden = tensor;
    fwd[in.node] = detail::Pending<Activation>{std::move(a), t.consumers};
  }
  return ok_status();
}

Status Executor::Impl::collective(const Task& t) {
  if (t.in->comm == ir::NodeKind::kAllToAll) return ep_exchange(t);
  if (detail::is_tp_exchange(graph->node(t.in->node))) return tp_exchange(t);
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
  const Shard& sh = shards.at(t.chunk);
  const size_t per_rank = static_cast<size_t>(sh.per_rank);
  auto in = pack(*t.chunk, per_rank * static_cast<size_t>(t.degree), [](Param& p) -> const Tensor& { return p.grad; });
  if (sh.per_microbatch) {
    // ZeRO-2: this microbatch's gradient leaves the full buffer, which starts again from zero; the chunk's next
    // weight-gradient task waits for this (executor.cc), so no contribution is counted twice or lost.
    for (Param& p : t.chunk->params()) {
      if (p.trainable) p.grad.fill(0.0f);
    }
    std::lock_guard<std::mutex> lock(mu);
    ++packs_done[t.chunk];
    cv.notify_all();
  }
  auto out = std::make_shared<std::vector<float>>(per_rank);
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, t.comm->reduce_scatter_sum(in->data(), out->data(), per_rank));
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(in), decltype(out)>>(in, out);
  PIPER_RETURN_IF_ERROR(wait_comm(*t.comm, h, keep, "gradient reduce-scatter of " + t.chunk->name()));
  const float scale = 1.0f / static_cast<float>(t.degree);
  if (sh.per_microbatch) {
    // Gradients accumulate sharded: only the last microbatch's reduction writes the shard into the gradient.
    std::vector<float>& acc = shard_acc[t.chunk];
    if (acc.empty()) acc.assign(per_rank, 0.0f);
    for (size_t i = 0; i < per_rank; ++i) acc[i] += (*out)[i] * scale;
    if (++shard_reductions[t.chunk] < sh.count) {
      std::lock_guard<std::mutex> lock(mu);
      ++reductions_done;
      cv.notify_all();
      return ok_status();
    }
    std::copy(acc.begin(), acc.end(), out->begin());
  }
  // This rank's shard of the mean gradient; the rest of the chunk's gradient is not used by its update or norm.
  const float out_scale = sh.per_microbatch ? 1.0f : scale;
  int64_t offset = 0;
  for (Param& p : t.chunk->params()) {
    if (!p.trainable) continue;
    const int64_t lo = std::max(sh.begin, offset), hi = std::min(sh.end, offset + p.grad.numel());
    for (int64_t i = lo; i < hi; ++i) {
      p.grad.data()[i - offset] = (*out)[static_cast<size_t>(i - sh.begin)] * out_scale;
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
  const Shard& sh = it->second;
  const size_t per_rank = static_cast<size_t>(sh.per_rank);
  auto full = pack(*t.chunk, per_rank * static_cast<size_t>(t.degree), [](Param& p) -> const Tensor& { return p.value; });
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
      if (dist->coord().dp == 0) local += tp_grad_sq(*c);  // split chunk: each tensor rank owns its slice
    } else if (shard != shards.end()) {
      // ZeRO: every data-parallel rank owns its shard of the reduced gradient.
      if (dist->coord().tp == 0) local += Optimizer::grad_sq_range(*c, shard->second.begin, shard->second.end);
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
  const double dp = std::max(1, graph->mesh.dp);
  *loss = sum_loss / (dp * num_mb * shards);
  *aux = sum_aux / dp;
  return ok_status();
}

}  // namespace piper::runtime
