#include "piper/runtime/exec/executor.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "piper/base/clock.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/exec/executor_handlers.h"
#include "piper/runtime/exec/trace.h"

namespace piper::runtime {

using compile::Instruction;
using compile::OpKind;
using detail::Core;
using detail::key_name;
using detail::StashKey;
using detail::Task;

std::string detail::key_name(const StashKey& k) {
  return "(layer " + std::to_string(std::get<0>(k)) + ", " + std::get<1>(k) + ", mb " + std::to_string(std::get<2>(k)) +
         ")";
}

Result<std::shared_ptr<const Tensor>> Core::take_hidden(const Task& t, const std::string& boundary) {
  if (t.sources.size() > 1) return take_hidden_sum(t, boundary);
  if (t.gradient) {
    PIPER_ASSIGN_OR_RETURN(Gradient g, take_message<Gradient>(t, t.source));
    if (g.dnormed || g.dtopk_w) {
      return unimplemented("'" + t.in->label + "': an experts -> router edge crosses " + boundary);
    }
    return g.dhidden;
  }
  PIPER_ASSIGN_OR_RETURN(Activation a, take_message<Activation>(t, t.source));
  if (a.routed) return unimplemented("'" + t.in->label + "': a router -> experts edge crosses " + boundary);
  return a.hidden;
}

// Several producers (the tp all-gather before the attention after a MoE layer with shared experts: the experts' and
// the shared experts' outputs): their hidden tensors summed in edge order, as a chunk sums its inputs.
Result<std::shared_ptr<const Tensor>> Core::take_hidden_sum(const Task& t, const std::string& boundary) {
  std::shared_ptr<Tensor> sum;
  for (ir::NodeId src : t.sources) {
    Task one = t;
    one.sources.clear();
    one.source = src;
    PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Tensor> x, take_hidden(one, boundary));
    if (x == nullptr) return internal_error("'" + t.in->label + "': the message of '" + name_of(src) + "' is empty");
    if (sum == nullptr) {
      PIPER_ASSIGN_OR_RETURN(Tensor buf, Tensor::zeros(x->shape(), x->category(), allocator));
      sum = std::make_shared<Tensor>(std::move(buf));
    } else if (x->numel() != sum->numel()) {
      return internal_error("'" + t.in->label + "': its producers' messages differ in size");
    }
    float* out = sum->data();
    const float* in = x->data();
    for (int64_t i = 0; i < x->numel(); ++i) out[i] += in[i];
  }
  return std::shared_ptr<const Tensor>(std::move(sum));
}

void Core::publish_hidden(const Task& t, std::shared_ptr<const Tensor> x) {
  if (t.gradient) {
    Gradient g;
    g.dhidden = std::move(x);
    publish_message(t, std::move(g));
  } else {
    Activation a;
    a.hidden = std::move(x);
    publish_message(t, std::move(a));
  }
}

Core::Core()
    : p2p(std::make_unique<detail::PipelineP2p>(*this)),
      dp(std::make_unique<detail::DataParallel>(*this)),
      tp(std::make_unique<detail::TensorParallel>(*this)),
      ep(std::make_unique<detail::ExpertParallel>(*this)),
      m2n(std::make_unique<detail::M2n>(*this)),
      // Norm shares are claimed in this order (tp's split chunks, then ZeRO shards, then experts), and the
      // pre-norm hooks run in it (the tp gradient sum before the expert scaling).
      handlers{tp.get(), dp.get(), ep.get(), m2n.get(), p2p.get()} {}

Core::~Core() = default;

void Core::fail(const Status& st) {
  std::lock_guard<std::mutex> lock(mu);
  if (!failed) {
    failed = true;
    error = st;
  }
  stop = true;
  cv.notify_all();
}

