// Tensor parallelism in the executor (docs/runtime.md): the shard pass's collectives over `tp` move hidden
// states between the split chunks (chunks/tp_slice.h) and the rest of the model, and the gradients that are
// partial on each tensor rank are summed over tp before the optimizer step.
//
// Message sizes ([n, h] with n = mbs * seq tokens of a microbatch, T = tp):
//   all_gather      (tp_ag, sequence parallel)  [n/T, h] slice -> [n, h]   (the input of a split chunk, F and B)
//   reduce_scatter  (tp_rs, sequence parallel)  [n, h] partial -> [n/T, h] slice of the sum (its output)
//   all_reduce      (tp_ar, without sp)         [n, h] partial -> [n, h] sum
// The slices are contiguous token rows: tensor rank r holds rows [r*n/T, (r+1)*n/T) of the microbatch, and
// under sequence parallelism every chunk that is not split (embed, router, experts, head) runs on those rows.
#include <algorithm>
#include <type_traits>

#include "piper/kernels/cpu/optimizer.h"
#include "piper/runtime/chunks/tp_slice.h"
#include "piper/runtime/executor_impl.h"

namespace piper::runtime {

using compile::Instruction;
using compile::OpKind;
using detail::Task;

bool detail::is_tp_exchange(const Instruction& in) {
  using compile::CommRole;
  return in.role == CommRole::kTpGather || in.role == CommRole::kTpScatter || in.role == CommRole::kTpReduce;
}

Status Executor::Impl::init_tp(const compile::Program& program) {
  tp.size = plan->mesh.tp;
  tp.rank = dist->coord().tp;
  comm::Communicator* group = dist->group("tp");
  if (group == nullptr || group->size() != tp.size) {
    return internal_error("executor: the plan has tp=" + std::to_string(tp.size) + " but this rank has no such group");
  }
  for (const compile::Stream& stream : program.streams) {
    for (const Instruction& in : stream.instrs) {
      if (in.node == ir::kNoNode) continue;
      if (detail::is_tp_exchange(in) && in.comm != ir::NodeKind::kAllReduce) tp.sequence_parallel = true;
      if (in.op != OpKind::kCompute || in.shard_axis != "tp") continue;
      Chunk* c = model->find(in.layer, in.part);
      if (c != nullptr) tp.sliced.insert(c);
    }
  }
  // Every rank of the tp group creates its executor in the same order, so dup() is matched.
  PIPER_ASSIGN_OR_RETURN(tp.sync, group->dup("tp_sync"));
  return ok_status();
}

Status Executor::Impl::resolve_tp(const Instruction& in, Task* t) {
  t->comm = dist->group("tp");
  if (t->comm == nullptr || tp.size <= 1) {
    return internal_error("executor: '" + in.label + "' runs over tp, which has degree 1 on this plan");
  }
  t->degree = t->comm->size();
  t->gradient = in.pass != ir::Pass::kF;
  if (in.inputs.size() != 1) {
    return internal_error("executor: '" + in.label + "' has " + std::to_string(in.inputs.size()) +
                          " inputs, expected 1");
  }
  t->source = in.inputs[0];
  t->consumers = static_cast<int>(in.outputs.size());
  return ok_status();
}

Status Executor::Impl::tp_exchange(const Task& t) {
  const Instruction& in = *t.in;
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Tensor> x, take_hidden(t, "tensor ranks"));
  const int64_t h = model->dims().hidden, T = t.degree;
  if (x == nullptr || x->numel() % h != 0) return internal_error("'" + in.label + "': the message is not [n, hidden]");
  const int64_t rows = x->numel() / h;
  const MemCategory cat = t.gradient ? MemCategory::kBuffers : MemCategory::kActivations;
  std::shared_ptr<Tensor> out;
  comm::Handle handle;
  std::string what;
  if (in.comm == ir::NodeKind::kAllGather) {
    PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({rows * T, h}, cat, allocator));
    out = std::make_shared<Tensor>(std::move(buf));
    PIPER_ASSIGN_OR_RETURN(handle, t.comm->all_gather(x->data(), out->data(), static_cast<size_t>(x->nbytes())));
    what = "sequence all-gather";
  } else if (in.comm == ir::NodeKind::kReduceScatter) {
    if (rows % T != 0) {
      return invalid_argument("'" + in.label + "': " + std::to_string(rows) + " tokens do not split over tp=" +
                              std::to_string(T) + "; make mbs * seq a multiple of tp");
    }
    PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({rows / T, h}, cat, allocator));
    out = std::make_shared<Tensor>(std::move(buf));
    PIPER_ASSIGN_OR_RETURN(handle,
                           t.comm->reduce_scatter_sum(x->data(), out->data(), static_cast<size_t>(out->numel())));
    what = "sequence reduce-scatter";
  } else {
    PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({rows, h}, cat, allocator));
    out = std::make_shared<Tensor>(std::move(buf));
    PIPER_ASSIGN_OR_RETURN(handle, t.comm->all_reduce_sum(x->data(), out->data(), static_cast<size_t>(x->numel())));
    what = "all-reduce";
  }
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(x), decltype(out)>>(x, out);
  PIPER_RETURN_IF_ERROR(wait_comm(*t.comm, handle, keep, "tensor-parallel " + what + " '" + in.label + "'"));
  publish_hidden(t, std::move(out));
  return ok_status();
}

