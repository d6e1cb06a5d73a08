// The executor's expert-parallel all-to-all instructions (dispatch and combine over the `ep` group, flat or
// HALO), the expert-gradient scaling and norm ownership under expert parallelism, and the per-step expert load
// (tokens each expert received). See executor.h and docs/runtime.md.
//
// One (layer, microbatch) of routed tokens, ep group of P ranks, rank r holding physical slots [r E/P, (r+1) E/P)
// (each slot a logical expert by the layer's placement table; the identity until experts migrate):
//   dispatch F  rows (token, slot) of the normed input to the expert's rank (moe_dispatch), and per row its local
//               expert and routing weight (all-to-all-v in the same order); the residual stays here
//   combine F   the expert output rows back to the source, weighted and summed in slot order (moe_combine),
//               plus the residual: x + routed_scaling * y, the single-rank experts chunk's output
//   combine B   the transposed exchange: the output gradient (times routed_scaling) dispatched like the tokens
//   dispatch B  the transposed exchange: the rows' input gradients combined with unit weights (the permutation's
//               gradient), and each row's routing-weight gradient back by all-to-all-v (the source's dtopk_w)
// The blocking exchanges run on the plan's ep stream; their bookkeeping (routing, row counts) lives from the
// dispatch F to the dispatch B of the same (layer, microbatch).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <span>

#include "piper/base/fault.h"
#include "piper/comm/algorithms/halo_all_to_all.h"
#include "piper/comm/algorithms/moe_combine.h"
#include "piper/comm/algorithms/moe_dispatch.h"
#include "piper/comm/algorithms/pairwise_all_to_all.h"
#include "piper/runtime/exec/executor_handlers.h"