Status Core::wait_until(const std::function<bool()>& ready, std::chrono::duration<double> timeout,
                        const std::string& what) {
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_for(lock, timeout, [&] { return failed || ready(); })) {
    return deadline_exceeded(what);
  }
  if (failed) return unavailable("abandoned, another stream of this rank failed");
  return ok_status();
}

void Core::notify() {
  { std::lock_guard<std::mutex> lock(mu); }
  cv.notify_all();
}

void Core::add_seconds(const std::string& key, double seconds) {
  std::lock_guard<std::mutex> lock(mu);
  task_seconds[key] += seconds;
}

Result<std::unique_ptr<Executor>> Executor::create(const compile::Plan& plan, const compile::Program& program,
                                                   Model* model, Optimizer* optimizer, Allocator* allocator,
                                                   DistContext* dist) {
  auto impl = std::make_unique<Impl>();
  impl->dist = dist;
  impl->plan = &plan;
  impl->model = model;
  impl->optimizer = optimizer;
  impl->allocator = allocator;
  impl->num_mb = std::max(1, plan.num_microbatches);
  if (program.streams.empty())
    return invalid_argument("executor: the program of rank " + std::to_string(program.pp_rank) + " has no streams");
  PIPER_RETURN_IF_ERROR(impl->index_program(program));
  if (dist != nullptr && plan.mesh.tp > 1) PIPER_RETURN_IF_ERROR(impl->tp->init(program));
  for (const compile::Stream& stream : program.streams) {
    std::vector<Task> tasks;
    for (size_t i = 0; i < stream.instrs.size(); ++i) {
      Task t;
      t.in = &stream.instrs[i];
      PIPER_RETURN_IF_ERROR(impl->resolve(stream, i, &t));
      tasks.push_back(std::move(t));
    }
    impl->streams.push_back(std::move(tasks));
    impl->stream_names.push_back(stream.name);
  }
  // The MoE layers, expert norm owners and HALO context, then the ZeRO shards of state, gradients and parameters.
  PIPER_RETURN_IF_ERROR(impl->ep->setup());
  PIPER_RETURN_IF_ERROR(impl->dp->setup());
  PIPER_RETURN_IF_ERROR(impl->tp->setup());
  for (const auto& c : model->chunks()) {
    const int n = impl->updates_expected.count(c.get()) ? impl->updates_expected[c.get()] : 0;
    if (n != 1) {
      return invalid_argument("executor: chunk " + c->name() + " has " + std::to_string(n) +
                              " update instructions in the program; it needs exactly one");
    }
  }
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

Status Core::index_program(const compile::Program& program) {
  for (const compile::Stream& stream : program.streams) {
    for (const Instruction& in : stream.instrs) {
      if (in.node != ir::kNoNode) by_node.emplace(in.node, &in);
    }
  }
  for (const compile::Stream& stream : program.streams) {
    for (const Instruction& in : stream.instrs) {
      for (const auto* list : {&in.inputs, &in.outputs}) {
        for (ir::NodeId id : *list) {
          if (by_node.count(id) == 0) {
            return invalid_argument("executor: '" + in.label + "' exchanges messages with node " + std::to_string(id) +
                                    ", which no instruction of rank " + std::to_string(program.pp_rank) +
                                    "'s program runs; compile the plan again");
          }
        }
      }
    }
  }
  return ok_status();
}

Status Core::resolve(const compile::Stream& stream, size_t i, Task* t) {
  const Instruction& in = stream.instrs[i];
  switch (in.op) {
    case OpKind::kSend:
    case OpKind::kRecv:
    case OpKind::kCollective:
      if (dist == nullptr) {
        return invalid_argument("executor: instruction '" + in.label + "' (" + compile::to_string(in.op) + " " +
                                ir::to_string(in.comm) + ") needs other ranks; run the plan on its " +
                                "ranks (piper train --ranks N) or compile a single-rank strategy");
      }
      return resolve_comm(in, t);
    case OpKind::kRecord:
    case OpKind::kWait:
      num_events = std::max(num_events, in.event + 1);
      return ok_status();
    case OpKind::kAlloc:
      return resolve_alloc(stream, i);
    case OpKind::kFree:
      return ok_status();
    case OpKind::kUpdate:
      t->chunk = model->find(in.layer, in.part);
      if (t->chunk == nullptr) {
        return invalid_argument("executor: update '" + in.label + "' names (layer " + std::to_string(in.layer) + ", " +
                                in.part_name() + "), which the model lacks");
      }
      updates_expected[t->chunk]++;
      return ok_status();
    case OpKind::kCompute:
      return resolve_compute(in, t);
  }
  return internal_error("executor: '" + in.label + "' has an unknown op");
}

// A communication instruction goes to the handler of its kind: m2n send/recv to M2n when routed (a dense edge is a
// pipeline message), other send/recv to the pipeline, tp exchanges and tp gradient sums to TensorParallel,
// all_to_all and the etp gather / reduce-scatter to ExpertParallel, gradient reductions and parameter gathers to
// DataParallel.
Status Core::resolve_comm(const Instruction& in, Task* t) {
  if (in.node == ir::kNoNode) return internal_error("executor: '" + in.label + "' names no graph node");
  if (in.op == OpKind::kSend || in.op == OpKind::kRecv) {
    bool routed = false;
    if (in.comm == ir::NodeKind::kM2N) {
      PIPER_ASSIGN_OR_RETURN(routed, m2n->routed(in));
    }
    t->handler = routed ? static_cast<detail::Handler*>(m2n.get()) : p2p.get();
  } else if (detail::is_tp_exchange(in) || in.role == compile::CommRole::kTpGradSum) {
    t->handler = tp.get();
  } else if (in.comm == ir::NodeKind::kAllToAll || detail::is_etp_exchange(in)) {
    t->handler = ep.get();
  } else {
    t->handler = dp.get();
  }
  return t->handler->resolve(in, t);
}

// The owner of an alloc's buffer: the ZeRO-3 parameters the next all-gather materialises (its free re-shards
// them), or the forward chunk that follows (a second alloc before it, a recompute checkpoint, only counts bytes);
// an alloc before a backward chunk is its working set (compile/memory_plan.cc) and only counts bytes too.
Status Core::resolve_alloc(const compile::Stream& stream, size_t i) {
  const Instruction& in = stream.instrs[i];
  size_t j = i + 1;
  while (j < stream.instrs.size() && stream.instrs[j].op == OpKind::kAlloc) ++j;
  if (j < stream.instrs.size() && stream.instrs[j].op == OpKind::kCollective &&
      stream.instrs[j].comm == ir::NodeKind::kAllGather && stream.instrs[j].node != ir::kNoNode &&
      stream.instrs[j].mb >= 0 && stream.instrs[j].group != "tp" && stream.instrs[j].group != "etp") {
    const Instruction& ag = stream.instrs[j];
    Chunk* chunk = model->find(ag.layer, ag.part);
    if (chunk == nullptr) {
      return invalid_argument("executor: '" + in.label + "' gathers the parameters of (layer " +
                              std::to_string(ag.layer) + ", " + ag.part_name() + "), which this rank does not hold");
    }
    dp->own_param_buffer(in.buffer, chunk);
    return ok_status();
  }
  while (j < stream.instrs.size() && stream.instrs[j].op != OpKind::kCompute) ++j;
  if (j < stream.instrs.size() && ir::is_backward(stream.instrs[j].pass)) {
    counted_only.insert(in.buffer);  // a backward's working set (the chunk allocates it itself): bytes only
    return ok_status();
  }
  if (j == stream.instrs.size() || stream.instrs[j].pass != ir::Pass::kF) {
    return invalid_argument("executor: '" + in.label + "' (buffer " + std::to_string(in.buffer) +
                            ") is not followed by a forward task on stream '" + stream.name + "'");
  }
  const Instruction& f = stream.instrs[j];
  const StashKey key{f.layer, f.part_name(), f.mb};
  if (i == 0 || stream.instrs[i - 1].op != OpKind::kAlloc) {
    buffer_owner[in.buffer] = key;
  } else {
    counted_only.insert(in.buffer);
  }
  return ok_status();
}

Status Core::resolve_compute(const Instruction& in, Task* t) {
  if (in.comm != ir::NodeKind::kChunk) {
    return invalid_argument("executor: compute '" + in.label + "' is not a chunk node");
  }
  // tp_overlap: the kIn and kOut pieces of a node run beside its kRest, which counts as the node's compute.
  const bool side_piece = in.segment == compile::Segment::kIn || in.segment == compile::Segment::kOut;
  if (side_piece) t->piece = pieces_of_node[{in.node, in.segment}]++;
  t->last_piece = in.segment == compile::Segment::kWhole || (in.segment == compile::Segment::kRest && !in.split_out) ||
                  (in.segment == compile::Segment::kOut && t->piece == in.pieces - 1);
  const int occurrence = side_piece ? 0 : computes_of_node[in.node]++;
  t->recomputed = in.recompute;
  t->rerun = occurrence > 0;
  if (occurrence > (in.recompute ? 1 : 0)) {
    return invalid_argument("executor: '" + in.label + "' computes node '" + name_of(in.node) + "' " +
                            std::to_string(occurrence + 1) + " times; only a recomputed forward runs twice");
  }
  t->chunk = model->find(in.layer, in.part);
  if (t->chunk == nullptr) {
    return invalid_argument("executor: compute '" + name_of(in.node) + "' (layer " + std::to_string(in.layer) +
                            ", part " + in.part_name() + ") has no chunk in the model");
  }
  t->pass = in.pass;
  t->mb = std::max(0, in.mb);
  t->key = StashKey{in.layer, in.part_name(), t->mb};
  if (t->pass != ir::Pass::kF && !ir::is_backward(t->pass)) {
    return invalid_argument("executor: '" + in.label + "' has pass " + ir::to_string(t->pass));
  }
  if (t->pass != ir::Pass::kW) PIPER_RETURN_IF_ERROR(wire_compute(in, t));
  if (in.segment != compile::Segment::kWhole) PIPER_RETURN_IF_ERROR(tp->resolve_piece(in, t));
  if ((t->pass == ir::Pass::kW || t->pass == ir::Pass::kBW) && t->last_piece) {
    ++grad_tasks_total;
    t->grad_index = grad_tasks_of_chunk[t->chunk]++;
  }
  norm_owner[t->chunk] = true;
  if (dist != nullptr) {
    // Each parameter counts once in the global norm: on tensor rank 0 of its first data-parallel replica.
    // Experts (shard_axis ep): on the ranks of the first expert group, which hold distinct experts.
    const compile::RankCoord& c = dist->coord();
    norm_owner[t->chunk] = in.shard_axis == "ep" ? plan->mesh.ep_block(c.dp, c.tp) == 0 : c.tp == 0 && c.dp == 0;
  }
  return ok_status();
}

// A compute's messages: the plan's inputs that carry one (forward: producers' F; backward: consumers' B/BW; any
// exchange), and how many of its outputs take its own.
Status Core::wire_compute(const Instruction& in, Task* t) {
  const bool fwd = t->pass == ir::Pass::kF;
  auto relevant = [&](ir::NodeId other) {
    const Instruction& o = instr_of(other);
    // Pipeline send/recv endpoints carry the message to / from the other rank.
    if (o.comm == ir::NodeKind::kSend || o.comm == ir::NodeKind::kRecv) return true;
    if (o.comm == ir::NodeKind::kM2N) return true;       // af-pipe exchange (executor_m2n.cc)
    if (o.comm == ir::NodeKind::kAllToAll) return true;  // expert dispatch / combine (executor_ep.cc)
    if (detail::is_tp_exchange(o)) return true;          // tensor-parallel exchange (executor_tp.cc)
    if (detail::is_etp_exchange(o)) return true;         // the experts' etp rows (executor_ep_etp.cc)
    if (ir::is_comm(o.comm)) return false;
    if (o.comm != ir::NodeKind::kChunk || (o.layer == in.layer && o.part == in.part)) return false;
    return fwd ? o.pass == ir::Pass::kF : (o.pass == ir::Pass::kB || o.pass == ir::Pass::kBW);
  };
  for (ir::NodeId src : in.inputs) {
    const Instruction& o = instr_of(src);
    const bool exchanged = o.comm == ir::NodeKind::kRecv || o.comm == ir::NodeKind::kAllToAll ||
                           o.comm == ir::NodeKind::kM2N || detail::is_tp_exchange(o) || detail::is_etp_exchange(o);
    // ZeRO-3: the parameter all-gather before the task (executor_dp.cc); no message. A recomputed forward re-runs
    // right before its backward, after the wait for that backward's all-gather, and uses those gathered parameters.
    if (o.comm == ir::NodeKind::kAllGather && !exchanged) continue;
    if (ir::is_comm(o.comm) && !exchanged) {
      return unimplemented("executor: '" + in.label + "' reads from communication node '" + o.label + "' (" +
                           ir::to_string(o.comm) +
                           "); the runtime does not execute that kind of exchange yet (docs/runtime.md)");
    }
    if (relevant(src)) t->sources.push_back(src);
  }
  for (ir::NodeId dst : in.outputs) {
    if (relevant(dst)) ++t->consumers;
  }
  return ok_status();
}

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() = default;

int Executor::num_microbatches() const { return impl_->num_mb; }
int Executor::num_streams() const { return static_cast<int>(impl_->streams.size()); }
int64_t Executor::planned_peak_bytes() const { return impl_->planned_peak; }
void Executor::set_trace(TraceRecorder* recorder) { impl_->trace = recorder; }
std::vector<Executor::ParamShard> Executor::param_shards(const Chunk& chunk) { return impl_->dp->param_shards(chunk); }
Status Executor::complete_param_gathers() { return impl_->dp->complete_deferred_gathers(); }

std::pair<int64_t, int64_t> Executor::update_range(const Chunk& chunk) const {
  if (const detail::DataParallel::Shard* sh = impl_->dp->shard(chunk)) return {sh->begin, sh->end};
  int64_t total = 0;
  for (const Param& p : chunk.params()) total += p.trainable ? p.value.numel() : 0;
  return {0, total};
}

Status Core::compute(const Task& t) {
  StepContext ctx{num_mb, allocator};
  PIPER_RETURN_IF_ERROR(dp->check_gathered(t));
  if (t.in->segment != compile::Segment::kWhole) return tp->run_piece(t, ctx);  // tp_overlap
  if (t.pass == ir::Pass::kF) return forward(t, ctx);
  return backward(t, ctx);
}

Status Core::forward(const Task& t, StepContext& ctx) {
  const std::string& label = t.in->label;
  std::vector<Activation> inputs;
  if (t.rerun) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = recompute_inputs.find(t.key);
    if (it == recompute_inputs.end()) {
      return internal_error("'" + label + "': no kept inputs for " + key_name(t.key) + " (first forward missing)");
    }
    inputs = std::move(it->second);
    recompute_inputs.erase(it);
  } else {
    for (ir::NodeId src : t.sources) {
      PIPER_ASSIGN_OR_RETURN(Activation a, take_message<Activation>(t, src));
      inputs.push_back(std::move(a));
    }
  }
  PIPER_RETURN_IF_ERROR(m2n->local_inputs(t, &inputs));  // af-pipe (executor_m2n.cc)
  std::vector<const Activation*> ptrs;
  for (const Activation& a : inputs) ptrs.push_back(&a);
  const int64_t offset = static_cast<int64_t>(t.mb) * mbs * batch->seq_len;
  Microbatch mb{batch->inputs.data() + offset, batch->targets.data() + offset, mbs, batch->seq_len};
  PIPER_RETURN_IF_ERROR(tp->context(t, &ctx, &mb));
  Activation out;
  ctx.recompute = t.rerun;
  ctx.recompute_norm = t.in->recompute_norm;
  ctx.recompute_act = t.in->recompute_act;
  auto stash = t.chunk->forward(ctx, mb, ptrs, &out);
  if (!stash.ok()) return stash.status();
  return keep_forward(t, std::move(stash).value(), std::move(inputs), std::move(out), true);
}

