// tp_overlap in the executor (docs/runtime.md, "tp_overlap"): a tensor-parallel chunk (attn, mlp, shared) whose
// input arrives through a tp all-gather and whose output leaves through a tp reduce-scatter runs as the pieces the
// compiler emits (compile/lower.h, LowerOptions::tp_overlap), each doing only its share (T = tp, r = tensor rank,
// P = the reduce-scatter's pieces, n = the microbatch's tokens, shard q = rows [q*m, (q+1)*m), m = n/T):
//
//   all-gather piece i   (i < T-1, tp stream)  one ring step: sends the rows of shard (r-i) mod T to rank r+1 and
//                                              receives those of shard (r-i-1) mod T from rank r-1
//   kIn piece j          (j < T, compute)      the first GEMM (with the norm) of shard (r-j) mod T: piece 0 on this
//                                              rank's own rows, piece j after ring step j-1 (the plan's event)
//   kRest                                      what needs every row (attention core, SwiGLU gate)
//   kOut piece j         (j < P)               the last GEMM (+ residual) of block j of every shard
//   reduce-scatter piece j (tp stream)         reduce-scatters exactly those rows: rank r keeps block j of shard r
//
// Block j of a shard is its rows [m*j/P, m*(j+1)/P): uneven when P does not divide m, empty when m < P (then the
// piece moves nothing, on every rank alike), and the pieces leave rank r with its contiguous shard, as the whole
// reduce-scatter does. B runs the same on the gradients (all-gather of dout, reduce-scatter of dx); its weight
// gradients are computed whole, by the last piece (BW) or by the W task (zb-h1), from what the pieces stashed.
// The chunk's pieces share a SplitNode with its collective's pieces (TensorParallel::mu_); the plan's events
// order the rows each side writes before the other reads them.
#include <algorithm>

#include "piper/runtime/exec/executor_handlers.h"

namespace piper::runtime::detail {

using compile::Instruction;
using compile::Segment;

// One split chunk node in this step.
struct SplitNode {
  std::shared_ptr<Tensor> input;      // split input: [n, h], the gathered rows (F: hidden; B: its gradient)
  bool own_rows = false;              // the first ring step put this rank's shard into `input`
  std::shared_ptr<const Tensor> x;    // the chunk's whole input, from the first piece to the last
  std::unique_ptr<Stash> fstash;      // F: the stash, from the first piece to the last (then the core's)
  Stash* stash = nullptr;             // the stash the pieces work on (F: fstash; B: the core's, from F)
  std::shared_ptr<Tensor> output;     // [n, h], the chunk's (partial) output, from kRest on
  std::shared_ptr<Tensor> scattered;  // the reduce-scatter's result [m, h], filled block by block
};

namespace {

int ring(int a, int size) { return ((a % size) + size) % size; }

RowRange shard_rows(int64_t n, int size, int q) {
  const int64_t m = n / size;
  return {q * m, (q + 1) * m};
}

RowRange block_rows(int64_t m, int pieces, int j) { return {m * j / pieces, m * (j + 1) / pieces}; }

MemCategory category(const Task& t) {
  return t.pass == ir::Pass::kF ? MemCategory::kActivations : MemCategory::kBuffers;
}

}  // namespace

TensorParallel::TensorParallel(Core& core) : Handler(core) {}
TensorParallel::~TensorParallel() = default;

void TensorParallel::begin_step() {
  std::lock_guard<std::mutex> lock(mu_);
  splits_.clear();
  grad_sums_done_ = 0;
}

std::shared_ptr<SplitNode> TensorParallel::split_node(ir::NodeId node) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<SplitNode>& s = splits_[node];
  if (s == nullptr) s = std::make_shared<SplitNode>();
  return s;
}

Status TensorParallel::resolve_piece(const Instruction& in, Task* t) {
  if (size_ <= 1) return internal_error("executor: '" + in.label + "' is a tp_overlap piece on a plan with tp=1");
  if (t->chunk->piecewise() == nullptr || sliced_.count(t->chunk) == 0 || t->pass == ir::Pass::kW) {
    return unimplemented("executor: '" + in.label + "' runs " + t->chunk->name() +
                         " in tp_overlap pieces; only attn, mlp and shared split over tp run so (F, B, BW)");
  }
  if (in.segment == Segment::kIn && in.pieces != size_) {
    return internal_error("executor: '" + in.label + "' is one of " + std::to_string(in.pieces) +
                          " input pieces; tp=" + std::to_string(size_) + " needs one per tensor rank");
  }
  const bool split_out = in.segment == Segment::kOut || (in.segment == Segment::kRest && in.split_out);
  if (split_out && t->consumers != 1) {
    return unimplemented("executor: '" + in.label + "' has " + std::to_string(t->consumers) +
                         " consumers; a reduce-scattered tp_overlap output has exactly one, its reduce-scatter");
  }
  return ok_status();
}

