// Expert tensor parallelism in the executor (ir::MeshInfo::etp > 1, Megatron's --expert-tensor-parallel-size): the
// ranks of an etp group hold slices of the same experts (model/chunks/tp_slice.h: make_etp_slice) and run them on
// the rows all of them received from their dispatches. Instructions over the plan's `etp` group:
//   etp_ag F  the dispatched rows (and each row's local expert and weight) all-gathered in group-rank order
//   etp_rs F  the experts' partial output rows summed over the group; each rank keeps its own rows
//   etp_ag B  the combine's row gradients all-gathered like the forward rows
//   etp_rs B  the partial input-row gradients and routing-weight gradients summed; each rank keeps its own
// Row counts differ between ranks: the forward gather exchanges them first and they are kept per (layer,
// microbatch) until the backward reduce-scatter; the buffers are padded to the largest count.
// Without expert parallelism (ep = 1, Megatron's expert_model_parallel_size 1) no all-to-all surrounds them: each
// rank's rows are its own tokens' (token, slot) pairs, and the exchanges do the dispatch and combine in place
// (local_dispatch below, with the experts chunk's permute and unpermute kernels over the rows in (token, slot)
// order; the rank holds every expert, so a row's local expert is its logical one).
#include <algorithm>
#include <cstring>

#include "piper/kernels/cpu/ops.h"
#include "piper/runtime/exec/executor_handlers.h"

namespace piper::runtime::detail {

using compile::Instruction;

bool is_etp_exchange(const Instruction& in) {
  return in.role == compile::CommRole::kEtpGather || in.role == compile::CommRole::kEtpScatter;
}

Status ExpertParallel::resolve_etp(const Instruction& in, Task* t) {
  t->comm = core_.dist->group("etp");
  if (in.group != "etp" || t->comm == nullptr) {
    return internal_error("executor: '" + in.label + "' runs over '" + in.group + "', but this rank has no etp group");
  }
  t->degree = t->comm->size();
  t->pass = in.pass;
  t->mb = std::max(0, in.mb);
  t->gradient = in.pass != ir::Pass::kF;
  // ep = 1: the backward gather takes the place of the combine's backward and sums its consumers' gradients.
  const bool many = core_.plan->mesh.ep <= 1 && t->gradient && in.role == compile::CommRole::kEtpGather;
  if (in.inputs.empty() || (in.inputs.size() != 1 && !many) || in.outputs.empty()) {
    return internal_error("executor: '" + in.label + "' has " + std::to_string(in.inputs.size()) + " inputs and " +
                          std::to_string(in.outputs.size()) + " consumers, expected " + (many ? "some" : "1") +
                          " and at least 1");
  }
  t->sources.assign(in.inputs.begin(), in.inputs.end());
  t->consumers = static_cast<int>(in.outputs.size());
  return ok_status();
}

namespace {

struct EtpCall {
  Core& core;
  const Task& t;
  comm::Communicator& c;
  int size, rank;