namespace piper::runtime::detail {

using compile::Instruction;

struct EpExchange {
  comm::MoeRouting routing;              // group rank of each (token, slot)
  std::vector<size_t> rows_to;           // rows sent to each rank
  std::vector<size_t> rows_from;         // rows received from each rank
  std::shared_ptr<const Routed> routed;  // the source's routing (weights for the combine)
  int64_t rows_received = 0;             // rows the forward dispatch delivered (not kept: under etp the
                                         // experts keep the gathered rows instead)
};

namespace {

bool is_dispatch(const Instruction& n) { return n.role == compile::CommRole::kEpDispatch; }

// Node-major layout of the ep group on the world's nodes (ranks_per_node consecutive world ranks a node):
// the group's ranks per node, or an error when the group is not spread evenly and node-major.
Result<int> group_ranks_per_node(const std::vector<int>& members, int world_ranks_per_node) {
  std::map<int, int> per_node;
  int last_node = -1;
  for (int r : members) {
    const int node = r / world_ranks_per_node;
    if (node < last_node) return invalid_argument("the ep group's ranks are not node-major");
    last_node = node;
    ++per_node[node];
  }
  const int k = per_node.begin()->second;
  for (const auto& [node, count] : per_node) {
    if (count != k) {
      return invalid_argument("the ep group has " + std::to_string(count) + " ranks on node " + std::to_string(node) +
                              " but " + std::to_string(k) + " on another; HALO needs the " +
                              "same number on every node (choose ranks-per-node so that ep ranks split evenly)");
    }
  }
  return k;
}

std::shared_ptr<Tensor> tensor_from(const void* data, int64_t rows, int64_t h, MemCategory category,
                                    Allocator* allocator) {
  auto t = std::make_shared<Tensor>(Tensor::zeros_or_die({rows, h}, category, allocator));
  if (rows * h > 0) std::memcpy(t->data(), data, static_cast<size_t>(rows * h) * sizeof(float));
  return t;
}

}  // namespace

Status ExpertParallel::setup() {
  for (const compile::Program& prog : core_.plan->templates) {
    for (const compile::Stream& st : prog.streams) {
      for (const Instruction& n : st.instrs) {
        if (n.op != compile::OpKind::kCompute || n.part != Part::kExperts) continue;
        has_experts_ = true;
        moe_layers_.insert(n.layer);
      }
    }
  }
  // Without expert parallelism (ep = 1) but reduced over the plan's edp group (Plan::experts_reduce_over_edp: etp > 1,
  // the experts sliced over etp, executor_ep_etp.cc; or sequence parallelism, whole experts on token slices): no ep
  // group, but norm and scaling as an expert-parallel layer's.
  edp_without_ep_ = comm_ == nullptr && has_experts_ && core_.dist != nullptr && core_.plan->experts_reduce_over_edp();
  if (edp_without_ep_) {
    owns_expert_norm_ = core_.dist->coord().dp == 0 && core_.dist->coord().tp / core_.plan->mesh.etp == 0;
  }
  if (comm_ == nullptr) return ok_status();
  // Each expert counts once in the global norm: on the first expert group (MeshInfo::ep_block 0: the first ep
  // block of dp coordinates of tensor rank 0, or folded the first ep ranks of the stage), whose ranks hold
  // distinct experts.
  const compile::RankCoord& c = core_.dist->coord();
  // With etp > 1 the first ep block's first etp tensor ranks, which hold distinct slices.
  const ir::MeshInfo& m = core_.plan->mesh;
  owns_expert_norm_ = m.etp > 1 ? c.dp / std::max(1, m.ep) == 0 && c.tp / m.etp == 0 : m.ep_block(c.dp, c.tp) == 0;
  const ChunkDims& d = core_.model->dims();
  if (d.local_experts() * ep_ != d.num_experts) {
    return invalid_argument("executor: the plan shards " + std::to_string(d.num_experts) + " experts over ep=" +
                            std::to_string(ep_) + " but the model holds " + std::to_string(d.local_experts()) +
                            " per rank; build it with ModelOptions expert_ranks=" + std::to_string(ep_));
  }
  experts_per_rank_ = d.local_experts();
  for (int layer : moe_layers_) {
    std::vector<int> identity(static_cast<size_t>(d.num_experts));
    std::iota(identity.begin(), identity.end(), 0);
    slot_expert_[layer] = identity;
    expert_slot_[layer] = identity;
  }
  if (halo_) {
    PIPER_ASSIGN_OR_RETURN(std::vector<int> members, core_.dist->plan().group_ranks(core_.dist->rank(), "ep"));
    const int world_rpn = core_.dist->ranks_per_node();
    Result<int> rpn = group_ranks_per_node(members, world_rpn);
    if (!rpn.ok()) {
      return invalid_argument("executor: a2a=halo on " + std::to_string(world_rpn) +
                              " ranks per node: " + rpn.status().message());
    }
    // One lane per rank: every rank is its own proxy (a NIC per GPU, DGX rails), the layout that measured fastest
    // on the emulated two nodes (docs/comm.md: one lane is one TCP stream per node pair).
    PIPER_ASSIGN_OR_RETURN(comm::NodeTopology topo, comm::NodeTopology::create(ep_, *rpn, *rpn));
    PIPER_ASSIGN_OR_RETURN(halo_context_, comm::HaloContext::create(*comm_, topo));
  }
  return ok_status();
}

Status ExpertParallel::resolve(const Instruction& in, Task* t) {
  if (is_etp_exchange(in)) return resolve_etp(in, t);
  const Instruction& n = in;
  if (in.group != "ep" || (n.role != compile::CommRole::kEpDispatch && n.role != compile::CommRole::kEpCombine)) {
    return unimplemented("executor: '" + in.label + "' is an all_to_all over '" + in.group + "' (" + n.part_name() +
                         "); the runtime executes the expert dispatch and combine over ep only");
  }
  if (in.algorithm != "flat" && in.algorithm != "halo") {
    return unimplemented("executor: '" + in.label + "' uses all-to-all algorithm '" + in.algorithm +
                         "'; the runtime runs a2a=flat and a2a=halo");
  }
  has_experts_ = true;
  t->comm = core_.dist->group("ep");
  if (t->comm == nullptr) return internal_error("executor: '" + in.label + "' runs over ep, which has degree 1");
  if (comm_ != nullptr && comm_ != t->comm) return internal_error("executor: two ep groups on one rank");
  comm_ = t->comm;
  ep_ = t->comm->size();
  halo_ = halo_ || in.algorithm == "halo";
  t->degree = t->comm->size();
  t->pass = n.pass;
  t->mb = std::max(0, n.mb);
  t->key = StashKey{n.layer, n.part_name(), t->mb};
  t->gradient = n.pass != ir::Pass::kF;
  for (ir::NodeId src : in.inputs) {
    // Under tp x ep the combine's backward reads the next split chunk's input gradient from its sequence
    // reduce-scatter: this rank's token slice, the rows its forward combined (executor_tp.cc).
    const ir::NodeKind k = core_.instr_of(src).comm;
    if (k != ir::NodeKind::kChunk && k != ir::NodeKind::kRecv && !is_tp_exchange(core_.instr_of(src)) &&
        !is_etp_exchange(core_.instr_of(src))) {
      return unimplemented("executor: '" + in.label + "' reads from '" + core_.name_of(src) +
                           "'; an expert all-to-all must be fed by a chunk, a pipeline receive, a tensor-parallel "
                           "exchange or the experts' etp reduce-scatter");
    }
    t->sources.push_back(src);
  }
  t->consumers = static_cast<int>(in.outputs.size());
  if (t->sources.empty() || t->consumers == 0) {
    return internal_error("executor: '" + in.label + "' has " + std::to_string(t->sources.size()) + " inputs and " +
                          std::to_string(t->consumers) + " consumers");
  }
  if (!t->gradient && t->sources.size() != 1) {
    return internal_error("executor: '" + in.label + "' has " + std::to_string(t->sources.size()) +
                          " producers, expected 1");
  }
  return ok_status();
}

// One expert all-to-all instruction being run: its context, the flat or HALO version of each exchange, and the
// four exchanges (dispatch and combine, forward and backward).
struct ExpertParallel::Call {
  Call(ExpertParallel& ep, const Task& task, int layer)
      : x(ep),
        core(ep.core_),
        t(task),
        h(ep.core_.model->dims().hidden),
        k(ep.core_.model->dims().top_k),
        scale(static_cast<float>(ep.core_.model->dims().routed_scaling)),
        timeout_s(ep.core_.dist->timeout_s()),
        c(*task.comm),
        p(task.comm->size()),
        layer(layer) {}