Status Core::keep_forward(const Task& t, std::unique_ptr<Stash> stash, std::vector<Activation> inputs, Activation out,
                          bool publish) {
  std::lock_guard<std::mutex> lock(mu);
  if (stashes.count(t.key)) return internal_error("'" + t.in->label + "' ran twice for " + key_name(t.key));
  if (t.rerun) {  // the outputs and losses were published by the first run
    stashes[t.key] = std::move(stash);
    return ok_status();
  }
  if (t.recomputed) recompute_inputs[t.key] = std::move(inputs);
  loss_mb[static_cast<size_t>(t.mb)] += stash->loss;
  aux_mb[static_cast<size_t>(t.mb)] += stash->aux_loss;
  stashes[t.key] = std::move(stash);
  if (publish && t.consumers > 0) publish_message(t, std::move(out));
  return ok_status();
}

Status Core::backward(const Task& t, StepContext& ctx) {
  const std::string& label = t.in->label;
  if (t.grad_index >= 0) PIPER_RETURN_IF_ERROR(dp->before_grad_task(t));  // ZeRO-2/3 (executor_dp.cc)
  PIPER_RETURN_IF_ERROR(tp->context(t, &ctx, nullptr));
  Stash* stash = nullptr;
  std::vector<Gradient> grads;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = stashes.find(t.key);
    if (it == stashes.end()) {
      return internal_error("'" + label + "' has no stashed activations for " + key_name(t.key) +
                            ": its forward has not run or they were freed");
    }
    stash = it->second.get();
  }
  for (ir::NodeId src : t.sources) {
    PIPER_ASSIGN_OR_RETURN(Gradient g, take_message<Gradient>(t, src));
    grads.push_back(std::move(g));
  }
  PIPER_RETURN_IF_ERROR(m2n->local_grads(t, &grads));  // af-pipe (executor_m2n.cc)
  if (t.pass == ir::Pass::kW) {
    t.chunk->backward_weight(ctx, *stash);
  } else {
    std::vector<const Gradient*> ptrs;
    for (const Gradient& g : grads) ptrs.push_back(&g);
    Gradient dx;
    PIPER_RETURN_IF_ERROR(t.chunk->backward_input(ctx, ptrs, *stash, &dx));
    grads.clear();
    if (t.pass == ir::Pass::kBW) t.chunk->backward_weight(ctx, *stash);
    if (t.consumers > 0) publish_message(t, std::move(dx));
  }
  if (t.pass == ir::Pass::kW || t.pass == ir::Pass::kBW) {
    std::lock_guard<std::mutex> lock(mu);
    ++grad_tasks_done;
    cv.notify_all();
  }
  return ok_status();
}