  Status wait(comm::Handle& h, std::shared_ptr<const void> keep, const std::string& what) {
    return core.wait_comm(c, h, std::move(keep), "etp " + what + " '" + t.in->label + "'");
  }
  // All-gathers `count` per rank of the `width`-element records of T: rank order, rows[r] records from rank r.
  template <typename T>
  Result<std::vector<T>> gather(const T* mine, const std::vector<int64_t>& rows, int64_t width) {
    // At least one record a rank: no zero-byte collective when no rank of the group received a row.
    const int64_t most = std::max<int64_t>(1, *std::max_element(rows.begin(), rows.end()));
    auto send = std::make_shared<std::vector<T>>(static_cast<size_t>(most * width), T{});
    auto all = std::make_shared<std::vector<T>>(static_cast<size_t>(most * width * size));
    std::copy(mine, mine + rows[static_cast<size_t>(rank)] * width, send->data());
    PIPER_ASSIGN_OR_RETURN(comm::Handle h, c.all_gather(send->data(), all->data(), send->size() * sizeof(T)));
    PIPER_RETURN_IF_ERROR(wait(h, std::make_shared<std::pair<decltype(send), decltype(all)>>(send, all), "gather"));
    std::vector<T> out;
    for (int r = 0; r < size; ++r) {
      const T* from = all->data() + r * most * width;
      out.insert(out.end(), from, from + rows[static_cast<size_t>(r)] * width);
    }
    return out;
  }
  // Reduce-scatters (sums) the concatenated per-rank blocks of `width` floats: this rank's rows of the sum.
  Result<std::vector<float>> scatter(const float* all_rows, const std::vector<int64_t>& rows, int64_t width) {
    const int64_t most = std::max<int64_t>(1, *std::max_element(rows.begin(), rows.end()));
    auto send = std::make_shared<std::vector<float>>(static_cast<size_t>(most * width * size), 0.0f);
    auto mine = std::make_shared<std::vector<float>>(static_cast<size_t>(most * width));
    int64_t at = 0;
    for (int r = 0; r < size; ++r) {
      const int64_t n = rows[static_cast<size_t>(r)] * width;
      std::copy(all_rows + at, all_rows + at + n, send->data() + r * most * width);
      at += n;
    }
    PIPER_ASSIGN_OR_RETURN(comm::Handle h, c.reduce_scatter_sum(send->data(), mine->data(), mine->size()));
    PIPER_RETURN_IF_ERROR(wait(h, std::make_shared<std::pair<decltype(send), decltype(mine)>>(send, mine), "sum"));
    mine->resize(static_cast<size_t>(rows[static_cast<size_t>(rank)] * width));
    return std::move(*mine);
  }
  std::shared_ptr<Tensor> rows_tensor(const std::vector<float>& v, int64_t h, MemCategory cat) {
    auto out = std::make_shared<Tensor>(
        Tensor::zeros_or_die({static_cast<int64_t>(v.size()) / std::max<int64_t>(1, h), h}, cat, core.allocator));
    if (!v.empty()) std::memcpy(out->data(), v.data(), v.size() * sizeof(float));
    return out;
  }
};

// ep = 1: this rank's own rows, (token, slot) in that order, as a kernels::Routing of one group. The experts
// chunk's permute and unpermute kernels (model/chunks/experts.cc) then do the dispatch and combine in place: they
// copy each token to its top_k rows and sum a token's rows back in slot order, as they do in expert order on one
// rank, so the sums run in the same order and give the same bits.
kernels::Routing slot_order(int64_t tokens, int k) {
  const std::vector<int32_t> one_group(static_cast<size_t>(tokens * k), 0);
  return kernels::build_routing(one_group.data(), tokens, k, 1);
}

// ep = 1: the dispatch in place, rows (token, slot) of the router's normed input with their expert and weight.
std::shared_ptr<EpRows> local_dispatch(const Routed& r, const kernels::Routing& slots, int64_t h,
                                       Allocator* allocator) {
  const int64_t rows = slots.num_tokens * slots.top_k;
  auto t = std::make_shared<Tensor>(Tensor::zeros_or_die({rows, h}, MemCategory::kActivations, allocator));
  kernels::permute_forward(t->data(), r.normed->data(), slots, h);
  auto out = std::make_shared<EpRows>();
  out->rows = std::move(t);
  out->expert.assign(r.topk_idx.begin(), r.topk_idx.end());
  out->weight.assign(r.topk_w.data(), r.topk_w.data() + rows);
  return out;
}

// ep = 1: the combine in place, x + routed_scaling * (each token's rows weighted and summed in slot order).
std::shared_ptr<Tensor> local_combine(const Tensor& x, const std::vector<float>& y, const Routed& r,
                                      const kernels::Routing& slots, int64_t h, float scale, Allocator* allocator) {
  auto out = std::make_shared<Tensor>(Tensor::zeros_or_die(x.shape(), MemCategory::kActivations, allocator));
  float* o = out->data();
  kernels::unpermute_forward(o, y.data(), r.topk_w.data(), slots, h);
  const float* xr = x.data();
  for (int64_t i = 0; i < out->numel(); ++i) o[i] = xr[i] + scale * o[i];
  return out;
}

// ep = 1: the combine's backward in place, each row the routed_scaling times its token's output gradient (summed
// over the consumers in edge order).
Result<std::vector<float>> local_combine_backward(const std::vector<Gradient>& grads, const kernels::Routing& slots,
                                                  int64_t h, float scale, std::shared_ptr<const Tensor>* dout) {
  const int64_t tokens = slots.num_tokens;
  PIPER_ASSIGN_OR_RETURN(*dout, sum_consumer_gradients(grads, tokens, h));
  std::vector<float> dy(static_cast<size_t>(tokens * h));
  for (int64_t i = 0; i < tokens * h; ++i) dy[static_cast<size_t>(i)] = scale * (*dout)->data()[i];
  std::vector<float> rows(static_cast<size_t>(tokens * slots.top_k * h));
  kernels::permute_forward(rows.data(), dy.data(), slots, h);
  return rows;
}

// ep = 1: the dispatch's backward in place, each token's row gradients summed in slot order (unit weights).
std::shared_ptr<Tensor> local_dispatch_backward(const std::vector<float>& drows, const kernels::Routing& slots,
                                                int64_t h, Allocator* allocator) {
  auto out = std::make_shared<Tensor>(Tensor::zeros_or_die({slots.num_tokens, h}, MemCategory::kBuffers, allocator));
  kernels::permute_backward_input(out->data(), drows.data(), slots, h);
  return out;
}

}  // namespace

Status ExpertParallel::run_etp(const Task& t) {
  const Instruction& n = *t.in;
  const int64_t h = core_.model->dims().hidden;
  const int k = core_.model->dims().top_k;
  const float scale = static_cast<float>(core_.model->dims().routed_scaling);
  const bool local = core_.plan->mesh.ep <= 1;  // no all-to-all: dispatch and combine here
  EtpCall call{core_, t, *t.comm, t.comm->size(), t.comm->rank()};
  const auto key = std::make_pair(n.layer, t.mb);
  const bool gather = n.role == compile::CommRole::kEtpGather;
  std::vector<int64_t> rows;
  if (!t.gradient && gather) {
    PIPER_ASSIGN_OR_RETURN(Activation a, core_.take_message<Activation>(t, t.sources[0]));
    if (local) {
      if (!a.routed || !a.hidden) return internal_error("'" + n.label + "': the router sent no routing");
      a.ep = local_dispatch(*a.routed, slot_order(a.hidden->numel() / h, k), h, core_.allocator);
      std::lock_guard<std::mutex> lock(mu_);
      etp_routed_[key] = routing_only(a.routed);
    }
    if (!a.ep || !a.ep->rows) return internal_error("'" + n.label + "': no dispatched rows");
    const int64_t mine = static_cast<int64_t>(a.ep->expert.size());
    PIPER_ASSIGN_OR_RETURN(rows, call.gather(&mine, std::vector<int64_t>(static_cast<size_t>(call.size), 1), 1));
    {
      std::lock_guard<std::mutex> lock(mu_);
      etp_rows_[key] = rows;
    }
    auto got = std::make_shared<EpRows>();
    PIPER_ASSIGN_OR_RETURN(std::vector<float> r, call.gather(a.ep->rows->data(), rows, h));
    got->rows = call.rows_tensor(r, h, MemCategory::kActivations);
    PIPER_ASSIGN_OR_RETURN(got->expert, call.gather(a.ep->expert.data(), rows, 1));
    PIPER_ASSIGN_OR_RETURN(got->weight, call.gather(a.ep->weight.data(), rows, 1));
    a.ep = std::move(got);
    core_.publish_message(t, std::move(a));
    return ok_status();
  }
  std::shared_ptr<const Routed> routed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = etp_rows_.find(key);
    if (it == etp_rows_.end()) return internal_error("'" + n.label + "' runs before its forward etp all-gather");
    rows = it->second;
    if (local) routed = etp_routed_.at(key);
    if (t.gradient && !gather) {  // the last of the four
      etp_rows_.erase(it);
      etp_routed_.erase(key);
    }
  }
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  const int64_t tokens = rows[static_cast<size_t>(call.rank)] / k;  // ep = 1: this rank's own rows are (token, slot)
  const kernels::Routing slots = local ? slot_order(tokens, k) : kernels::Routing{};
  if (!t.gradient) {  // F reduce-scatter of the partial expert outputs
    PIPER_ASSIGN_OR_RETURN(Activation a, core_.take_message<Activation>(t, t.sources[0]));
    if (!a.ep || !a.ep->rows || a.ep->rows->numel() != total * h) {
      return internal_error("'" + n.label + "': the experts' output is not the gathered rows");
    }
    PIPER_ASSIGN_OR_RETURN(std::vector<float> y, call.scatter(a.ep->rows->data(), rows, h));
    if (local) {
      if (!a.hidden || a.hidden->numel() != tokens * h) return internal_error("'" + n.label + "': no residual");
      Activation out;
      out.hidden = local_combine(*a.hidden, y, *routed, slots, h, scale, core_.allocator);
      core_.publish_message(t, std::move(out));
      return ok_status();
    }
    auto out = std::make_shared<EpRows>();
    out->rows = call.rows_tensor(y, h, MemCategory::kActivations);
    a.ep = std::move(out);
    core_.publish_message(t, std::move(a));
    return ok_status();
  }
  std::vector<Gradient> grads;
  for (ir::NodeId src : t.sources) {
    PIPER_ASSIGN_OR_RETURN(Gradient g, core_.take_message<Gradient>(t, src));
    grads.push_back(std::move(g));
  }
  Gradient& g = grads[0];
  if (local && gather) {  // the combine's backward here: the rows' output gradients
    std::shared_ptr<const Tensor> dout;
    Result<std::vector<float>> dy = local_combine_backward(grads, slots, h, scale, &dout);
    if (!dy.ok()) return internal_error("'" + n.label + "': " + dy.status().message());
    auto mine = std::make_shared<EpRows>();
    mine->rows = call.rows_tensor(*dy, h, MemCategory::kBuffers);
    g = Gradient{};
    g.dhidden = std::move(dout);
    g.ep = std::move(mine);
  }
  if (!g.ep || !g.ep->rows) return internal_error("'" + n.label + "': no row gradients");
  auto out = std::make_shared<EpRows>();
  if (gather) {  // B all-gather of the combine's row gradients
    PIPER_ASSIGN_OR_RETURN(std::vector<float> r, call.gather(g.ep->rows->data(), rows, h));
    out->rows = call.rows_tensor(r, h, MemCategory::kBuffers);
  } else {  // B reduce-scatter of the partial input-row and routing-weight gradients
    if (g.ep->rows->numel() != total * h || static_cast<int64_t>(g.ep->dweight.size()) != total) {
      return internal_error("'" + n.label + "': the experts' row gradients are not the gathered rows");
    }
    PIPER_ASSIGN_OR_RETURN(std::vector<float> dx, call.scatter(g.ep->rows->data(), rows, h));
    PIPER_ASSIGN_OR_RETURN(std::vector<float> dw, call.scatter(g.ep->dweight.data(), rows, 1));
    if (local) {  // the dispatch's backward here: the router's input and routing-weight gradients
      Gradient back;
      back.dhidden = g.dhidden;
      back.dnormed = local_dispatch_backward(dx, slots, h, core_.allocator);
      auto dtopk_w =
          std::make_shared<Tensor>(Tensor::zeros_or_die({tokens, k}, MemCategory::kBuffers, core_.allocator));
      std::copy(dw.begin(), dw.end(), dtopk_w->data());
      back.dtopk_w = std::move(dtopk_w);
      core_.publish_message(t, std::move(back));
      return ok_status();
    }
    out->rows = call.rows_tensor(dx, h, MemCategory::kBuffers);
    out->dweight = std::move(dw);
  }
  g.ep = std::move(out);
  core_.publish_message(t, std::move(g));
  return ok_status();
}

}  // namespace piper::runtime::detail
