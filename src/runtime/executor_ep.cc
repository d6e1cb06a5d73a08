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
#include "piper/runtime/executor_impl.h"

namespace piper::runtime {

using compile::Instruction;
using detail::Task;

namespace detail {

struct EpExchange {
  comm::MoeRouting routing;                  // group rank of each (token, slot)
  std::vector<size_t> rows_to;               // rows sent to each rank
  std::vector<size_t> rows_from;             // rows received from each rank
  std::shared_ptr<const Routed> routed;      // the source's routing (weights for the combine)
  std::shared_ptr<const EpRows> dispatched;  // experts and weights of the received rows
};

struct EpState {
  int ep = 1;  // group size (1: no expert parallelism, only the load count)
  int experts_per_rank = 0;
  bool halo = false;
  comm::Communicator* comm = nullptr;
  std::unique_ptr<comm::HaloContext> halo_context;
  std::set<int> moe_layers;  // layers with an experts chunk in the plan (every rank: same plan)
  // Expert parallelism: per MoE layer the logical expert in each physical slot, and its inverse.
  std::map<int, std::vector<int>> slot_expert, expert_slot;
  std::map<std::pair<int, int>, std::shared_ptr<EpExchange>> exchanges;  // (layer, mb); guarded by Impl::mu
};

}  // namespace detail

namespace {

bool is_dispatch(const Instruction& n) { return n.part == "dispatch"; }

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

Status Executor::Impl::ep_setup() {
  for (const compile::Program& prog : plan->templates) {
    for (const compile::Stream& st : prog.streams) {
      for (const Instruction& n : st.instrs) {
        if (n.op != compile::OpKind::kCompute || n.part != "experts") continue;
        if (ep == nullptr) ep = std::make_shared<detail::EpState>();
        ep->moe_layers.insert(n.layer);
      }
    }
  }
  if (ep == nullptr || ep->comm == nullptr) return ok_status();
  // Each expert counts once in the global norm: on the first expert-data-parallel replica (the first ep block of
  // dp coordinates), where the ep ranks hold distinct experts.
  const compile::RankCoord& c = dist->coord();
  for (const auto& chunk : model->chunks()) {
    if (chunk->part() == "experts") norm_owner[chunk.get()] = c.tp == 0 && c.dp / ep->ep == 0;
  }
  const ChunkDims& d = model->dims();
  if (d.local_experts() * ep->ep != d.num_experts) {
    return invalid_argument("executor: the plan shards " + std::to_string(d.num_experts) + " experts over ep=" +
                            std::to_string(ep->ep) + " but the model holds " + std::to_string(d.local_experts()) +
                            " per rank; build it with ModelOptions expert_ranks=" + std::to_string(ep->ep));
  }
  ep->experts_per_rank = d.local_experts();
  for (int layer : ep->moe_layers) {
    std::vector<int> identity(static_cast<size_t>(d.num_experts));
    std::iota(identity.begin(), identity.end(), 0);
    ep->slot_expert[layer] = identity;
    ep->expert_slot[layer] = identity;
  }
  if (ep->halo) {
    PIPER_ASSIGN_OR_RETURN(std::vector<int> members, dist->plan().group_ranks(dist->rank(), "ep"));
    const int world_rpn = dist->ranks_per_node();
    Result<int> rpn = group_ranks_per_node(members, world_rpn);
    if (!rpn.ok()) {
      return invalid_argument("executor: a2a=halo on " + std::to_string(world_rpn) +
                              " ranks per node: " + rpn.status().message());
    }
    // One lane per rank: every rank is its own proxy (a NIC per GPU, DGX rails), the layout that measured fastest
    // on the emulated two nodes (docs/comm.md: one lane is one TCP stream per node pair).
    PIPER_ASSIGN_OR_RETURN(comm::NodeTopology topo, comm::NodeTopology::create(ep->ep, *rpn, *rpn));
    PIPER_ASSIGN_OR_RETURN(ep->halo_context, comm::HaloContext::create(*ep->comm, topo));
  }
  return ok_status();
}

Status Executor::Impl::resolve_ep(const Instruction& in, Task* t) {
  const Instruction& n = in;
  if (in.group != "ep" || (n.part != "dispatch" && n.part != "combine")) {
    return unimplemented("executor: '" + in.label + "' is an all_to_all over '" + in.group + "' (" + n.part +
                         "); the runtime executes the expert dispatch and combine over ep only");
  }
  if (in.algorithm != "flat" && in.algorithm != "halo") {
    return unimplemented("executor: '" + in.label + "' uses all-to-all algorithm '" + in.algorithm +
                         "'; the runtime runs a2a=flat and a2a=halo");
  }
  if (ep == nullptr) ep = std::make_shared<detail::EpState>();
  t->comm = dist->group("ep");
  if (t->comm == nullptr) return internal_error("executor: '" + in.label + "' runs over ep, which has degree 1");
  if (ep->comm != nullptr && ep->comm != t->comm) return internal_error("executor: two ep groups on one rank");
  ep->comm = t->comm;
  ep->ep = t->comm->size();
  ep->halo = ep->halo || in.algorithm == "halo";
  t->degree = t->comm->size();
  t->pass = n.pass;
  t->mb = std::max(0, n.mb);
  t->key = detail::StashKey{n.layer, n.part, t->mb};
  t->gradient = n.pass != ir::Pass::kF;
  for (ir::NodeId src : in.inputs) {
    // Under tp x ep the combine's backward reads the next split chunk's input gradient from its sequence
    // reduce-scatter: this rank's token slice, the rows its forward combined (executor_tp.cc).
    const ir::NodeKind k = instr_of(src).comm;
    if (k != ir::NodeKind::kChunk && k != ir::NodeKind::kRecv && !detail::is_tp_exchange(instr_of(src))) {
      return unimplemented("executor: '" + in.label + "' reads from '" + name_of(src) +
                           "'; an expert all-to-all must be fed by a chunk, a pipeline receive or a tensor-parallel "
                           "exchange");
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

Status Executor::Impl::ep_exchange(const Task& t) {
  const auto start = std::chrono::steady_clock::now();
  const Instruction& n = *t.in;
  const int64_t h = model->dims().hidden;
  const int k = model->dims().top_k;
  const float scale = static_cast<float>(model->dims().routed_scaling);
  const double timeout_s = dist->timeout_s();
  comm::Communicator& c = *t.comm;
  const int p = c.size();
  const auto exchange_key = std::make_pair(n.layer, t.mb);
  // The flat or HALO version of each exchange.
  auto dispatch = [&](const float* tokens, const comm::MoeRouting& r) -> Result<comm::DispatchResult> {
    if (ep->halo) return comm::halo_dispatch(*ep->halo_context, tokens, h * sizeof(float), r, timeout_s);
    return comm::flat_dispatch(c, tokens, h * sizeof(float), r, comm::FlatDispatchKind::kPairwise, timeout_s);
  };
  auto combine = [&](std::span<const float> rows, const comm::MoeRouting& r,
                     std::span<const float> w) -> Result<std::vector<float>> {
    if (ep->halo) return comm::halo_combine(*ep->halo_context, rows, h, r, w, timeout_s);
    return comm::flat_combine(c, rows, h, r, w, comm::FlatDispatchKind::kPairwise, timeout_s);
  };
  auto all_to_all = [&](const void* send, std::span<const size_t> send_bytes, void* recv,
                        std::span<const size_t> recv_bytes) -> Status {
    if (ep->halo) return comm::halo_all_to_all_v(*ep->halo_context, send, send_bytes, recv, recv_bytes, timeout_s);
    return comm::pairwise_all_to_all_v(c, send, send_bytes, recv, recv_bytes, timeout_s);
  };
  auto scaled_bytes = [](const std::vector<size_t>& rows, size_t b) {
    std::vector<size_t> out(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * b;
    return out;
  };

  if (!t.gradient) {
    Activation a;
    {
      std::lock_guard<std::mutex> lock(mu);
      std::optional<Activation> taken = detail::take_pending(fwd, t.sources[0]);
      if (!taken) {
        return internal_error("input of '" + t.in->label + "' from '" + name_of(t.sources[0]) +
                              "' is not available: the plan runs it before its producer");
      }
      a = std::move(*taken);
    }
    Activation out;
    if (is_dispatch(n)) {
      if (!a.routed || !a.hidden) return internal_error("'" + t.in->label + "': the router sent no routing");
      auto x = std::make_shared<detail::EpExchange>();
      x->routed = a.routed;
      const int64_t tokens = a.hidden->numel() / h;
      x->routing.num_tokens = tokens;
      x->routing.top_k = k;
      x->routing.dest_ranks.resize(static_cast<size_t>(tokens * k));
      x->rows_to.assign(static_cast<size_t>(p), 0);
      // The physical slot of each routed (token, slot): its rank and local expert there.
      const std::vector<int>& slot_of = ep->expert_slot.at(n.layer);
      std::vector<int32_t> slots(x->routing.dest_ranks.size());
      for (size_t i = 0; i < x->routing.dest_ranks.size(); ++i) {
        slots[i] = slot_of[static_cast<size_t>(a.routed->topk_idx[i])];
        const int d = slots[i] / ep->experts_per_rank;
        x->routing.dest_ranks[i] = d;
        ++x->rows_to[static_cast<size_t>(d)];
      }
      PIPER_ASSIGN_OR_RETURN(comm::DispatchResult got, dispatch(a.routed->normed->data(), x->routing));
      x->rows_from.assign(got.rows_from.begin(), got.rows_from.end());
      int64_t rows = 0;
      for (size_t r : x->rows_from) rows += static_cast<int64_t>(r);
      // Each row's local expert and routing weight, in the dispatch's (source, token, slot) order.
      struct Meta {
        int32_t expert;
        float weight;
      };
      std::vector<size_t> first(static_cast<size_t>(p) + 1, 0);
      for (int d = 0; d < p; ++d) first[d + 1] = first[d] + x->rows_to[d];
      std::vector<Meta> send(first[p]), recv(static_cast<size_t>(rows));
      for (size_t i = 0; i < x->routing.dest_ranks.size(); ++i) {
        const int d = x->routing.dest_ranks[i];
        send[first[d]++] = Meta{slots[i] - d * ep->experts_per_rank, a.routed->topk_w.data()[i]};
      }
      PIPER_RETURN_IF_ERROR(all_to_all(send.data(), scaled_bytes(x->rows_to, sizeof(Meta)), recv.data(),
                                       scaled_bytes(x->rows_from, sizeof(Meta))));
      auto rows_in = std::make_shared<EpRows>();
      rows_in->rows = tensor_from(got.rows.data(), rows, h, MemCategory::kActivations, allocator);
      rows_in->expert.resize(static_cast<size_t>(rows));
      rows_in->weight.resize(static_cast<size_t>(rows));
      for (size_t i = 0; i < recv.size(); ++i) {
        rows_in->expert[i] = recv[i].expert;
        rows_in->weight[i] = recv[i].weight;
      }
      x->dispatched = rows_in;
      out.hidden = a.hidden;
      out.routed = a.routed;
      out.ep = std::move(rows_in);
      std::lock_guard<std::mutex> lock(mu);
      ep->exchanges[exchange_key] = std::move(x);
    } else {
      std::shared_ptr<detail::EpExchange> x;
      {
        std::lock_guard<std::mutex> lock(mu);
        x = ep->exchanges.at(exchange_key);
      }
      if (!a.ep || !a.ep->rows || !a.hidden) return internal_error("'" + t.in->label + "': no expert output rows");
      const Tensor& rows = *a.ep->rows;
      PIPER_ASSIGN_OR_RETURN(std::vector<float> y,
                             combine({rows.data(), static_cast<size_t>(rows.numel())}, x->routing,
                                     {x->routed->topk_w.data(), static_cast<size_t>(x->routed->topk_w.numel())}));
      auto hidden =
          std::make_shared<Tensor>(Tensor::zeros_or_die(a.hidden->shape(), MemCategory::kActivations, allocator));
      const float* xr = a.hidden->data();
      float* o = hidden->data();
      for (int64_t i = 0; i < hidden->numel(); ++i) o[i] = xr[i] + scale * y[static_cast<size_t>(i)];
      out.hidden = std::move(hidden);
    }
    std::lock_guard<std::mutex> lock(mu);
    fwd[t.in->node] = detail::Pending<Activation>{std::move(out), t.consumers};
    task_seconds["a2a." + n.part + ".F"] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return ok_status();
  }

  std::vector<Gradient> grads;
  std::shared_ptr<detail::EpExchange> x;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (ir::NodeId src : t.sources) {
      std::optional<Gradient> g = detail::take_pending(bwd, src);
      if (!g) {
        return internal_error("gradient of '" + t.in->label + "' from '" + name_of(src) +
                              "' is not available: the plan runs it before its producer");
      }
      grads.push_back(std::move(*g));
    }
    auto it = ep->exchanges.find(exchange_key);
    if (it == ep->exchanges.end()) return internal_error("'" + t.in->label + "' runs before its forward dispatch");
    x = it->second;
  }
  Gradient out;
  const int64_t tokens = x->routing.num_tokens;
  if (!is_dispatch(n)) {
    // combine B: the output gradient (summed over consumers in edge order), dispatched like the tokens.
    for (const Gradient& g : grads) {
      if (!g.dhidden || g.dhidden->numel() != tokens * h) {
        return internal_error("'" + t.in->label + "': a consumer's gradient is not [tokens, hidden]");
      }
    }
    std::shared_ptr<const Tensor> dout = grads[0].dhidden;
    if (grads.size() > 1) {
      auto sum = std::make_shared<Tensor>(grads[0].dhidden->clone(MemCategory::kBuffers));
      for (size_t i = 1; i < grads.size(); ++i) {
        for (int64_t j = 0; j < sum->numel(); ++j) sum->data()[j] += grads[i].dhidden->data()[j];
      }
      dout = std::move(sum);
    }
    const float* dy = dout->data();
    Tensor scaled;
    if (scale != 1.0f) {
      scaled = dout->clone(MemCategory::kBuffers);
      for (int64_t i = 0; i < scaled.numel(); ++i) scaled[i] *= scale;
      dy = scaled.data();
    }
    PIPER_ASSIGN_OR_RETURN(comm::DispatchResult got, dispatch(dy, x->routing));
    const int64_t rows = static_cast<int64_t>(x->dispatched->expert.size());
    if (static_cast<int64_t>(got.rows.size()) != rows * h * static_cast<int64_t>(sizeof(float))) {
      return internal_error("'" + t.in->label + "' received another number of rows than its forward dispatch");
    }
    auto rows_in = std::make_shared<EpRows>();
    rows_in->rows = tensor_from(got.rows.data(), rows, h, MemCategory::kBuffers, allocator);
    out.dhidden = std::move(dout);
    out.ep = std::move(rows_in);
  } else {
    // dispatch B: rows' input gradients summed per token in slot order (unit weights), weight gradients back.
    if (grads.size() != 1 || !grads[0].ep || !grads[0].ep->rows) {
      return internal_error("'" + t.in->label + "' expects the experts chunk's row gradients");
    }
    const EpRows& g = *grads[0].ep;
    const std::vector<float> ones(static_cast<size_t>(tokens * k), 1.0f);
    PIPER_ASSIGN_OR_RETURN(std::vector<float> dhn,
                           combine({g.rows->data(), static_cast<size_t>(g.rows->numel())}, x->routing, ones));
    std::vector<float> back(static_cast<size_t>(tokens * k));
    PIPER_RETURN_IF_ERROR(all_to_all(g.dweight.data(), scaled_bytes(x->rows_from, sizeof(float)), back.data(),
                                     scaled_bytes(x->rows_to, sizeof(float))));
    auto dtopk_w = std::make_shared<Tensor>(Tensor::zeros_or_die({tokens, k}, MemCategory::kBuffers, allocator));
    std::vector<size_t> first(static_cast<size_t>(p) + 1, 0);
    for (int d = 0; d < p; ++d) first[d + 1] = first[d] + x->rows_to[d];
    for (size_t i = 0; i < x->routing.dest_ranks.size(); ++i) {
      dtopk_w->data()[i] = back[first[x->routing.dest_ranks[i]]++];
    }
    out.dhidden = grads[0].dhidden;
    out.dnormed = tensor_from(dhn.data(), tokens, h, MemCategory::kBuffers, allocator);
    out.dtopk_w = std::move(dtopk_w);
  }
  std::lock_guard<std::mutex> lock(mu);
  if (is_dispatch(n)) ep->exchanges.erase(exchange_key);
  bwd[t.in->node] = detail::Pending<Gradient>{std::move(out), t.consumers};
  task_seconds["a2a." + n.part + ".B"] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return ok_status();
}

Status Executor::Impl::ep_serve_m2n(comm::Communicator* group) {
  if (ep == nullptr) ep = std::make_shared<detail::EpState>();
  if (ep->comm != nullptr && ep->comm != group) return internal_error("executor: two ep groups on one rank");
  ep->comm = group;
  ep->ep = group->size();
  return ok_status();
}

void Executor::Impl::ep_scale_grads() {
  // Every rank weights its microbatches' losses by 1 / (its microbatches): an expert that served the tokens of
  // the ep ranks of its group sums ep such objectives. Its gradient is their mean over the group (power of two
  // for the usual ep, so exact), as the data-parallel all-reduce makes the other chunks' the mean over dp.
  if (ep == nullptr || ep->comm == nullptr) return;
  const float s = 1.0f / static_cast<float>(ep->ep);
  for (const auto& chunk : model->chunks()) {
    if (chunk->part() != "experts") continue;
    auto shard = shards.find(chunk.get());
    if (shard != shards.end() && shard->second.per_microbatch) {  // ZeRO-2/3 over edp: the gradient is its shard
      Tensor& g = shard->second.grad;
      for (int64_t i = 0; i < g.numel(); ++i) g.data()[i] *= s;
      continue;
    }
    for (Param& p : chunk->params()) {
      if (!p.trainable) continue;
      float* g = p.grad.data();
      for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] *= s;
    }
  }
}

Status Executor::Impl::collect_expert_tokens(std::map<int, std::vector<int64_t>>* out) {
  out->clear();
  if (ep == nullptr) return ok_status();
  const int E = model->dims().num_experts;
  const size_t L = static_cast<size_t>(plan->num_layers);
  std::vector<int64_t> local(L * static_cast<size_t>(E), 0);
  for (const auto& chunk : model->chunks()) {
    std::vector<int64_t> v = chunk->take_expert_tokens();
    if (v.empty() || chunk->layer() < 0 || static_cast<size_t>(chunk->layer()) >= L) continue;
    // Under expert parallelism the chunk counts by physical slot: back to logical experts.
    auto table = ep->slot_expert.find(chunk->layer());
    auto out_begin = local.begin() + static_cast<ptrdiff_t>(chunk->layer()) * E;
    if (ep->comm == nullptr || table == ep->slot_expert.end()) {
      std::copy(v.begin(), v.end(), out_begin);
    } else {
      for (size_t s = 0; s < v.size(); ++s) out_begin[table->second[s]] = v[s];
    }
  }
  if (dist != nullptr) {
    // Tokens per expert over the whole run: every rank's count of the rows its experts received (tensor ranks
    // see the same rows: only tp rank 0 counts), summed in rank order.
    if (dist->coord().tp != 0) std::fill(local.begin(), local.end(), 0);
    auto all = std::make_shared<std::vector<int64_t>>(local.size() * static_cast<size_t>(dist->world_size()));
    PIPER_ASSIGN_OR_RETURN(comm::Handle h,
                           dist->ctl().all_gather(local.data(), all->data(), local.size() * sizeof(int64_t)));
    PIPER_RETURN_IF_ERROR(wait_comm(dist->ctl(), h, all, "expert load exchange"));
    std::fill(local.begin(), local.end(), 0);
    for (int r = 0; r < dist->world_size(); ++r) {
      for (size_t i = 0; i < local.size(); ++i) local[i] += (*all)[static_cast<size_t>(r) * local.size() + i];
    }
  }
  for (int layer : ep->moe_layers) {
    auto begin = local.begin() + static_cast<ptrdiff_t>(layer) * E;
    (*out)[layer] = std::vector<int64_t>(begin, begin + E);
  }
  return ok_status();
}

const std::map<int, std::vector<int>> Executor::Impl::kNoPlacement;

Status Executor::Impl::check_expert_placement(const std::map<int, std::vector<int>>& placement) const {
  if (ep == nullptr || ep->comm == nullptr) {
    return invalid_argument(
        "expert placement: this run is not expert-parallel (ep=1); experts have no slots to "
        "move between ranks");
  }
  const int E = model->dims().num_experts;
  for (const auto& [layer, slots] : placement) {
    if (!ep->moe_layers.count(layer)) {
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

Result<ExpertMigration> Executor::Impl::ep_migrate(const std::map<int, std::vector<int>>& placement) {
  PIPER_RETURN_IF_ERROR(check_expert_placement(placement));
  const auto start = std::chrono::steady_clock::now();
  ExpertMigration out;
  comm::Communicator& c = *ep->comm;
  const int me = c.rank(), p = c.size(), per = ep->experts_per_rank;
  std::map<std::string, Tensor*> moments;
  for (const Optimizer::StateTensor& st : optimizer->state()) moments[st.name] = st.tensor;
  for (const auto& [layer, next] : placement) {
    const std::vector<int>& now = ep->slot_expert.at(layer);
    if (next == now) continue;
    const std::vector<int>& old_slot = ep->expert_slot.at(layer);
    for (size_t s = 0; s < next.size(); ++s) {
      if (old_slot[static_cast<size_t>(next[s])] / per != static_cast<int>(s) / per) ++out.moved_experts;
    }
    Chunk* chunk = model->find(layer, "experts");
    if (chunk == nullptr) continue;  // another pipeline stage's layer: only the table changes here
    // A ZeRO-sharded chunk moves whole experts too: its shard group's moments (and ZeRO-3 values) are gathered
    // into whole tensors first and each rank keeps its shard of the moved ones after.
    auto shard = shards.find(chunk);
    Shard* sh = shard == shards.end() ? nullptr : &shard->second;
    std::vector<std::vector<std::vector<float>>> whole;
    if (sh != nullptr) {
      PIPER_ASSIGN_OR_RETURN(whole, gather_shard_state(*chunk, *sh));
    }
    // Everything that travels with an expert: each parameter's value, gradient and AdamW moments, as
    // [per, ...] tensors whose slot j is elements [j * n, (j + 1) * n).
    std::vector<std::pair<float*, int64_t>> parts;  // (slot 0 of the tensor, elements per slot)
    size_t index = 0;                               // of the trainable parameter
    for (Param& prm : chunk->params()) {
      if (!prm.trainable) {
        parts.emplace_back(prm.value.data(), prm.value.numel() / per);
        continue;
      }
      int64_t total = prm.value.numel();
      if (sh != nullptr) {
        total = 1;
        for (int64_t dim : sh->shapes[index]) total *= dim;
      }
      const int64_t n = total / per;
      parts.emplace_back(sh != nullptr && sh->params_sharded ? whole[2][index].data() : prm.value.data(), n);
      if (prm.grad.numel() == total) parts.emplace_back(prm.grad.data(), n);  // ZeRO-2/3: none between steps
      if (sh != nullptr) {
        parts.emplace_back(whole[0][index].data(), n);
        parts.emplace_back(whole[1][index].data(), n);
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
        parts.emplace_back(it->second->data(), n);
      }
    }
    int64_t per_expert = 0;
    for (const auto& part : parts) per_expert += part.second;
    auto pack = [&](int slot, float* dst) {
      for (const auto& [base, n] : parts) {
        std::memcpy(dst, base + static_cast<int64_t>(slot) * n, static_cast<size_t>(n) * sizeof(float));
        dst += n;
      }
    };
    auto unpack = [&](int slot, const float* src) {
      for (const auto& [base, n] : parts) {
        std::memcpy(base + static_cast<int64_t>(slot) * n, src, static_cast<size_t>(n) * sizeof(float));
        src += n;
      }
    };
    // Sends: the experts in this rank's old slots whose new slot is elsewhere, in the order of the new slots
    // (the receiver walks its new slots in the same order). Slot shuffles inside this rank go through `stay`.
    std::vector<std::vector<float>> to(static_cast<size_t>(p));
    std::vector<std::pair<int, std::vector<float>>> stay;  // (new local slot, data)
    std::vector<size_t> send_bytes(static_cast<size_t>(p), 0), recv_bytes(static_cast<size_t>(p), 0);
    for (int s = 0; s < static_cast<int>(next.size()); ++s) {
      const int from = old_slot[static_cast<size_t>(next[static_cast<size_t>(s)])];
      const int src = from / per, dst = s / per;
      if (from == s) continue;
      if (src == me && dst == me) {
        stay.emplace_back(s - me * per, std::vector<float>(static_cast<size_t>(per_expert)));
        pack(from - me * per, stay.back().second.data());
      } else if (src == me) {
        std::vector<float>& buf = to[static_cast<size_t>(dst)];
        buf.resize(buf.size() + static_cast<size_t>(per_expert));
        pack(from - me * per, buf.data() + buf.size() - static_cast<size_t>(per_expert));
      } else if (dst == me) {
        recv_bytes[static_cast<size_t>(src)] += static_cast<size_t>(per_expert) * sizeof(float);
      }
    }
    std::vector<float> send;
    for (int d = 0; d < p; ++d) {
      send_bytes[static_cast<size_t>(d)] = to[static_cast<size_t>(d)].size() * sizeof(float);
      send.insert(send.end(), to[static_cast<size_t>(d)].begin(), to[static_cast<size_t>(d)].end());
      out.bytes_sent += static_cast<int64_t>(send_bytes[static_cast<size_t>(d)]);
    }
    size_t total_in = 0;
    for (size_t b : recv_bytes) total_in += b;
    std::vector<float> recv(total_in / sizeof(float));
    fault_point("migrate");
    Status st = comm::pairwise_all_to_all_v(c, send.data(), send_bytes, recv.data(), recv_bytes, dist->timeout_s());
    if (!st.ok()) {
      return st.with_context("expert migration of layer " + std::to_string(layer) + " over the ep group (rank " +
                             std::to_string(dist->rank()) + ")");
    }
    // Receives, per source rank in the order of this rank's new slots.
    std::vector<size_t> at(static_cast<size_t>(p) + 1, 0);
    for (int r = 0; r < p; ++r) at[r + 1] = at[r] + recv_bytes[static_cast<size_t>(r)] / sizeof(float);
    for (int s = me * per; s < (me + 1) * per; ++s) {
      const int from = old_slot[static_cast<size_t>(next[static_cast<size_t>(s)])];
      const int src = from / per;
      if (src == me) continue;
      unpack(s - me * per, recv.data() + at[static_cast<size_t>(src)]);
      at[static_cast<size_t>(src)] += static_cast<size_t>(per_expert);
    }
    for (const auto& [slot, data] : stay) unpack(slot, data.data());
    if (sh != nullptr) scatter_shard_state(*chunk, *sh, whole);
  }
  // Every rank switches its tables at the same point (between the same two steps).
  for (const auto& [layer, next] : placement) {
    ep->slot_expert[layer] = next;
    std::vector<int>& inverse = ep->expert_slot[layer];
    for (size_t s = 0; s < next.size(); ++s) inverse[static_cast<size_t>(next[s])] = static_cast<int>(s);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

Result<std::vector<std::vector<std::vector<float>>>> Executor::Impl::gather_shard_state(Chunk& chunk,
                                                                                      const Shard& sh) {
  if (sh.group == nullptr) return internal_error("expert migration: " + chunk.name() + " has no shard group");
  std::map<std::string, Tensor*> moments;
  for (const Optimizer::StateTensor& st : optimizer->state()) moments[st.name] = st.tensor;
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
    Status st = sh.group->wait(h, dist->timeout_s());
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

void Executor::Impl::scatter_shard_state(Chunk& chunk, Shard& sh,
                                         const std::vector<std::vector<std::vector<float>>>& whole) {
  std::map<std::string, Tensor*> moments;
  for (const Optimizer::StateTensor& st : optimizer->state()) moments[st.name] = st.tensor;
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

const std::map<int, std::vector<int>>& Executor::expert_placement() const {
  if (impl_->ep == nullptr || impl_->ep->comm == nullptr) return Impl::kNoPlacement;
  return impl_->ep->slot_expert;
}

int Executor::experts_per_rank() const {
  return impl_->ep != nullptr && impl_->ep->comm != nullptr ? impl_->ep->experts_per_rank
                                                            : impl_->model->dims().num_experts;
}

Status Executor::set_expert_placement(const std::map<int, std::vector<int>>& placement) {
  PIPER_RETURN_IF_ERROR(impl_->check_expert_placement(placement));
  for (const auto& [layer, next] : placement) {
    impl_->ep->slot_expert[layer] = next;
    std::vector<int>& inverse = impl_->ep->expert_slot[layer];
    for (size_t s = 0; s < next.size(); ++s) inverse[static_cast<size_t>(next[s])] = static_cast<int>(s);
  }
  return ok_status();
}

Result<ExpertMigration> Executor::migrate_experts(const std::map<int, std::vector<int>>& placement) {
  return impl_->ep_migrate(placement);
}

}  // namespace piper::runtime