Status Core::free_buffer(const Instruction& in) {
  PIPER_ASSIGN_OR_RETURN(bool params, dp->free_buffer(in));  // ZeRO-3: re-shard (executor_dp.cc)
  std::unique_ptr<Stash> dead;
  std::lock_guard<std::mutex> lock(mu);
  if (params || counted_only.count(in.buffer) > 0) {
    planned_live -= in.bytes;
    return ok_status();
  }
  auto owner = buffer_owner.find(in.buffer);
  if (owner == buffer_owner.end()) return internal_error("'" + in.label + "' frees a buffer never allocated");
  auto it = stashes.find(owner->second);
  if (it == stashes.end()) {
    return internal_error("'" + in.label + "': no activations of " + key_name(owner->second) + " to free");
  }
  dead = std::move(it->second);
  stashes.erase(it);
  planned_live -= in.bytes;
  return ok_status();
}

Status Core::update(const Task& t) {
  const Instruction& in = *t.in;
  Status waited = wait_until(
      [&] { return grad_tasks_done == grad_tasks_total && dp->reductions_complete() && tp->grad_sums_complete(); },
      kWaitTimeout, "'" + in.label + "' waited 600 s for the step's gradients");
  if (!waited.ok()) return waited.code() == StatusCode::kUnavailable ? ok_status() : waited;
  if (dist == nullptr) {
    std::lock_guard<std::mutex> lock(mu);
    if (!norm_done) {
      grad_norm = optimizer->begin_step();
      norm_done = true;
    }
  } else {
    // One norm exchange per step, whichever stream's update gets here first.
    std::lock_guard<std::mutex> norm_lock(norm_mu);
    if (!norm_done) {
      for (detail::Handler* h : handlers) PIPER_RETURN_IF_ERROR(h->prepare_norm());
      PIPER_RETURN_IF_ERROR(sum_bias_counts());
      PIPER_ASSIGN_OR_RETURN(double norm, global_grad_norm());
      std::lock_guard<std::mutex> lock(mu);
      grad_norm = norm;
      optimizer->begin_step_with_norm(norm);
      norm_done = true;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  dp->update(*optimizer, *t.chunk);
  t.chunk->after_update();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mu);
  updates_done[t.chunk]++;
  task_seconds["update"] += s;
  return ok_status();
}

Status Core::execute(const Task& t) {
  const Instruction& in = *t.in;
  switch (in.op) {
    case OpKind::kCompute: {
      const auto start = std::chrono::steady_clock::now();
      Status st = compute(t);
      add_seconds(ir::task_key(t.chunk->part(), t.pass),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      return st;
    }
    case OpKind::kSend:
    case OpKind::kRecv:
    case OpKind::kCollective:
      return t.handler->run(t);
    case OpKind::kAlloc: {
      std::lock_guard<std::mutex> lock(mu);
      planned_live += in.bytes;
      planned_peak = std::max(planned_peak, planned_live);
      return ok_status();
    }
    case OpKind::kFree:
      return free_buffer(in);
    case OpKind::kRecord: {
      std::lock_guard<std::mutex> lock(mu);
      events[static_cast<size_t>(in.event)] = 1;
      cv.notify_all();
      return ok_status();
    }
    case OpKind::kWait: {
      Status waited = wait_until([&] { return events[static_cast<size_t>(in.event)] != 0; }, kWaitTimeout,
                                 "'" + in.label + "' waited 600 s for event " + std::to_string(in.event));
      return waited.code() == StatusCode::kUnavailable ? ok_status() : waited;
    }
    case OpKind::kUpdate:
      return update(t);
  }
  return internal_error("executor: unexpected instruction '" + in.label + "'");
}

void Core::run_stream(size_t s) {
  const double cpu0 = thread_cpu_s();
  run_tasks(s);
  const double cpu = thread_cpu_s() - cpu0;
  std::lock_guard<std::mutex> lock(mu);
  stream_cpu_s[stream_names[s]] += cpu;
}

void Core::run_tasks(size_t s) {
  for (size_t i = 0; i < streams[s].size(); ++i) {
    const Task& t = streams[s][i];
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failed) return;
    }
    const auto begin = trace != nullptr ? TraceRecorder::Clock::now() : TraceRecorder::Clock::time_point{};
    Status st = execute(t);
    if (trace != nullptr) trace->record(static_cast<int>(s), static_cast<int>(i), begin, TraceRecorder::Clock::now());
    if (!st.ok()) {
      fail(st.with_context("executor: " + t.in->label));
      return;
    }
  }
}