  // `ex`: the forward dispatch of the same routing, whose row counts the flat exchanges reuse instead of
  // exchanging them again (one synchronisation of the ep group fewer each); null for the forward dispatch.
  Result<comm::DispatchResult> dispatch(const float* tokens, const comm::MoeRouting& r,
                                        const EpExchange* ex = nullptr) const {
    if (x.halo_) return comm::halo_dispatch(*x.halo_context_, tokens, h * sizeof(float), r, timeout_s);
    return comm::flat_dispatch(c, tokens, h * sizeof(float), r, comm::FlatDispatchKind::kPairwise, timeout_s,
                               known_counts(ex));
  }
  Result<std::vector<float>> combine(std::span<const float> rows, const comm::MoeRouting& r, std::span<const float> w,
                                     const EpExchange& ex) const {
    if (x.halo_) return comm::halo_combine(*x.halo_context_, rows, h, r, w, timeout_s);
    return comm::flat_combine(c, rows, h, r, w, comm::FlatDispatchKind::kPairwise, timeout_s, known_counts(&ex));
  }
  static std::vector<int64_t> known_counts(const EpExchange* ex) {
    return ex ? std::vector<int64_t>(ex->rows_from.begin(), ex->rows_from.end()) : std::vector<int64_t>{};
  }
  Status all_to_all(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes) const {
    if (x.halo_) return comm::halo_all_to_all_v(*x.halo_context_, send, send_bytes, recv, recv_bytes, timeout_s);
    return comm::pairwise_all_to_all_v(c, send, send_bytes, recv, recv_bytes, timeout_s);
  }

  Result<Activation> dispatch_forward(const Activation& a);
  Result<Activation> combine_forward(const Activation& a);
  Result<Gradient> combine_backward(const std::vector<Gradient>& grads, const EpExchange& ex);
  Result<Gradient> dispatch_backward(const std::vector<Gradient>& grads, const EpExchange& ex);

