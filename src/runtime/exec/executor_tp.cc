// Tensor parallelism in the executor (docs/runtime.md): the shard pass's collectives over `tp` move hidden
// states between the split chunks (model/chunks/tp_slice.h) and the rest of the model, and the gradients that are
// partial on each tensor rank are summed over tp where the plan says (CommRole::kTpGradSum, one all-reduce per chunk
// and step before its update: ir::add_tp_grad_sums).
//
// Message sizes ([n, h] with n = mbs * seq tokens of a microbatch, T = tp):
//   all_gather      (tp_ag, sequence parallel)  [n/T, h] slice -> [n, h]   (the input of a split chunk, F and B)
//   reduce_scatter  (tp_rs, sequence parallel)  [n, h] partial -> [n/T, h] slice of the sum (its output)
//   all_reduce      (tp_ar, without sp)         [n, h] partial -> [n, h] sum
// The slices are contiguous token rows: tensor rank r holds rows [r*n/T, (r+1)*n/T) of the microbatch, and
// under sequence parallelism every chunk that is not split (router, experts; embed and head when the plan keeps
// them whole) runs on those rows. A head split over tp (vocabulary parallel) exchanges 3 floats per token of its
// microbatch with the other tensor ranks (all-gather [n, 3] -> [T, n, 3], StepContext::gather_over_vocab).
#include <algorithm>
#include <type_traits>

#include "piper/kernels/cpu/optimizer.h"
#include "piper/runtime/exec/executor_handlers.h"
#include "piper/runtime/model/chunks/tp_slice.h"