void Core::begin_step(const Batch& b) {
  model->zero_grads();
  batch = &b;
  mbs = b.batch_size / num_mb;
  messages.clear();
  stashes.clear();
  recompute_inputs.clear();
  events.assign(static_cast<size_t>(num_events), 0);
  updates_done.clear();
  grad_tasks_done = 0;
  for (detail::Handler* h : handlers) h->begin_step();
  stop = false;
  norm_done = false;
  grad_norm = 0;
  failed = false;
  error = ok_status();
  loss_mb.assign(static_cast<size_t>(num_mb), 0.0);
  aux_mb.assign(static_cast<size_t>(num_mb), 0.0);
  planned_live = 0;
  planned_peak = 0;
  task_seconds.clear();
  stream_cpu_s.clear();
}

Result<StepResult> Core::end_step() {
  batch = nullptr;
  if (failed) {
    stashes.clear();
    recompute_inputs.clear();
    messages.clear();
    return error;
  }
  if (!recompute_inputs.empty()) {
    return internal_error("executor: the plan never re-ran the recomputed forward of " +
                          key_name(recompute_inputs.begin()->first));
  }
  if (!stashes.empty()) {
    return internal_error("executor: the plan never freed the activations of " + key_name(stashes.begin()->first));
  }
  if (std::optional<ir::NodeId> left = messages.leftover()) {
    return internal_error("executor: a task's output was never consumed (node '" + name_of(*left) + "')");
  }
  if (updates_done != updates_expected) return internal_error("executor: not every chunk was updated once");
  StepResult r;
  for (int k = 0; k < num_mb; ++k) {
    r.loss += loss_mb[static_cast<size_t>(k)];
    r.aux_loss += aux_mb[static_cast<size_t>(k)];
  }
  r.loss /= num_mb;
  if (dist != nullptr) PIPER_RETURN_IF_ERROR(reduce_losses(&r.loss, &r.aux_loss));
  for (detail::Handler* h : handlers) PIPER_RETURN_IF_ERROR(h->end_step(&r));
  r.grad_norm = grad_norm;
  r.task_seconds = task_seconds;
  r.stream_cpu_s = stream_cpu_s;
  for (const auto& s : streams) r.num_instructions += static_cast<int64_t>(s.size());
  return r;
}