  ExpertParallel& x;
  Core& core;
  const Task& t;
  const int64_t h;
  const int k;
  const float scale;
  const double timeout_s;
  comm::Communicator& c;
  const int p;
  const int layer;
};

namespace {

std::vector<size_t> scaled_bytes(const std::vector<size_t>& rows, size_t b) {
  std::vector<size_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * b;
  return out;
}

// Each dispatched row's local expert and routing weight, in the dispatch's (source, token, slot) order.
struct RowMeta {
  int32_t expert;
  float weight;
};

}  // namespace

// dispatch F: rows (token, slot) of the normed input to the expert's rank, each row's local expert and weight
// after them; the routing is kept until the dispatch B.
Result<Activation> ExpertParallel::Call::dispatch_forward(const Activation& a) {
  if (!a.routed || !a.hidden) return internal_error("'" + t.in->label + "': the router sent no routing");
  auto ex = std::make_shared<EpExchange>();
  ex->routed = routing_only(a.routed);
  const int64_t tokens = a.hidden->numel() / h;
  ex->routing.num_tokens = tokens;
  ex->routing.top_k = k;
  ex->routing.dest_ranks.resize(static_cast<size_t>(tokens * k));
  ex->rows_to.assign(static_cast<size_t>(p), 0);
  // The physical slot of each routed (token, slot): its rank and local expert there.
  const std::vector<int>& slot_of = x.expert_slot_.at(layer);
  std::vector<int32_t> slots(ex->routing.dest_ranks.size());
  for (size_t i = 0; i < ex->routing.dest_ranks.size(); ++i) {
    slots[i] = slot_of[static_cast<size_t>(a.routed->topk_idx[i])];
    const int d = slots[i] / x.experts_per_rank_;
    ex->routing.dest_ranks[i] = d;
    ++ex->rows_to[static_cast<size_t>(d)];
  }
  PIPER_ASSIGN_OR_RETURN(comm::DispatchResult got, dispatch(a.routed->normed->data(), ex->routing));
  ex->rows_from.assign(got.rows_from.begin(), got.rows_from.end());
  int64_t rows = 0;
  for (size_t r : ex->rows_from) rows += static_cast<int64_t>(r);
  std::vector<size_t> first(static_cast<size_t>(p) + 1, 0);
  for (int d = 0; d < p; ++d) first[d + 1] = first[d] + ex->rows_to[d];
  std::vector<RowMeta> send(first[p]), recv(static_cast<size_t>(rows));
  for (size_t i = 0; i < ex->routing.dest_ranks.size(); ++i) {
    const int d = ex->routing.dest_ranks[i];
    send[first[d]++] = RowMeta{slots[i] - d * x.experts_per_rank_, a.routed->topk_w.data()[i]};
  }
  PIPER_RETURN_IF_ERROR(all_to_all(send.data(), scaled_bytes(ex->rows_to, sizeof(RowMeta)), recv.data(),
                                   scaled_bytes(ex->rows_from, sizeof(RowMeta))));
  auto rows_in = std::make_shared<EpRows>();
  rows_in->rows = tensor_from(got.rows.data(), rows, h, MemCategory::kActivations, core.allocator);
  rows_in->expert.resize(static_cast<size_t>(rows));
  rows_in->weight.resize(static_cast<size_t>(rows));
  for (size_t i = 0; i < recv.size(); ++i) {
    rows_in->expert[i] = recv[i].expert;
    rows_in->weight[i] = recv[i].weight;
  }
  ex->rows_received = rows;
  Activation out;
  out.hidden = a.hidden;
  out.routed = a.routed;
  out.ep = std::move(rows_in);
  std::lock_guard<std::mutex> lock(x.mu_);
  x.exchanges_[std::make_pair(layer, t.mb)] = std::move(ex);
  return out;
}

// combine F: the expert output rows back to their source, weighted and summed in slot order, plus the residual.
Result<Activation> ExpertParallel::Call::combine_forward(const Activation& a) {
  std::shared_ptr<EpExchange> ex;
  {
    std::lock_guard<std::mutex> lock(x.mu_);
    ex = x.exchanges_.at(std::make_pair(layer, t.mb));
  }
  if (!a.ep || !a.ep->rows || !a.hidden) return internal_error("'" + t.in->label + "': no expert output rows");
  const Tensor& rows = *a.ep->rows;
  PIPER_ASSIGN_OR_RETURN(std::vector<float> y,
                         combine({rows.data(), static_cast<size_t>(rows.numel())}, ex->routing,
                                 {ex->routed->topk_w.data(), static_cast<size_t>(ex->routed->topk_w.numel())}, *ex));
  auto hidden =
      std::make_shared<Tensor>(Tensor::zeros_or_die(a.hidden->shape(), MemCategory::kActivations, core.allocator));
  const float* xr = a.hidden->data();
  float* o = hidden->data();
  for (int64_t i = 0; i < hidden->numel(); ++i) o[i] = xr[i] + scale * y[static_cast<size_t>(i)];
  Activation out;
  out.hidden = std::move(hidden);
  return out;
}

// combine B: the output gradient (summed over consumers in edge order), times routed_scaling, dispatched like the
// tokens.
Result<Gradient> ExpertParallel::Call::combine_backward(const std::vector<Gradient>& grads, const EpExchange& ex) {
  Result<std::shared_ptr<const Tensor>> summed = sum_consumer_gradients(grads, ex.routing.num_tokens, h);
  if (!summed.ok()) return internal_error("'" + t.in->label + "': " + summed.status().message());
  std::shared_ptr<const Tensor> dout = std::move(summed).value();
  const float* dy = dout->data();
  Tensor scaled;
  if (scale != 1.0f) {
    scaled = dout->clone(MemCategory::kBuffers);
    for (int64_t i = 0; i < scaled.numel(); ++i) scaled[i] *= scale;
    dy = scaled.data();
  }
  PIPER_ASSIGN_OR_RETURN(comm::DispatchResult got, dispatch(dy, ex.routing, &ex));
  const int64_t rows = ex.rows_received;
  if (static_cast<int64_t>(got.rows.size()) != rows * h * static_cast<int64_t>(sizeof(float))) {
    return internal_error("'" + t.in->label + "' received another number of rows than its forward dispatch");
  }
  auto rows_in = std::make_shared<EpRows>();
  rows_in->rows = tensor_from(got.rows.data(), rows, h, MemCategory::kBuffers, core.allocator);
  Gradient out;
  out.dhidden = std::move(dout);
  out.ep = std::move(rows_in);
  return out;
}

// dispatch B: the rows' input gradients summed per token in slot order (unit weights), the routing-weight
// gradients back to their source.
Result<Gradient> ExpertParallel::Call::dispatch_backward(const std::vector<Gradient>& grads, const EpExchange& ex) {
  if (grads.size() != 1 || !grads[0].ep || !grads[0].ep->rows) {
    return internal_error("'" + t.in->label + "' expects the experts chunk's row gradients");
  }
  const int64_t tokens = ex.routing.num_tokens;
  const EpRows& g = *grads[0].ep;
  const std::vector<float> ones(static_cast<size_t>(tokens * k), 1.0f);
  PIPER_ASSIGN_OR_RETURN(std::vector<float> dhn,
                         combine({g.rows->data(), static_cast<size_t>(g.rows->numel())}, ex.routing, ones, ex));
  std::vector<float> back(static_cast<size_t>(tokens * k));
  PIPER_RETURN_IF_ERROR(all_to_all(g.dweight.data(), scaled_bytes(ex.rows_from, sizeof(float)), back.data(),
                                   scaled_bytes(ex.rows_to, sizeof(float))));
  auto dtopk_w = std::make_shared<Tensor>(Tensor::zeros_or_die({tokens, k}, MemCategory::kBuffers, core.allocator));
  std::vector<size_t> first(static_cast<size_t>(p) + 1, 0);
  for (int d = 0; d < p; ++d) first[d + 1] = first[d] + ex.rows_to[d];
  for (size_t i = 0; i < ex.routing.dest_ranks.size(); ++i) {
    dtopk_w->data()[i] = back[first[ex.routing.dest_ranks[i]]++];
  }
  Gradient out;
  out.dhidden = grads[0].dhidden;
  out.dnormed = tensor_from(dhn.data(), tokens, h, MemCategory::kBuffers, core.allocator);
  out.dtopk_w = std::move(dtopk_w);
  return out;
}

Result<std::shared_ptr<const Tensor>> sum_consumer_gradients(const std::vector<Gradient>& grads, int64_t tokens,
                                                             int64_t h) {
  if (grads.empty()) return internal_error("no consumer's gradient");
  for (const Gradient& g : grads) {
    if (!g.dhidden || g.dhidden->numel() != tokens * h) {
      return internal_error("a consumer's gradient is not [tokens, hidden]");
    }
  }
  if (grads.size() == 1) return grads[0].dhidden;
  auto sum = std::make_shared<Tensor>(grads[0].dhidden->clone(MemCategory::kBuffers));
  for (size_t i = 1; i < grads.size(); ++i) {
    for (int64_t j = 0; j < sum->numel(); ++j) sum->data()[j] += grads[i].dhidden->data()[j];
  }
  return std::shared_ptr<const Tensor>(std::move(sum));
}

Status ExpertParallel::run(const Task& t) {
  if (is_etp_exchange(*t.in)) return run_etp(t);
  const auto start = std::chrono::steady_clock::now();
  const Instruction& n = *t.in;
  Call call(*this, t, n.layer);
  const auto exchange_key = std::make_pair(n.layer, t.mb);
  if (!t.gradient) {
    PIPER_ASSIGN_OR_RETURN(Activation a, core_.take_message<Activation>(t, t.sources[0]));
    PIPER_ASSIGN_OR_RETURN(Activation out, is_dispatch(n) ? call.dispatch_forward(a) : call.combine_forward(a));
    core_.publish_message(t, std::move(out));
  } else {
    std::vector<Gradient> grads;
    for (ir::NodeId src : t.sources) {
      PIPER_ASSIGN_OR_RETURN(Gradient g, core_.take_message<Gradient>(t, src));
      grads.push_back(std::move(g));
    }
    std::shared_ptr<EpExchange> ex;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = exchanges_.find(exchange_key);
      if (it == exchanges_.end()) return internal_error("'" + t.in->label + "' runs before its forward dispatch");
      ex = it->second;
    }
    PIPER_ASSIGN_OR_RETURN(Gradient out,
                           is_dispatch(n) ? call.dispatch_backward(grads, *ex) : call.combine_backward(grads, *ex));
    if (is_dispatch(n)) {
      std::lock_guard<std::mutex> lock(mu_);
      exchanges_.erase(exchange_key);
    }
    core_.publish_message(t, std::move(out));
  }
  core_.add_seconds("a2a." + n.part_name() + (t.gradient ? ".B" : ".F"),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return ok_status();
}

Status ExpertParallel::serve_m2n(comm::Communicator* group) {
  has_experts_ = true;
  if (comm_ != nullptr && comm_ != group) return internal_error("executor: two ep groups on one rank");
  comm_ = group;
  ep_ = group->size();
  return ok_status();
}

Status ExpertParallel::prepare_norm() {
  // Every rank weights its microbatches' losses by 1 / (its microbatches): an expert that served the tokens of
  // the ep ranks of its group sums ep such objectives. Its gradient is their mean over the group (power of two
  // for the usual ep, so exact), as the data-parallel all-reduce makes the other chunks' the mean over dp.
  // Folded, the tensor ranks of a replica route its token slices to different expert groups and the reduction
  // over the plan's edp group (dp * tp / ep ranks, MeshInfo::expert_replicas) is a mean: times tp / ep it is the
  // sum over every rank of the stage divided by dp, the mean over the data-parallel replicas (powers of two for
  // the usual degrees, so exact). Without an edp reduction (dp * tp = ep) tp / ep = 1 / dp as well.
  // With sequence parallelism (any ep) likewise; with etp > 1 the plan's edp group has dp * tp / (ep * etp) ranks:
  // times tp / (ep * etp).
  if (comm_ == nullptr && !edp_without_ep_) return ok_status();
  const ir::MeshInfo& m = core_.plan->mesh;
  const float s = core_.plan->experts_reduce_over_edp()
                      ? static_cast<float>(m.tp) / static_cast<float>(ep_ * std::max(1, m.etp))
                      : 1.0f / static_cast<float>(ep_);
  for (const auto& chunk : core_.model->chunks()) {
    if (chunk->part() != Part::kExperts) continue;
    DataParallel::Shard* shard = core_.dp->shard(*chunk);
    if (shard != nullptr && shard->per_microbatch) {  // ZeRO-2/3 over edp: the gradient is its shard
      Tensor& g = shard->grad;
      for (int64_t i = 0; i < g.numel(); ++i) g.data()[i] *= s;
      continue;
    }
    for (Param& p : chunk->params()) {
      if (!p.trainable) continue;
      float* g = p.grad.data();
      for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] *= s;
    }
  }
  return ok_status();
}