namespace piper::runtime::detail {

using compile::Instruction;
using compile::OpKind;

bool is_tp_exchange(const Instruction& in) {
  using compile::CommRole;
  return in.role == CommRole::kTpGather || in.role == CommRole::kTpScatter || in.role == CommRole::kTpReduce;
}

Status TensorParallel::init(const compile::Program& program) {
  size_ = core_.plan->mesh.tp;
  rank_ = core_.dist->coord().tp;
  comm::Communicator* group = core_.dist->group("tp");
  if (group == nullptr || group->size() != size_) {
    return internal_error("executor: the plan has tp=" + std::to_string(size_) + " but this rank has no such group");
  }
  // Sequence parallelism is the plan's, not this program's: an af-pipe FFN rank that holds experts only has no tp
  // exchange of its own, yet it serves the token slices of its tp coordinate (Plan::m2n_peers).
  sequence_parallel_ = core_.plan->sequence_parallel;
  for (const compile::Stream& stream : program.streams) {
    for (const Instruction& in : stream.instrs) {
      if (in.node == ir::kNoNode) continue;
      if (in.op != OpKind::kCompute || in.shard_axis != "tp") continue;
      Chunk* c = core_.model->find(in.layer, in.part);
      if (c != nullptr) sliced_.insert(c);
    }
  }
  for (const compile::Program& prog : core_.plan->templates) {
    for (const compile::Stream& stream : prog.streams) {
      for (const Instruction& in : stream.instrs) {
        head_split_ |= in.op == OpKind::kCompute && in.part == Part::kHead && in.shard_axis == "tp";
      }
    }
  }
  // Every rank of the tp group creates its executor in the same order, so dup() is matched.
  PIPER_ASSIGN_OR_RETURN(sync_, group->dup("tp_sync"));
  PIPER_ASSIGN_OR_RETURN(vocab_, group->dup("tp_vocab"));
  PIPER_ASSIGN_OR_RETURN(grads_, group->dup("tp_grad"));
  return ok_status();
}

Status TensorParallel::resolve(const Instruction& in, Task* t) {
  if (in.role == compile::CommRole::kTpGradSum) return resolve_grad_sum(in, t);
  t->comm = core_.dist->group("tp");
  if (t->comm == nullptr || size_ <= 1) {
    return internal_error("executor: '" + in.label + "' runs over tp, which has degree 1 on this plan");
  }
  if (in.segment != compile::Segment::kWhole) return resolve_collective_piece(in, t);
  t->degree = t->comm->size();
  t->gradient = in.pass != ir::Pass::kF;
  if (in.inputs.empty() || (in.inputs.size() > 1 && in.comm != ir::NodeKind::kAllGather)) {
    return internal_error("executor: '" + in.label + "' has " + std::to_string(in.inputs.size()) +
                          " inputs, expected 1 (an all-gather: 1 or more, summed)");
  }
  t->source = in.inputs[0];
  if (in.inputs.size() > 1) t->sources = in.inputs;
  t->consumers = static_cast<int>(in.outputs.size());
  // af-pipe with a vocabulary-parallel head on an FFN rank: the head's all-gather reads the experts' output rows,
  // which the FFN group combines first (as before a head that is not split, M2n::local_inputs), on this stream.
  // (Elsewhere an all-gather after the experts' F reads their combined hidden state: ep = etp = 1.)
  const auto src = core_.by_node.find(t->source);
  if (!t->gradient && in.comm == ir::NodeKind::kAllGather && in.inputs.size() == 1 && src != core_.by_node.end() &&
      src->second->op == OpKind::kCompute && src->second->part == Part::kExperts) {
    PIPER_ASSIGN_OR_RETURN(combines_[in.node], core_.m2n->combine_comm_off_compute());
  }
  return ok_status();
}

// The hidden state a collective reduces or gathers: its producers' message(s), or the combined expert rows.
Result<std::shared_ptr<const Tensor>> TensorParallel::take_input(const Task& t) {
  const auto combine = combines_.find(t.in->node);
  if (combine == combines_.end()) return core_.take_hidden(t, "tensor ranks");
  PIPER_ASSIGN_OR_RETURN(Activation a, core_.take_message<Activation>(t, t.source));
  if (a.hidden) return a.hidden;
  return core_.m2n->combine_local(t, t.source, std::max(0, t.in->mb), a, combine->second);
}

Status TensorParallel::run(const Task& t) {
  const Instruction& in = *t.in;
  if (in.role == compile::CommRole::kTpGradSum) return grad_sum(t);
  if (in.segment != compile::Segment::kWhole) {  // tp_overlap (executor_tp_overlap.cc)
    return in.comm == ir::NodeKind::kAllGather ? gather_piece(t) : scatter_piece(t);
  }
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Tensor> x, take_input(t));
  const int64_t h = core_.model->dims().hidden, T = t.degree;
  if (x == nullptr || x->numel() % h != 0) return internal_error("'" + in.label + "': the message is not [n, hidden]");
  const int64_t rows = x->numel() / h;
  const MemCategory cat = t.gradient ? MemCategory::kBuffers : MemCategory::kActivations;
  std::shared_ptr<Tensor> out;
  comm::Handle handle;
  std::string what;
  if (in.comm == ir::NodeKind::kAllGather) {
    PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({rows * T, h}, cat, core_.allocator));
    out = std::make_shared<Tensor>(std::move(buf));
    PIPER_ASSIGN_OR_RETURN(handle, t.comm->all_gather(x->data(), out->data(), static_cast<size_t>(x->nbytes())));
    what = "sequence all-gather";
  } else if (in.comm == ir::NodeKind::kReduceScatter) {
    if (rows % T != 0) {
      return invalid_argument("'" + in.label + "': " + std::to_string(rows) + " tokens do not split over tp=" +
                              std::to_string(T) + "; make mbs * seq a multiple of tp");
    }
    PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({rows / T, h}, cat, core_.allocator));
    out = std::make_shared<Tensor>(std::move(buf));
    PIPER_ASSIGN_OR_RETURN(handle,
                           t.comm->reduce_scatter_sum(x->data(), out->data(), static_cast<size_t>(out->numel())));
    what = "sequence reduce-scatter";
  } else {
    PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({rows, h}, cat, core_.allocator));
    out = std::make_shared<Tensor>(std::move(buf));
    PIPER_ASSIGN_OR_RETURN(handle, t.comm->all_reduce_sum(x->data(), out->data(), static_cast<size_t>(x->numel())));
    what = "all-reduce";
  }
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(x), decltype(out)>>(x, out);
  PIPER_RETURN_IF_ERROR(core_.wait_comm(*t.comm, handle, keep, "tensor-parallel " + what + " '" + in.label + "'"));
  core_.publish_hidden(t, std::move(out));
  return ok_status();
}