Status TensorParallel::resolve_collective_piece(const Instruction& in, Task* t) {
  const bool gather = in.comm == ir::NodeKind::kAllGather;
  if (!gather && in.comm != ir::NodeKind::kReduceScatter) {
    return internal_error("executor: '" + in.label + "' is a tp_overlap piece of a " + ir::to_string(in.comm));
  }
  const std::vector<ir::NodeId>& ends = gather ? in.outputs : in.inputs;
  if (in.inputs.empty() || ends.size() != 1 || core_.instr_of(ends[0]).segment == Segment::kWhole) {
    return internal_error("executor: '" + in.label + "' is a tp_overlap piece without its one split chunk");
  }
  if (gather && in.pieces != size_ - 1) {
    return internal_error("executor: '" + in.label + "' is one of " + std::to_string(in.pieces) +
                          " ring steps; tp=" + std::to_string(size_) + " needs " + std::to_string(size_ - 1));
  }
  if (gather && (in.tag < 0 || in.tag > 32767)) {
    return invalid_argument("executor: '" + in.label + "' is a ring step with tag " + std::to_string(in.tag) +
                            "; the compiler gives each ring a tag in [0, 32767]: compile the plan again");
  }
  t->degree = size_;
  t->gradient = in.pass != ir::Pass::kF;
  t->source = in.inputs[0];
  if (in.inputs.size() > 1) t->sources = in.inputs;  // summed (Core::take_hidden)
  t->consumers = static_cast<int>(in.outputs.size());
  t->split_owner = ends[0];
  t->piece = collective_pieces_[in.node]++;
  t->last_piece = t->piece == in.pieces - 1;
  return ok_status();
}

// Ring step t.piece; the first also takes this rank's shard (the producer's message) into the gathered rows.
Status TensorParallel::gather_piece(const Task& t) {
  const int64_t h = core_.model->dims().hidden;
  std::shared_ptr<SplitNode> s = split_node(t.split_owner);
  if (t.piece == 0) {
    PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Tensor> own, core_.take_hidden(t, "tensor ranks"));
    if (own == nullptr || own->numel() % h != 0) {
      return internal_error("'" + t.in->label + "': the message is not [n, hidden]");
    }
    const int64_t m = own->numel() / h;
    PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({m * size_, h}, category(t), core_.allocator));
    auto input = std::make_shared<Tensor>(std::move(buf));
    std::copy(own->data(), own->data() + m * h, input->data() + rank_ * m * h);
    {
      std::lock_guard<std::mutex> lock(mu_);
      s->input = std::move(input);
      s->own_rows = true;
    }
    core_.notify();
  }
  std::shared_ptr<Tensor> buf;
  {
    std::lock_guard<std::mutex> lock(mu_);
    buf = s->input;
  }
  if (buf == nullptr) return internal_error("'" + t.in->label + "' runs before the first step of its ring");
  const int64_t m = buf->shape()[0] / size_;
  const size_t bytes = static_cast<size_t>(m * h) * sizeof(float);
  const int send_q = ring(rank_ - t.piece, size_), recv_q = ring(rank_ - t.piece - 1, size_);
  const int tag = static_cast<int>(t.in->tag);  // the ring's, from the plan (compile/lower.cc)
  comm::Communicator& c = *t.comm;
  PIPER_ASSIGN_OR_RETURN(comm::Handle rh, c.irecv(buf->data() + recv_q * m * h, bytes, ring(rank_ - 1, size_), tag));
  PIPER_ASSIGN_OR_RETURN(comm::Handle sh, c.isend(buf->data() + send_q * m * h, bytes, ring(rank_ + 1, size_), tag));
  const std::string what = "tp_overlap ring step '" + t.in->label + "'";
  PIPER_RETURN_IF_ERROR(core_.wait_comm(c, sh, buf, what + " (send)"));
  return core_.wait_comm(c, rh, buf, what + " (receive)");
}