std::optional<double> ExpertParallel::grad_sq(const Chunk& chunk) {
  if ((comm_ == nullptr && !edp_without_ep_) || chunk.part() != Part::kExperts) return std::nullopt;
  return owns_expert_norm_ ? Optimizer::grad_sq(chunk) : 0.0;
}

Status ExpertParallel::end_step(StepResult* result) {
  std::map<int, std::vector<int64_t>>* out = &result->expert_tokens;
  out->clear();
  if (!has_experts_) return ok_status();
  const int E = core_.model->dims().num_experts;
  const size_t L = static_cast<size_t>(core_.plan->num_layers);
  std::vector<int64_t> local(L * static_cast<size_t>(E), 0);
  for (const auto& chunk : core_.model->chunks()) {
    std::vector<int64_t> v = chunk->take_expert_tokens();
    if (v.empty() || chunk->layer() < 0 || static_cast<size_t>(chunk->layer()) >= L) continue;
    // Under expert parallelism the chunk counts by physical slot: back to logical experts.
    auto table = slot_expert_.find(chunk->layer());
    auto out_begin = local.begin() + static_cast<ptrdiff_t>(chunk->layer()) * E;
    if (comm_ == nullptr || table == slot_expert_.end()) {
      std::copy(v.begin(), v.end(), out_begin);
    } else {
      for (size_t s = 0; s < v.size(); ++s) out_begin[table->second[s]] = v[s];
    }
  }
  if (core_.dist != nullptr) {
    // Tokens per expert over the whole run: every rank's count of the rows its experts received, summed in rank
    // order. Without sequence parallelism tensor ranks see the same rows: only tp rank 0 counts; with it each
    // routes its own token slice.
    if (core_.dist->coord().tp != 0 && core_.tp->token_shards() == 1) std::fill(local.begin(), local.end(), 0);
    // With etp > 1 the ranks of an etp group count the same gathered rows: only its first rank counts.
    const int etp = std::max(1, core_.plan->mesh.etp);
    if (core_.dist->coord().tp % etp != 0) std::fill(local.begin(), local.end(), 0);
    auto all = std::make_shared<std::vector<int64_t>>(local.size() * static_cast<size_t>(core_.dist->world_size()));
    PIPER_ASSIGN_OR_RETURN(comm::Handle h,
                           core_.dist->ctl().all_gather(local.data(), all->data(), local.size() * sizeof(int64_t)));
    PIPER_RETURN_IF_ERROR(core_.wait_comm(core_.dist->ctl(), h, all, "expert load exchange"));
    std::fill(local.begin(), local.end(), 0);
    for (int r = 0; r < core_.dist->world_size(); ++r) {
      for (size_t i = 0; i < local.size(); ++i) local[i] += (*all)[static_cast<size_t>(r) * local.size() + i];
    }
  }
  for (int layer : moe_layers_) {
    auto begin = local.begin() + static_cast<ptrdiff_t>(layer) * E;
    (*out)[layer] = std::vector<int64_t>(begin, begin + E);
  }
  return ok_status();
}