// Every tensor rank's `count` values of `mine`, in rank order, over `c` (a small exchange beside the plan's).
template <typename T>
Result<std::vector<T>> TensorParallel::gather_small(comm::Communicator& c, const T* mine, int64_t count,
                                                    const std::string& what) {
  // Own buffers: a gather abandoned by a failed step must not write into the caller's.
  auto buf = std::make_shared<std::vector<T>>(mine, mine + count);
  auto all = std::make_shared<std::vector<T>>(static_cast<size_t>(count * size_));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h,
                         c.all_gather(buf->data(), all->data(), static_cast<size_t>(count) * sizeof(T)));
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(buf), decltype(all)>>(buf, all);
  PIPER_RETURN_IF_ERROR(core_.wait_comm(c, h, keep, what));
  return *all;
}

Status TensorParallel::gather_over_vocab(const float* mine, float* all, int64_t count) {
  PIPER_ASSIGN_OR_RETURN(std::vector<float> out,
                         gather_small(*vocab_, mine, count, "cross-entropy statistics exchange over tp (split head)"));
  std::copy(out.begin(), out.end(), all);
  return ok_status();
}

Status TensorParallel::context(const Task& t, StepContext* ctx, Microbatch* mb) {
  if (sliced_.count(t.chunk) && t.chunk->part() == Part::kHead) {
    ctx->gather_over_vocab = [this](const float* mine, float* all, int64_t count) {
      return gather_over_vocab(mine, all, count);
    };
  }
  if (!sequence_parallel_ || sliced_.count(t.chunk)) return ok_status();
  const int64_t n = core_.mbs * core_.batch->seq_len;
  if (n % size_ != 0) {
    return invalid_argument("'" + t.in->label + "': sequence parallelism splits a microbatch's " + std::to_string(n) +
                            " tokens (mbs * seq) over tp=" + std::to_string(size_) +
                            "; make mbs * seq a multiple of tp");
  }
  ctx->token_shards = size_;
  ctx->sum_over_shards = [this](double* values, int64_t count) -> Status {
    PIPER_ASSIGN_OR_RETURN(std::vector<double> all,
                           gather_small(*sync_, values, count, "router statistics exchange over tp"));
    for (int64_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int r = 0; r < size_; ++r) sum += all[static_cast<size_t>(r * count + i)];  // rank order
      values[i] = sum;
    }
    return ok_status();
  };
  if (mb != nullptr) {
    const int64_t part = n / size_, offset = part * rank_;
    *mb = Microbatch{mb->inputs + offset, mb->targets + offset, 1, part};
  }
  return ok_status();
}

Status TensorParallel::resolve_grad_sum(const Instruction& in, Task* t) {
  t->comm = grads_.get();
  if (t->comm == nullptr || size_ <= 1) {
    return internal_error("executor: '" + in.label + "' sums gradients over tp, which has degree 1 on this plan");
  }
  t->degree = t->comm->size();
  t->chunk = core_.model->find(in.layer, in.part);
  if (t->chunk == nullptr) {
    return invalid_argument("executor: '" + in.label + "' sums the gradients of (layer " + std::to_string(in.layer) +
                            ", " + in.part_name() + ") over tp, which this rank does not hold");
  }
  if (!partial_over_tp(*t->chunk)) {
    return invalid_argument("executor: '" + in.label + "' sums the gradients of " + t->chunk->name() +
                            " over tp, but they are whole on every tensor rank (not split over tp, no sequence " +
                            "parallelism, or experts reduced over edp); emit the plan again with this piper");
  }
  if (!grad_sums_.insert(t->chunk).second) {
    return invalid_argument("executor: '" + in.label + "' is a second gradient sum over tp of " + t->chunk->name() +
                            "; the plan sums each chunk once per step");
  }
  return ok_status();
}