Status Executor::Impl::tp_context(const Task& t, StepContext* ctx, Microbatch* mb) {
  if (!tp.sequence_parallel || tp.sliced.count(t.chunk)) return ok_status();
  const int64_t n = mbs * batch->seq_len;
  if (n % tp.size != 0) {
    return invalid_argument("'" + t.in->label + "': sequence parallelism splits a microbatch's " + std::to_string(n) +
                            " tokens (mbs * seq) over tp=" + std::to_string(tp.size) +
                            "; make mbs * seq a multiple of tp");
  }
  ctx->token_shards = tp.size;
  ctx->sum_over_shards = [this](double* values, int64_t count) -> Status {
    auto buf = std::make_shared<std::vector<double>>(values, values + count);
    auto all = std::make_shared<std::vector<double>>(static_cast<size_t>(count * tp.size));
    PIPER_ASSIGN_OR_RETURN(comm::Handle h,
                           tp.sync->all_gather(buf->data(), all->data(), static_cast<size_t>(count) * sizeof(double)));
    std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(buf), decltype(all)>>(buf, all);
    PIPER_RETURN_IF_ERROR(wait_comm(*tp.sync, h, keep, "router statistics exchange over tp"));
    for (int64_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int r = 0; r < tp.size; ++r) sum += (*all)[static_cast<size_t>(r * count + i)];  // rank order
      values[i] = sum;
    }
    return ok_status();
  };
  if (mb != nullptr) {
    const int64_t part = n / tp.size, offset = part * tp.rank;
    *mb = Microbatch{mb->inputs + offset, mb->targets + offset, 1, part};
  }
  return ok_status();
}

std::vector<std::pair<float*, int64_t>> Executor::Impl::grad_pieces(Chunk& chunk,
                                                                    const std::function<bool(const Param&)>& select) {
  std::vector<std::pair<float*, int64_t>> out;
  auto it = shards.find(&chunk);
  const Shard* sh = it == shards.end() ? nullptr : &it->second;
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

Status Executor::Impl::tp_sync_grads() {
  // Partial on each tensor rank: the replicated tensors of split chunks (their input gradient is split over
  // heads / units), and under sequence parallelism every tensor of the other chunks (each saw a token slice).
  // Summing over tp commutes with the mean over dp, so under ZeRO the sum runs on the reduced shard.
  std::vector<std::pair<float*, int64_t>> partial;
  for (const auto& c : model->chunks()) {
    const bool split = tp.sliced.count(c.get()) > 0;
    if (!split && !tp.sequence_parallel) continue;
    auto shard = shards.find(c.get());
    if (shard != shards.end() && shard->second.over_tp) continue;  // summed by its reduce-scatter over edp_tp
    for (const auto& piece : grad_pieces(*c, [&](const Param& p) { return !(split && tp_param_split(p)); })) {
      partial.push_back(piece);
    }
  }
  size_t total = 0;
  for (const auto& [ptr, n] : partial) total += static_cast<size_t>(n);
  if (total == 0) return ok_status();
  auto buf = std::make_shared<std::vector<float>>(total);
  size_t at = 0;
  for (const auto& [ptr, n] : partial) {
    std::copy(ptr, ptr + n, buf->data() + at);
    at += static_cast<size_t>(n);
  }
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, tp.sync->all_reduce_sum(buf->data(), buf->data(), total));
  PIPER_RETURN_IF_ERROR(wait_comm(*tp.sync, h, buf, "gradient sum over tp of the replicated parameters"));
  at = 0;
  for (const auto& [ptr, n] : partial) {
    std::copy(buf->data() + at, buf->data() + at + n, ptr);
    at += static_cast<size_t>(n);
  }
  return ok_status();
}

double Executor::Impl::tp_grad_sq(const Chunk& chunk) {
  std::vector<std::pair<const float*, int64_t>> grads;
  for (const auto& [ptr, n] :
       grad_pieces(const_cast<Chunk&>(chunk), [&](const Param& p) { return tp_param_split(p) || tp.rank == 0; })) {
    grads.emplace_back(ptr, n);
  }
  const double norm = kernels::grad_global_norm(grads);
  return norm * norm;
}

}  // namespace piper::runtime