namespace {
const std::map<int, std::vector<int>> kNoPlacement;
}  // namespace

const std::map<int, std::vector<int>>& ExpertParallel::placement() const {
  return comm_ == nullptr ? kNoPlacement : slot_expert_;
}

int ExpertParallel::experts_per_rank() const {
  return comm_ != nullptr ? experts_per_rank_ : core_.model->dims().num_experts;
}

Status ExpertParallel::check_placement(const std::map<int, std::vector<int>>& placement) const {
  if (comm_ == nullptr) {
    return invalid_argument(
        "expert placement: this run is not expert-parallel (ep=1); experts have no slots to "
        "move between ranks");
  }
  const int E = core_.model->dims().num_experts;
  for (const auto& [layer, slots] : placement) {
    if (!moe_layers_.count(layer)) {
      return invalid_argument("expert placement: layer " + std::to_string(layer) + " has no experts");
    }
    std::vector<char> seen(static_cast<size_t>(E), 0);
    bool ok = static_cast<int>(slots.size()) == E;
    for (int e : slots) {
      if (!ok) break;
      ok = e >= 0 && e < E && !seen[static_cast<size_t>(e)];
      if (ok) seen[static_cast<size_t>(e)] = 1;
    }
    if (!ok) {
      return invalid_argument("expert placement of layer " + std::to_string(layer) + ": " +
                              std::to_string(slots.size()) + " slots that are not a permutation of the " +
                              std::to_string(E) + " experts (each expert in exactly one slot)");
    }
  }
  return ok_status();
}

