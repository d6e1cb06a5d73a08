// The executor's pipeline handler: send / recv of one hidden state (or its gradient) between pipeline ranks, and
// af-pipe's dense m2n edges, which are the same message with the same-dp peer. See executor_handlers.h.
#include "piper/base/fault.h"
#include "piper/runtime/exec/executor_handlers.h"

namespace piper::runtime::detail {

using compile::Instruction;
using compile::OpKind;

Status PipelineP2p::resolve(const Instruction& in, Task* t) {
  DistContext* dist = core_.dist;
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
    const Instruction& chunk = core_.instr_of(id);
    // A chunk, an expert combine whose output crosses to the next stage (executor_ep.cc; with ep = 1 and etp > 1
    // the experts' etp reduce-scatter, which combines in place, and the receive feeds the etp all-gather of the
    // output gradients: executor_ep_etp.cc), or a tensor-parallel exchange at a stage boundary (its reduce-scatter
    // feeds the send, the receive feeds its all-gather: the message is then the sequence slice, executor_tp.cc).
    if (chunk.comm != ir::NodeKind::kChunk && chunk.comm != ir::NodeKind::kAllToAll && !is_tp_exchange(chunk) &&
        !is_etp_exchange(chunk)) {
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

Status PipelineP2p::run(const Task& t) { return t.in->op == OpKind::kSend ? send(t) : recv(t); }

Status PipelineP2p::send(const Task& t) {
  const Instruction& in = *t.in;
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Tensor> tensor, core_.take_hidden(t, "ranks"));
  if (tensor == nullptr) return internal_error("'" + in.label + "': the message has no hidden tensor");
  comm::Communicator& c = core_.dist->p2p();
  PIPER_ASSIGN_OR_RETURN(
      comm::Handle h, c.isend(tensor->data(), static_cast<size_t>(tensor->nbytes()), t.peer, static_cast<int>(in.tag)));
  fault_point("pp_send");
  return core_.wait_comm(c, h, tensor, "send to rank " + std::to_string(t.peer));
}

Status PipelineP2p::recv(const Task& t) {
  const Instruction& in = *t.in;
  // Under sequence parallelism every hidden state between chunks of different stages is this rank's slice.
  const int64_t tokens = core_.mbs * core_.batch->seq_len / core_.tp->token_shards();
  const int64_t hidden = core_.model->dims().hidden;
  PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({tokens, hidden}, MemCategory::kBuffers, core_.allocator));
  auto tensor = std::make_shared<Tensor>(std::move(buf));
  comm::Communicator& c = core_.dist->p2p();
  PIPER_ASSIGN_OR_RETURN(
      comm::Handle h, c.irecv(tensor->data(), static_cast<size_t>(tensor->nbytes()), t.peer, static_cast<int>(in.tag)));
  PIPER_RETURN_IF_ERROR(core_.wait_comm(c, h, tensor, "receive from rank " + std::to_string(t.peer)));
  core_.publish_hidden(t, std::move(tensor));
  return ok_status();
}

}  // namespace piper::runtime::detail