Result<StepResult> Executor::run_step(const Batch& batch) {
  Impl& m = *impl_;
  if (batch.batch_size < 1 || batch.batch_size % m.num_mb != 0) {
    return invalid_argument("executor: a batch of " + std::to_string(batch.batch_size) +
                            " sequences does not split into the plan's " + std::to_string(m.num_mb) + " microbatches");
  }
  if (static_cast<int64_t>(batch.inputs.size()) != batch.batch_size * batch.seq_len ||
      batch.targets.size() != batch.inputs.size()) {
    return invalid_argument("executor: batch arrays do not match [batch_size, seq_len]");
  }
  const auto start = std::chrono::steady_clock::now();
  m.begin_step(batch);
  if (m.streams.size() == 1) {
    m.run_stream(0);
  } else {
    // OpenMP's thread count is per thread: stream threads inherit the caller's, not the process default.
    const int kernel_threads = kernels::kernel_threads();
    std::vector<std::thread> threads;
    for (size_t s = 0; s < m.streams.size(); ++s) {
      threads.emplace_back([&m, s, kernel_threads] {
        kernels::set_kernel_threads(kernel_threads);
        m.run_stream(s);
      });
    }
    for (auto& th : threads) th.join();
  }
  PIPER_ASSIGN_OR_RETURN(StepResult r, m.end_step());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace piper::runtime