Status TensorParallel::setup() {
  if (size_ <= 1) return ok_status();
  for (const auto& c : core_.model->chunks()) {
    if (grad_sums_.count(c.get()) > 0 || !partial_over_tp(*c)) continue;
    return failed_precondition("executor: the plan does not sum over tp the gradients of " + c->name() +
                               " that are partial on each tensor rank (no tp_grad_sum instruction before its " +
                               "update); emit the plan again with this piper");
  }
  return ok_status();
}

bool TensorParallel::grad_sums_complete() {
  std::lock_guard<std::mutex> lock(mu_);
  return grad_sums_done_ == static_cast<int64_t>(grad_sums_.size());
}

bool TensorParallel::partial_over_tp(const Chunk& chunk) const {
  const bool split = sliced_.count(&chunk) > 0;
  if (size_ <= 1 || !core_.plan->grads_partial_over_tp(split, chunk.part())) return false;
  return std::any_of(chunk.params().begin(), chunk.params().end(),
                     [&](const Param& p) { return p.trainable && !(split && tp_param_split(p)); });
}

std::vector<std::pair<float*, int64_t>> TensorParallel::partial_grads(Chunk& chunk) {
  if (!partial_over_tp(chunk)) return {};
  const bool split = sliced_.count(&chunk) > 0;
  return core_.dp->grad_pieces(chunk, [&](const Param& p) { return !(split && tp_param_split(p)); });
}

// Runs after the chunk's data-parallel reduction (the plan's order): the sum over tp commutes with the mean over dp,
// and under ZeRO the shards of one chunk cover the same elements on every tensor rank, so the tensor ranks of one
// data-parallel coordinate sum the same pieces (none when their shard holds no partial tensor).
Status TensorParallel::grad_sum(const Task& t) {
  const std::vector<std::pair<float*, int64_t>> partial = partial_grads(*t.chunk);
  size_t total = 0;
  for (const auto& [ptr, n] : partial) total += static_cast<size_t>(n);
  if (total > 0) {
    auto buf = std::make_shared<std::vector<float>>(total);
    size_t at = 0;
    for (const auto& [ptr, n] : partial) {
      std::copy(ptr, ptr + n, buf->data() + at);
      at += static_cast<size_t>(n);
    }
    PIPER_ASSIGN_OR_RETURN(comm::Handle h, t.comm->all_reduce_sum(buf->data(), buf->data(), total));
    PIPER_RETURN_IF_ERROR(core_.wait_comm(*t.comm, h, buf, "gradient sum over tp of " + t.chunk->name()));
    at = 0;
    for (const auto& [ptr, n] : partial) {
      std::copy(buf->data() + at, buf->data() + at + n, ptr);
      at += static_cast<size_t>(n);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++grad_sums_done_;
  }
  core_.notify();
  return ok_status();
}

std::optional<double> TensorParallel::grad_sq(const Chunk& chunk) {
  if (!sliced_.count(&chunk)) return std::nullopt;
  // Each tensor rank owns its slice; under ZeRO each data-parallel rank its shard of it, else dp rank 0.
  if (core_.dp->shard(chunk) == nullptr && core_.dist->coord().dp != 0) return 0.0;
  std::vector<std::pair<const float*, int64_t>> grads;
  for (const auto& [ptr, n] : core_.dp->grad_pieces(const_cast<Chunk&>(chunk),
                                                    [&](const Param& p) { return tp_param_split(p) || rank_ == 0; })) {
    grads.emplace_back(ptr, n);
  }
  const double norm = kernels::grad_global_norm(grads);
  return norm * norm;
}

}  // namespace piper::runtime::detail