// Reduce-scatters block t.piece of every shard of the chunk's partial output; the last piece publishes the shard.
Status TensorParallel::scatter_piece(const Task& t) {
  const Instruction& in = *t.in;
  const int64_t h = core_.model->dims().hidden;
  std::shared_ptr<SplitNode> s = split_node(t.split_owner);
  std::shared_ptr<Tensor> out, scattered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = s->output;
  }
  if (out == nullptr) {
    return internal_error("'" + in.label + "' runs before '" + core_.name_of(t.split_owner) + "' wrote its rows");
  }
  const int64_t n = out->shape()[0];
  if (n % size_ != 0) {
    return invalid_argument("'" + in.label + "': " + std::to_string(n) + " tokens (mbs * seq) do not split over tp=" +
                            std::to_string(size_) + "; make mbs * seq a multiple of tp");
  }
  const int64_t m = n / size_;
  if (t.piece == 0) {
    PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({m, h}, category(t), core_.allocator));
    std::lock_guard<std::mutex> lock(mu_);
    s->scattered = std::make_shared<Tensor>(std::move(buf));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    scattered = s->scattered;
  }
  const RowRange b = block_rows(m, in.pieces, t.piece);
  if (b.size() > 0) {
    PIPER_ASSIGN_OR_RETURN(Tensor packed, Tensor::zeros({size_ * b.size(), h}, MemCategory::kBuffers, core_.allocator));
    auto send = std::make_shared<Tensor>(std::move(packed));
    for (int q = 0; q < size_; ++q) {  // block b of shard q, in rank order: the reduce-scatter's layout
      const float* from = out->data() + (q * m + b.begin) * h;
      std::copy(from, from + b.size() * h, send->data() + q * b.size() * h);
    }
    PIPER_ASSIGN_OR_RETURN(
        comm::Handle handle,
        t.comm->reduce_scatter_sum(send->data(), scattered->data() + b.begin * h, static_cast<size_t>(b.size() * h)));
    std::shared_ptr<const void> keep =
        std::make_shared<std::pair<decltype(send), decltype(scattered)>>(send, scattered);
    PIPER_RETURN_IF_ERROR(core_.wait_comm(*t.comm, handle, keep, "tp_overlap reduce-scatter '" + in.label + "'"));
  }
  if (!t.last_piece) return ok_status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    s->output.reset();
    s->scattered.reset();
  }
  core_.publish_hidden(t, std::move(scattered));
  return ok_status();
}

Status TensorParallel::run_piece(const Task& t, StepContext& ctx) {
  const Instruction& in = *t.in;
  PiecewiseChunk& pc = *t.chunk->piecewise();
  const bool fwd = t.pass == ir::Pass::kF;
  std::shared_ptr<SplitNode> s = split_node(in.node);
  const bool first = (in.segment == Segment::kIn && t.piece == 0) || (in.segment == Segment::kRest && !in.split_in);
  if (first) PIPER_RETURN_IF_ERROR(begin_pieces(t, *s));
  if (s->stash == nullptr) return internal_error("'" + in.label + "' runs before the first piece of its node");
  Stash& st = *s->stash;
  const int64_t n = core_.mbs * core_.batch->seq_len;
  auto rows_in = [&](RowRange r) { fwd ? pc.forward_in(st, r) : pc.backward_in(st, r); };
  auto rows_out = [&](RowRange r) {
    fwd ? pc.forward_out(st, r, s->output.get()) : pc.backward_out(st, r, s->output.get());
  };
  if (in.segment == Segment::kIn) {
    rows_in(shard_rows(n, size_, ring(rank_ - t.piece, size_)));
  } else if (in.segment == Segment::kRest) {
    if (!in.split_in) rows_in({0, n});
    fwd ? pc.forward_rest(st) : pc.backward_rest(st);
    PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros({n, core_.model->dims().hidden}, category(t), core_.allocator));
    {
      std::lock_guard<std::mutex> lock(mu_);
      s->output = std::make_shared<Tensor>(std::move(buf));
    }
    if (!in.split_out) rows_out({0, n});
  } else {
    const int64_t m = n / size_;
    for (int q = 0; q < size_; ++q) {
      const RowRange b = block_rows(m, in.pieces, t.piece);
      rows_out({q * m + b.begin, q * m + b.end});
    }
  }
  return t.last_piece ? finish_pieces(t, *s, ctx) : ok_status();
}

namespace {

// A piece's whole input when the all-gather is not split: its producers' messages (Msg: Activation or Gradient),
// summed in edge order as the whole chunk sums them.
template <typename Msg, typename SumFn>
Result<std::shared_ptr<const Tensor>> sum_messages(Core& core, const Task& t, int64_t n, int64_t h, SumFn sum) {
  std::vector<Msg> msgs;
  for (ir::NodeId src : t.sources) {
    PIPER_ASSIGN_OR_RETURN(Msg m, core.take_message<Msg>(t, src));
    msgs.push_back(std::move(m));
  }
  std::vector<const Msg*> ptrs;
  for (const Msg& m : msgs) ptrs.push_back(&m);
  return sum(*t.chunk, ptrs, n, h);
}

}  // namespace