namespace {

// Everything that travels with an expert of a chunk: each parameter's value, gradient and AdamW moments, as
// [per, ...] tensors whose slot j is elements [j * n, (j + 1) * n).
struct ExpertParts {
  std::vector<std::pair<float*, int64_t>> parts;  // (slot 0 of the tensor, elements per slot)
  int64_t per_expert = 0;

  void pack(int slot, float* dst) const {
    for (const auto& [base, n] : parts) {
      std::memcpy(dst, base + static_cast<int64_t>(slot) * n, static_cast<size_t>(n) * sizeof(float));
      dst += n;
    }
  }
  void unpack(int slot, const float* src) const {
    for (const auto& [base, n] : parts) {
      std::memcpy(base + static_cast<int64_t>(slot) * n, src, static_cast<size_t>(n) * sizeof(float));
      src += n;
    }
  }
};

// The parts of `chunk` with `per` experts per rank. ZeRO-sharded (shard_shapes: per trainable parameter its whole
// shape): the moments (and with params_sharded the values) are the gathered whole tensors `whole` (kinds m, v,
// value); otherwise the optimizer's state in `moments`.
Result<ExpertParts> expert_parts(Chunk& chunk, int per, const std::map<std::string, Tensor*>& moments,
                                 const std::vector<Shape>* shard_shapes, bool params_sharded,
                                 std::vector<std::vector<std::vector<float>>>& whole) {
  ExpertParts out;
  size_t index = 0;  // of the trainable parameter
  for (Param& prm : chunk.params()) {
    if (!prm.trainable) {
      out.parts.emplace_back(prm.value.data(), prm.value.numel() / per);
      continue;
    }
    int64_t total = prm.value.numel();
    if (shard_shapes != nullptr) {
      total = 1;
      for (int64_t dim : (*shard_shapes)[index]) total *= dim;
    }
    const int64_t n = total / per;
    out.parts.emplace_back(shard_shapes != nullptr && params_sharded ? whole[2][index].data() : prm.value.data(), n);
    if (prm.grad.numel() == total) out.parts.emplace_back(prm.grad.data(), n);  // ZeRO-2/3: none between steps
    if (shard_shapes != nullptr) {
      out.parts.emplace_back(whole[0][index].data(), n);
      out.parts.emplace_back(whole[1][index].data(), n);
      ++index;
      continue;
    }
    ++index;
    for (const char* suffix : {".m", ".v"}) {
      auto it = moments.find(prm.name + suffix);
      if (it == moments.end() || it->second->numel() != prm.value.numel()) {
        return unimplemented("expert migration: the optimizer holds no whole state '" + prm.name + suffix +
                             "' to move with its expert");
      }
      out.parts.emplace_back(it->second->data(), n);
    }
  }
  for (const auto& part : out.parts) out.per_expert += part.second;
  return out;
}

// Moves one layer's experts over the ep group `c` from the slots of `old_slot` (expert -> slot) to those of `next`
// (slot -> expert), `per` slots per rank: the experts leaving this rank go in one all-to-all-v, in the order of
// their new slots (the receiver walks its new slots in the same order); shuffles inside this rank are copies.
Status move_experts(comm::Communicator& c, const std::vector<int>& old_slot, const std::vector<int>& next, int per,
                    const ExpertParts& parts, double timeout_s, int64_t* bytes_sent) {
  const int me = c.rank(), p = c.size();
  const size_t per_expert = static_cast<size_t>(parts.per_expert);
  std::vector<std::vector<float>> to(static_cast<size_t>(p));
  std::vector<std::pair<int, std::vector<float>>> stay;  // (new local slot, data)
  std::vector<size_t> send_bytes(static_cast<size_t>(p), 0), recv_bytes(static_cast<size_t>(p), 0);
  for (int s = 0; s < static_cast<int>(next.size()); ++s) {
    const int from = old_slot[static_cast<size_t>(next[static_cast<size_t>(s)])];
    const int src = from / per, dst = s / per;
    if (from == s) continue;
    if (src == me && dst == me) {
      stay.emplace_back(s - me * per, std::vector<float>(per_expert));
      parts.pack(from - me * per, stay.back().second.data());
    } else if (src == me) {
      std::vector<float>& buf = to[static_cast<size_t>(dst)];
      buf.resize(buf.size() + per_expert);
      parts.pack(from - me * per, buf.data() + buf.size() - per_expert);
    } else if (dst == me) {
      recv_bytes[static_cast<size_t>(src)] += per_expert * sizeof(float);
    }
  }
  std::vector<float> send;
  for (int d = 0; d < p; ++d) {
    send_bytes[static_cast<size_t>(d)] = to[static_cast<size_t>(d)].size() * sizeof(float);
    send.insert(send.end(), to[static_cast<size_t>(d)].begin(), to[static_cast<size_t>(d)].end());
    *bytes_sent += static_cast<int64_t>(send_bytes[static_cast<size_t>(d)]);
  }
  size_t total_in = 0;
  for (size_t b : recv_bytes) total_in += b;
  std::vector<float> recv(total_in / sizeof(float));
  fault_point("migrate");
  PIPER_RETURN_IF_ERROR(comm::pairwise_all_to_all_v(c, send.data(), send_bytes, recv.data(), recv_bytes, timeout_s));
  // Receives, per source rank in the order of this rank's new slots.
  std::vector<size_t> at(static_cast<size_t>(p) + 1, 0);
  for (int r = 0; r < p; ++r) at[r + 1] = at[r] + recv_bytes[static_cast<size_t>(r)] / sizeof(float);
  for (int s = me * per; s < (me + 1) * per; ++s) {
    const int from = old_slot[static_cast<size_t>(next[static_cast<size_t>(s)])];
    const int src = from / per;
    if (src == me) continue;
    parts.unpack(s - me * per, recv.data() + at[static_cast<size_t>(src)]);
    at[static_cast<size_t>(src)] += per_expert;
  }
  for (const auto& [slot, data] : stay) parts.unpack(slot, data.data());
  return ok_status();
}

}  // namespace