// The chunk's input for its first piece: the gathered rows once this rank's own are in (kIn), else the messages.
Status TensorParallel::piece_input(const Task& t, SplitNode& s, int64_t n, int64_t h) {
  if (t.in->segment != Segment::kIn) {
    if (t.pass == ir::Pass::kF) {
      PIPER_ASSIGN_OR_RETURN(s.x, sum_messages<Activation>(core_, t, n, h, sum_hidden));
    } else {
      PIPER_ASSIGN_OR_RETURN(s.x, sum_messages<Gradient>(core_, t, n, h, sum_dhidden));
    }
    return ok_status();
  }
  PIPER_RETURN_IF_ERROR(core_.wait_until(
      [&] {
        std::lock_guard<std::mutex> lock(mu_);
        return s.own_rows;
      },
      Core::kWaitTimeout, "'" + t.in->label + "' waited 600 s for this rank's rows of its all-gather"));
  std::lock_guard<std::mutex> lock(mu_);
  s.x = s.input;
  return ok_status();
}

// The first piece: the chunk's input and the stash (F: begun here; B: the forward's).
Status TensorParallel::begin_pieces(const Task& t, SplitNode& s) {
  const Instruction& in = *t.in;
  const int64_t n = core_.mbs * core_.batch->seq_len, h = core_.model->dims().hidden;
  if (n % size_ != 0) {
    return invalid_argument("'" + in.label + "': sequence parallelism splits a microbatch's " + std::to_string(n) +
                            " tokens (mbs * seq) over tp=" + std::to_string(size_) +
                            "; make mbs * seq a multiple of tp");
  }
  PIPER_RETURN_IF_ERROR(piece_input(t, s, n, h));
  PiecewiseChunk& pc = *t.chunk->piecewise();
  if (t.pass == ir::Pass::kF) {
    const int64_t offset = static_cast<int64_t>(t.mb) * n;
    const Microbatch mb{core_.batch->inputs.data() + offset, core_.batch->targets.data() + offset, core_.mbs,
                        core_.batch->seq_len};
    s.fstash = pc.forward_begin(mb, s.x);
    s.stash = s.fstash.get();
    return ok_status();
  }
  {
    std::lock_guard<std::mutex> lock(core_.mu);
    auto it = core_.stashes.find(t.key);
    if (it == core_.stashes.end()) {
      return internal_error("'" + in.label + "' has no stashed activations for " + key_name(t.key));
    }
    s.stash = it->second.get();
  }
  pc.backward_begin(*s.stash, s.x);
  return ok_status();
}

// The last piece ends the node as one whole task would: F stashes (and keeps a recomputed forward's input), B runs
// the weight gradients (BW); the output is published here unless the reduce-scatter's pieces publish it.
Status TensorParallel::finish_pieces(const Task& t, SplitNode& s, StepContext& ctx) {
  const bool split_out = t.in->segment == Segment::kOut;
  std::shared_ptr<Tensor> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = s.output;
    if (!split_out) s.output.reset();
    s.input.reset();
  }
  std::shared_ptr<const Tensor> x = std::move(s.x);
  if (t.pass == ir::Pass::kF) {
    s.stash = nullptr;
    std::vector<Activation> inputs;
    inputs.push_back(Activation{std::move(x), nullptr, nullptr});
    return core_.keep_forward(t, std::move(s.fstash), std::move(inputs), Activation{std::move(out), nullptr, nullptr},
                              !split_out);
  }
  if (t.pass == ir::Pass::kBW) {
    if (t.grad_index >= 0) PIPER_RETURN_IF_ERROR(core_.dp->before_grad_task(t));  // ZeRO-2/3
    t.chunk->backward_weight(ctx, *s.stash);
  }
  s.stash = nullptr;
  if (!split_out && t.consumers > 0) {
    Gradient g;
    g.dhidden = std::move(out);
    core_.publish_message(t, std::move(g));
  }
  if (t.pass == ir::Pass::kBW) {
    std::lock_guard<std::mutex> lock(core_.mu);
    ++core_.grad_tasks_done;
    core_.cv.notify_all();
  }
  return ok_status();
}

}  // namespace piper::runtime::detail