// The placement tables of `placement`'s layers: slot -> expert and its inverse.
void ExpertParallel::set_tables(const std::map<int, std::vector<int>>& placement) {
  for (const auto& [layer, next] : placement) {
    slot_expert_[layer] = next;
    std::vector<int>& inverse = expert_slot_[layer];
    for (size_t s = 0; s < next.size(); ++s) inverse[static_cast<size_t>(next[s])] = static_cast<int>(s);
  }
}

Status ExpertParallel::migrate_layer(int layer, const std::vector<int>& next,
                                     const std::map<std::string, Tensor*>& moments, ExpertMigration* out) {
  const int per = experts_per_rank_;
  const std::vector<int>& old_slot = expert_slot_.at(layer);
  for (size_t s = 0; s < next.size(); ++s) {
    if (old_slot[static_cast<size_t>(next[s])] / per != static_cast<int>(s) / per) ++out->moved_experts;
  }
  Chunk* chunk = core_.model->find(layer, Part::kExperts);
  if (chunk == nullptr) return ok_status();  // another pipeline stage's layer: only the table changes here
  // A ZeRO-sharded chunk moves whole experts too: its shard group's moments (and ZeRO-3 values) are gathered
  // into whole tensors first and each rank keeps its shard of the moved ones after.
  DataParallel::Shard* sh = core_.dp->shard(*chunk);
  std::vector<std::vector<std::vector<float>>> whole;
  if (sh != nullptr) {
    PIPER_ASSIGN_OR_RETURN(whole, core_.dp->gather_shard_state(*chunk, *sh));
  }
  PIPER_ASSIGN_OR_RETURN(ExpertParts parts, expert_parts(*chunk, per, moments, sh != nullptr ? &sh->shapes : nullptr,
                                                         sh != nullptr && sh->params_sharded, whole));
  Status st = move_experts(*comm_, old_slot, next, per, parts, core_.dist->timeout_s(), &out->bytes_sent);
  if (!st.ok()) {
    return st.with_context("expert migration of layer " + std::to_string(layer) + " over the ep group (rank " +
                           std::to_string(core_.dist->rank()) + ")");
  }
  if (sh != nullptr) core_.dp->scatter_shard_state(*chunk, *sh, whole);
  return ok_status();
}

Result<ExpertMigration> ExpertParallel::migrate(const std::map<int, std::vector<int>>& placement) {
  PIPER_RETURN_IF_ERROR(check_placement(placement));
  const auto start = std::chrono::steady_clock::now();
  ExpertMigration out;
  std::map<std::string, Tensor*> moments;
  for (const Optimizer::StateTensor& st : core_.optimizer->state()) moments[st.name] = st.tensor;
  for (const auto& [layer, next] : placement) {
    if (next == slot_expert_.at(layer)) continue;
    PIPER_RETURN_IF_ERROR(migrate_layer(layer, next, moments, &out));
  }
  // Every rank switches its tables at the same point (between the same two steps).
  set_tables(placement);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

ExpertParallel::ExpertParallel(Core& core) : Handler(core) {}
ExpertParallel::~ExpertParallel() = default;

}  // namespace piper::runtime::detail

namespace piper::runtime {

const std::map<int, std::vector<int>>& Executor::expert_placement() const { return impl_->ep->placement(); }

int Executor::experts_per_rank() const { return impl_->ep->experts_per_rank(); }

Status Executor::set_expert_placement(const std::map<int, std::vector<int>>& placement) {
  PIPER_RETURN_IF_ERROR(impl_->ep->check_placement(placement));
  impl_->ep->set_tables(placement);
  return ok_status();
}

Result<ExpertMigration> Executor::migrate_experts(const std::map<int, std::vector<int>>& placement) {
  // Experts move with their whole parameters: those the plan gathers at the next step's start first.
  PIPER_RETURN_IF_ERROR(complete_param_gathers());
  return impl_->ep->migrate(placement);
}

}  // namespace piper::runtime
