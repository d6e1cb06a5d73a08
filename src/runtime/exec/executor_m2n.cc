// The executor's M2N exchanges: disaggregated attention/FFN (af-pipe, DisagMoE). See docs/runtime.md.
//
// The plan (ir/passes/disaggregate.cc) puts embed, attention and router on attention pipeline ranks and the FFN
// parts (dense mlp, experts, shared) and the head on FFN pipeline ranks; every data edge between the two sides is an
// m2n send on one rank and an m2n recv on the other. Both sides run on dp ranks per pipeline rank (the rank
// layout of Plan: attention rank d and FFN rank d share the dp coordinate d); the FFN side shards its experts
// over ep: FFN rank d holds expert block d mod ep.
//
//   dense edges (attn <-> mlp, shared): a point-to-point message with the same-dp rank of the other side,
//     exactly a pipeline send/recv (the PipelineP2p handler runs it, executor_p2p.cc).
//   routed edges (router <-> experts, experts <-> the next layer's attention or the head): each attention rank d
//     exchanges with the ep FFN ranks of its ep block (dp coordinates [d/ep*ep, d/ep*ep + ep)), peer e holding
//     experts [e E/ep, (e+1) E/ep); each of those FFN ranks serves the ep attention ranks of the block.
//     router -> experts F   (attention rank) each (token, slot) row of the normed input to the FFN rank of its
//                           expert, with its local expert and routing weight; row counts first. The residual and
//                           the routing stay here, kept per (layer, microbatch) until the backward.
//                           (FFN rank) the rows of every source in (source, token, slot) order: the experts
//                           chunk's expert-parallel input (EpRows), as after an EP dispatch.
//     experts -> next F     (FFN rank) the output rows back to their sources.
//                           (attention rank) x + routed_scaling * sum over slots (in slot order) of weight * row:
//                           the single-rank experts chunk's output, arithmetic as flat_combine.
//     next -> experts B     (attention rank) the output gradient times routed_scaling, dispatched like the tokens;
//                           the unscaled gradient is kept as the residual's gradient for the router.
//                           (FFN rank) the experts chunk's row gradients (EpRows), as after an EP combine B.
//     experts -> router B   (FFN rank) each source's input-gradient rows and routing-weight gradients.
//                           (attention rank) the rows summed per token in slot order (dnormed), the weight
//                           gradients in slot order (dtopk_w) and the kept residual gradient (dhidden): the
//                           router's backward input, as after an EP dispatch B.
//   When the router's attention rank cannot combine (the experts feed the head on the FFN rank, or with pp > 1 the
//   next attention is on another attention rank), the FFN group combines instead (combine_on_ffn): the dispatch
//   also carries the residual and routing to the same-dp FFN rank, the FFN ranks exchange output rows among
//   themselves (pairwise all-to-all-v, before the head's F or in the experts' send, which then sends the hidden
//   state as a dense message), the backward transposes it before the experts' BW, and the residual's gradient
//   goes back to the router's rank with the experts' input gradients.
// The messages of one instruction go to / come from each peer with the plan's tag on the p2p communicator
// (posted in a fixed order, so they match in order); zero-row blocks post nothing. Every wait is wait_comm's
// (timeout naming the ranks, abandon when another stream failed). Expert gradients are divided by ep before the
// norm (ExpertParallel::prepare_norm): an FFN rank's experts served ep attention ranks' objectives.
//
// Code: the M2n handler (executor_handlers.h) owns the per-(layer, microbatch) state under its own lock. M2n::run
// looks the instruction's (pass, side, direction) up in a table of eight M2n::Call member functions, one per
// exchange above and side (dispatch_send/recv, combine_send/recv, combine_grad_send/recv, dispatch_grad_send/recv);
// they share the posting (post_all, post_blocks, post_same_dp), the waits for the other stream's state
// (source_state, sink_state, both wait_for_state: the core's bounded wait on this handler's maps) and the routing
// (route_tokens, pack_dispatch, combine_rows). Where the FFN group combines, the variants call
// send/recv_local_routing and combine_in_ffn_group.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>

#include "piper/comm/algorithms/pairwise_all_to_all.h"
#include "piper/runtime/exec/executor_handlers.h"

namespace piper::runtime::detail {

using compile::Instruction;
using compile::OpKind;

// Attention side, one (MoE layer, microbatch): from the router's forward to the router's backward.
struct M2nSource {
  int64_t tokens = 0;
  std::vector<int> dest;                   // peer index of each (token, slot)
  std::vector<size_t> rows_to;             // rows sent to each peer
  std::vector<size_t> slot_row;            // row of each (token, slot) in the peers' blocks, concatenated
  std::shared_ptr<const Tensor> residual;  // the router's x
  std::shared_ptr<const Routed> routed;
  std::vector<float> weight;                // routing weight of each (token, slot)
  std::shared_ptr<const Tensor> dresidual;  // the output gradient (backward), the router's dhidden
};

// FFN side, one (MoE layer, microbatch): rows received from each source; when the experts' output feeds a
// chunk of this FFN rank (the head), also the same-dp source's routing and residual (`local`).
struct M2nSink {
  std::vector<size_t> rows_from;
  std::shared_ptr<M2nSource> local;
};

namespace {

Status ffn_group_exchange(comm::Communicator* group, const float* send, const std::vector<size_t>& send_rows,
                          float* recv, const std::vector<size_t>& recv_rows, int64_t h, double timeout_s);

// Slot bookkeeping of one source's routing over `peers` expert blocks: rows per peer and each slot's row in the
// peers' blocks, concatenated.
void route_slots(M2nSource* s, size_t peers) {
  s->rows_to.assign(peers, 0);
  for (int d : s->dest) ++s->rows_to[static_cast<size_t>(d)];
  std::vector<size_t> at(peers, 0);
  for (size_t d = 1; d < peers; ++d) at[d] = at[d - 1] + s->rows_to[d - 1];
  s->slot_row.resize(s->dest.size());
  for (size_t i = 0; i < s->dest.size(); ++i) s->slot_row[i] = at[static_cast<size_t>(s->dest[i])]++;
}

// x + scale * sum over slots (in slot order) of weight * row: the single-rank experts chunk's output, with the
// arithmetic of flat_combine.
std::shared_ptr<Tensor> combine_rows(const M2nSource& s, const float* back, int64_t h, int k, float scale,
                                     Allocator* allocator) {
  std::vector<float> y(static_cast<size_t>(s.tokens * h), 0.0f);
  for (int64_t tok = 0; tok < s.tokens; ++tok) {
    float* acc = y.data() + tok * h;
    for (int j = 0; j < k; ++j) {
      const size_t i = static_cast<size_t>(tok * k + j);
      const float* row = back + s.slot_row[i] * static_cast<size_t>(h);
      for (int64_t col = 0; col < h; ++col) acc[col] += s.weight[i] * row[col];
    }
  }
  auto out = std::make_shared<Tensor>(Tensor::zeros_or_die(s.residual->shape(), MemCategory::kActivations, allocator));
  const float* x = s.residual->data();
  float* o = out->data();
  for (int64_t i = 0; i < out->numel(); ++i) o[i] = x[i] + scale * y[static_cast<size_t>(i)];
  return out;
}

// The output gradient times scale, one row per (token, slot) at its slot_row.
std::shared_ptr<std::vector<float>> scatter_grad(const M2nSource& s, const float* dy, int64_t h, int k, float scale) {
  auto rows = std::make_shared<std::vector<float>>(static_cast<size_t>(s.tokens * k * h));
  for (size_t i = 0; i < s.slot_row.size(); ++i) {
    float* row = rows->data() + s.slot_row[i] * static_cast<size_t>(h);
    const float* src = dy + (i / static_cast<size_t>(k)) * static_cast<size_t>(h);
    for (int64_t col = 0; col < h; ++col) row[col] = scale != 1.0f ? src[col] * scale : src[col];
  }
  return rows;
}

}  // namespace

namespace {

// The parts of the chunks at this end and at the other end of an m2n exchange, as the compiler wrote them.
std::pair<std::optional<Part>, std::optional<Part>> m2n_ends(const Instruction& in) {
  const bool sending = in.op == OpKind::kSend;
  return {sending ? in.src_part : in.dst_part, sending ? in.dst_part : in.src_part};
}

}  // namespace

M2n::M2n(Core& core) : Handler(core) {}
M2n::~M2n() = default;

Result<bool> M2n::routed(const Instruction& in) const {
  const bool sending = in.op == OpKind::kSend;
  const auto [mine, other] = m2n_ends(in);
  if (!mine || !other) {
    return internal_error("executor: '" + in.label + "' does not link two chunks");
  }
  const bool routed = mine == Part::kExperts || other == Part::kExperts;
  if (!routed) return false;  // a dense edge: a pipeline-like message with the same-dp peer
  const Part peer_chunk = mine == Part::kExperts ? *other : *mine;
  if (peer_chunk != Part::kRouter && peer_chunk != Part::kAttention && peer_chunk != Part::kHead) {
    return unimplemented("executor: '" + in.label + "' links experts with a '" + chunk_name(peer_chunk) +
                         "' chunk; the runtime's M2N exchanges connect experts with a router, attention or head");
  }
  if (in.experts_layer < 0) {
    return internal_error("executor: '" + in.label + "' links the experts but names no experts_layer");
  }
  // Where the combine runs: the compiler decided it (Instruction::combine_on_ffn). When the FFN group combines,
  // the experts' output goes to the next layer's attention as a dense message, and its gradient comes back as
  // one; only the FFN side's forward send combines first (resolve).
  return !(in.combine_on_ffn && peer_chunk != Part::kRouter &&
           !(sending && mine == Part::kExperts && in.pass == ir::Pass::kF));
}

Status M2n::resolve(const Instruction& in, Task* t) {
  const bool sending = in.op == OpKind::kSend;
  const auto [mine, other] = m2n_ends(in);
  const std::optional<Part> peer_chunk = mine == Part::kExperts ? other : mine;
  const bool on_ffn = in.combine_on_ffn;
  if (in.tag < 0 || in.tag > 32767) {
    return invalid_argument("executor: '" + in.label + "' has tag " + std::to_string(in.tag) +
                            " outside the communicator's [0, 32767]");
  }
  active_ = true;
  DistContext* dist = core_.dist;
  const compile::Plan& layout = dist->plan();
  const int ep_deg = std::max(1, core_.plan->mesh.ep);
  // The plan's rank layout names the peers (Plan::m2n_peers: the other side's ranks of this rank's expert group
  // and tp coordinate) and the same-dp one among them (Plan::p2p_peer).
  t->peers = layout.m2n_peers(dist->rank(), in.peer);
  const auto same = std::find(t->peers.begin(), t->peers.end(), layout.p2p_peer(dist->rank(), in.peer));
  if (static_cast<int>(t->peers.size()) != ep_deg || same == t->peers.end()) {
    return internal_error("executor: '" + in.label + "': the plan gives rank " + std::to_string(dist->rank()) + " " +
                          std::to_string(t->peers.size()) + " m2n peers on pipeline rank " + std::to_string(in.peer) +
                          " (expected ep=" + std::to_string(ep_deg) + ", its same-dp rank among them)");
  }
  t->same_dp_peer = static_cast<size_t>(same - t->peers.begin());
  t->m2n_local = on_ffn;
  t->m2n_ffn = mine == Part::kExperts;
  t->gradient = in.pass != ir::Pass::kF;
  t->mb = std::max(0, in.mb);
  t->key = StashKey{in.experts_layer, "m2n", t->mb};
  int count = 0;
  for (ir::NodeId id : sending ? in.inputs : in.outputs) {
    if (sending) t->source = id;
    ++count;
  }
  if (sending && count != 1) {
    return internal_error("executor: '" + in.label + "' has " + std::to_string(count) + " producers, expected 1");
  }
  if (!sending) t->consumers = count;
  if (t->m2n_ffn && ep_deg > 1) {
    // The FFN rank's experts chunk holds one ep block: expert gradients are the mean over the ep sources'
    // objectives and each expert counts once in the norm (ExpertParallel).
    comm::Communicator* group = dist->group("ep");
    if (group == nullptr || group->size() != ep_deg) {
      return internal_error("executor: '" + in.label + "': the FFN rank has no ep group of " + std::to_string(ep_deg) +
                            " ranks");
    }
    PIPER_RETURN_IF_ERROR(core_.ep->serve_m2n(group));
    if (on_ffn && sending && t->m2n_ffn && !t->gradient && peer_chunk != Part::kRouter) {
      // This send stream combines inside the FFN group concurrently with the compute stream's combines (the
      // head's input, the experts' gradients): its own communicator, one per peer pipeline rank (= stream).
      auto& c = combine_comms_[in.peer];
      if (c == nullptr) {
        PIPER_ASSIGN_OR_RETURN(c, group->dup("m2n_combine_" + std::to_string(in.peer)));
      }
      t->comm = c.get();
    }
  }
  return ok_status();
}

namespace {

// A dispatched row's local expert and routing weight (the row's header in the dispatch payload).
struct Meta {
  int32_t expert;
  float weight;
};

// The three coordinates that name an m2n variant.
enum class M2nPass { kForward, kBackward };
enum class M2nSide { kAttention, kFfn };
enum class M2nDirection { kSend, kRecv };

struct M2nKey {
  M2nPass pass;
  M2nSide side;
  M2nDirection direction;
  bool operator==(const M2nKey&) const = default;
};

}  // namespace

// One routed m2n instruction being run (the exchanges described at the top of this file): its context, the pieces
// its variants share, and the eight variants, one per (pass, side, direction), chosen by M2n::run's table.
struct M2n::Call {
  Call(M2n& m2n, const Task& task)
      : x(m2n),
        core(m2n.core_),
        t(task),
        in(*task.in),
        h(m2n.core_.model->dims().hidden),
        k(m2n.core_.model->dims().top_k),
        scale(static_cast<float>(m2n.core_.model->dims().routed_scaling)),
        layer(std::get<0>(task.key)),
        key(layer, task.mb),
        peers(task.peers.size()),
        c(m2n.core_.dist->p2p()),
        tag(static_cast<int>(task.in->tag)),
        experts_per_peer(m2n.core_.model->dims().num_experts / static_cast<int>(peers)),
        me_idx(task.same_dp_peer) {}

  Status dispatch_send();       // router -> experts F, attention rank
  Status dispatch_recv();       // router -> experts F, FFN rank
  Status combine_send();        // experts -> next F, FFN rank
  Status combine_recv();        // experts -> next F, attention rank
  Status combine_grad_send();   // next -> experts B, attention rank
  Status combine_grad_recv();   // next -> experts B, FFN rank
  Status dispatch_grad_send();  // experts -> router B, FFN rank
  Status dispatch_grad_recv();  // experts -> router B, attention rank

  // Pieces of the dispatch F: the routing of the router's tokens over the peers, the payload of each peer
  // (row headers, then rows), and the rows an FFN rank receives.
  Result<std::shared_ptr<M2nSource>> route_tokens(const Activation& a) const;
  void pack_dispatch(const M2nSource& s, const Routed& routed, std::vector<int64_t>* counts,
                     std::vector<std::vector<char>>* payload) const;
  Result<std::shared_ptr<EpRows>> recv_dispatch_rows(const std::vector<size_t>& rows_from);
  // experts -> router B on the attention rank: the rows summed per token in slot order and the weight gradients.
  Result<Gradient> router_grads(const M2nSource& s, const std::vector<float>& packed,
                                const std::vector<size_t>& first) const;

  // The FFN group combines (t.m2n_local): the same-dp source's residual and routing travel with the dispatch, and
  // the experts' send combines in the group before it sends the hidden state.
  Status send_local_routing(const M2nSource& s, std::vector<char>* extra, const std::shared_ptr<const void>& keep);
  Result<std::shared_ptr<M2nSource>> recv_local_routing();
  Status combine_in_ffn_group(const EpRows& rows, const M2nSink& sink);

  std::string who(size_t i) const { return "rank " + std::to_string(t.peers[i]); }
  // Posts one message per peer (skipping empty ones) and waits for all; `keep` owns the buffers.
  Status post_all(bool send, const std::vector<void*>& bufs, const std::vector<size_t>& bytes,
                  const std::shared_ptr<const void>& keep);
  // post_all of consecutive blocks of `base`: rows[i] rows of `stride` floats for peer i.
  Status post_blocks(bool send, float* base, const std::vector<size_t>& rows, size_t stride,
                     const std::shared_ptr<const void>& keep);
  // post_all of one message with the same-dp peer only.
  Status post_same_dp(bool send, void* buf, size_t bytes, const std::shared_ptr<const void>& keep);
  // Waits for the state of (layer, mb) that another stream records (the dispatch's routing, the received rows).
  template <typename State>
  Result<std::shared_ptr<State>> wait_for_state(std::map<std::pair<int, int>, std::shared_ptr<State>>& states,
                                                const char* what);
  Result<std::shared_ptr<M2nSource>> source_state();
  Result<std::shared_ptr<M2nSink>> sink_state();

  M2n& x;
  Core& core;
  const Task& t;
  const Instruction& in;
  const int64_t h;
  const int k;
  const float scale;
  const int layer;
  const std::pair<int, int> key;  // (layer, mb)
  const size_t peers;
  comm::Communicator& c;
  const int tag;
  const int experts_per_peer;
  const size_t me_idx;  // my same-dp peer
};

Status M2n::run(const Task& t) {
  using Variant = Status (Call::*)();
  struct Entry {
    M2nKey key;
    Variant run;
  };
  using enum M2nPass;
  using enum M2nSide;
  using enum M2nDirection;
  // (pass, side of this rank, direction) -> variant; the exchanges of the comment at the top of this file.
  static constexpr Entry kVariants[] = {
      {{kForward, kAttention, kSend}, &Call::dispatch_send},        // router -> experts F
      {{kForward, kFfn, kRecv}, &Call::dispatch_recv},              // router -> experts F
      {{kForward, kFfn, kSend}, &Call::combine_send},               // experts -> next F
      {{kForward, kAttention, kRecv}, &Call::combine_recv},         // experts -> next F
      {{kBackward, kAttention, kSend}, &Call::combine_grad_send},   // next -> experts B
      {{kBackward, kFfn, kRecv}, &Call::combine_grad_recv},         // next -> experts B
      {{kBackward, kFfn, kSend}, &Call::dispatch_grad_send},        // experts -> router B
      {{kBackward, kAttention, kRecv}, &Call::dispatch_grad_recv},  // experts -> router B
  };
  static_assert(std::size(kVariants) == 8, "one variant per (pass, side, direction)");
  const auto start = std::chrono::steady_clock::now();
  const M2nKey want{t.gradient ? kBackward : kForward, t.m2n_ffn ? kFfn : kAttention,
                    t.in->op == OpKind::kSend ? kSend : kRecv};
  const Entry* entry =
      std::find_if(std::begin(kVariants), std::end(kVariants), [&](const Entry& e) { return e.key == want; });
  if (entry == std::end(kVariants)) return internal_error("'" + t.in->label + "': no M2N variant");
  Call call(*this, t);
  PIPER_RETURN_IF_ERROR((call.*(entry->run))());
  core_.add_seconds(std::string("m2n.") + (t.gradient ? "B" : "F"),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return ok_status();
}

Status M2n::Call::post_all(bool send, const std::vector<void*>& bufs, const std::vector<size_t>& bytes,
                           const std::shared_ptr<const void>& keep) {
  std::vector<std::pair<size_t, comm::Handle>> handles;
  for (size_t i = 0; i < peers; ++i) {
    if (bytes[i] == 0) continue;
    Result<comm::Handle> posted =
        send ? c.isend(bufs[i], bytes[i], t.peers[i], tag) : c.irecv(bufs[i], bytes[i], t.peers[i], tag);
    if (!posted.ok()) return posted.status();
    handles.emplace_back(i, std::move(posted).value());
  }
  for (auto& [i, handle] : handles) {
    PIPER_RETURN_IF_ERROR(
        core.wait_comm(c, handle, keep, std::string(send ? "M2N send to " : "M2N receive from ") + who(i)));
  }
  return ok_status();
}

Status M2n::Call::post_blocks(bool send, float* base, const std::vector<size_t>& rows, size_t stride,
                              const std::shared_ptr<const void>& keep) {
  std::vector<void*> b(peers);
  std::vector<size_t> bytes(peers);
  size_t r = 0;
  for (size_t i = 0; i < peers; ++i) {
    b[i] = base + r * stride;
    bytes[i] = rows[i] * stride * sizeof(float);
    r += rows[i];
  }
  return post_all(send, b, bytes, keep);
}

Status M2n::Call::post_same_dp(bool send, void* buf, size_t bytes, const std::shared_ptr<const void>& keep) {
  std::vector<void*> b(peers, nullptr);
  std::vector<size_t> n(peers, 0);
  b[me_idx] = buf;
  n[me_idx] = bytes;
  return post_all(send, b, n, keep);
}

// The state another stream of this rank records for (layer, mb) in `states`: wait (bounded by the communication
// timeout) until it is there. `what` names it in the timeout's message.
template <typename State>
Result<std::shared_ptr<State>> M2n::Call::wait_for_state(std::map<std::pair<int, int>, std::shared_ptr<State>>& states,
                                                         const char* what) {
  Status st = core.wait_until(
      [&] {
        std::lock_guard<std::mutex> lock(x.mu_);
        return states.count(key) > 0;
      },
      std::chrono::duration<double>(core.dist->timeout_s()),
      "'" + in.label + "' waited " + std::to_string(static_cast<int>(core.dist->timeout_s())) +
          " s (PIPER_COMM_TIMEOUT_S) for " + what + " of (layer " + std::to_string(layer) + ", mb " +
          std::to_string(t.mb) + ") on rank " + std::to_string(core.dist->rank()));
  if (st.code() == StatusCode::kUnavailable) return st.with_context("'" + in.label + "'");
  PIPER_RETURN_IF_ERROR(st);
  std::lock_guard<std::mutex> lock(x.mu_);
  return states.at(key);
}

// The receive streams post their receives in the channel's order, concurrently with the send stream that
// dispatches: wait until the dispatch recorded its routing.
Result<std::shared_ptr<M2nSource>> M2n::Call::source_state() { return wait_for_state(x.sources_, "the dispatch"); }

// With pp > 1 an FFN rank receives a layer's dispatch and its output gradient from different attention ranks, on
// different receive streams: wait until the dispatch's rows arrived.
Result<std::shared_ptr<M2nSink>> M2n::Call::sink_state() { return wait_for_state(x.sinks_, "the rows"); }

Result<std::shared_ptr<M2nSource>> M2n::Call::route_tokens(const Activation& a) const {
  if (!a.routed || !a.hidden) return internal_error("'" + in.label + "': the router sent no routing");
  auto s = std::make_shared<M2nSource>();
  s->tokens = a.hidden->numel() / h;
  s->residual = a.hidden;
  s->routed = routing_only(a.routed);
  const size_t slots = static_cast<size_t>(s->tokens * k);
  s->dest.resize(slots);
  s->weight.assign(a.routed->topk_w.data(), a.routed->topk_w.data() + slots);
  for (size_t i = 0; i < slots; ++i) {
    const int d = a.routed->topk_idx[i] / experts_per_peer;
    if (d < 0 || static_cast<size_t>(d) >= peers) {
      return internal_error("'" + in.label + "': expert " + std::to_string(a.routed->topk_idx[i]) + " out of range");
    }
    s->dest[i] = d;
  }
  route_slots(s.get(), peers);
  return s;
}

void M2n::Call::pack_dispatch(const M2nSource& s, const Routed& routed, std::vector<int64_t>* counts,
                              std::vector<std::vector<char>>* payload) const {
  std::vector<size_t> first(peers + 1, 0);
  for (size_t d = 0; d < peers; ++d) first[d + 1] = first[d] + s.rows_to[d];
  const size_t row_bytes = static_cast<size_t>(h) * sizeof(float);
  for (size_t d = 0; d < peers; ++d) {
    (*counts)[d] = static_cast<int64_t>(s.rows_to[d]);
    (*payload)[d].resize(s.rows_to[d] * (sizeof(Meta) + row_bytes));
  }
  const float* normed = routed.normed->data();
  for (size_t i = 0; i < s.dest.size(); ++i) {
    const size_t d = static_cast<size_t>(s.dest[i]);
    const size_t j = s.slot_row[i] - first[d];  // row within the peer's block
    char* block = (*payload)[d].data();
    const Meta m{routed.topk_idx[i] - static_cast<int>(d) * experts_per_peer, s.weight[i]};
    std::memcpy(block + j * sizeof(Meta), &m, sizeof(Meta));
    std::memcpy(block + s.rows_to[d] * sizeof(Meta) + j * row_bytes, normed + (i / k) * h, row_bytes);
  }
}

// router -> experts F (attention rank): each (token, slot) row to the FFN rank of its expert, row counts first.
Status M2n::Call::dispatch_send() {
  PIPER_ASSIGN_OR_RETURN(Activation a, core.take_message<Activation>(t, t.source));
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<M2nSource> s, route_tokens(a));
  auto counts = std::make_shared<std::vector<int64_t>>(peers);
  auto payload = std::make_shared<std::vector<std::vector<char>>>(peers + 1);
  pack_dispatch(*s, *a.routed, counts.get(), payload.get());
  {
    std::lock_guard<std::mutex> lock(x.mu_);
    x.sources_[key] = s;
  }
  core.notify();
  std::shared_ptr<const void> keep = std::make_shared<std::pair<decltype(counts), decltype(payload)>>(counts, payload);
  std::vector<void*> cb(peers), pb(peers);
  std::vector<size_t> cbytes(peers, sizeof(int64_t)), pbytes(peers);
  for (size_t d = 0; d < peers; ++d) {
    cb[d] = &(*counts)[d];
    pb[d] = (*payload)[d].data();
    pbytes[d] = (*payload)[d].size();
  }
  PIPER_RETURN_IF_ERROR(post_all(true, cb, cbytes, keep));
  PIPER_RETURN_IF_ERROR(post_all(true, pb, pbytes, keep));
  if (t.m2n_local) return send_local_routing(*s, &(*payload)[peers], keep);
  return ok_status();
}

// The experts' output feeds the head on the same-dp FFN rank (or the next attention elsewhere): that rank
// combines, so it gets the residual and the routing (weights and destination blocks) of this source's tokens.
Status M2n::Call::send_local_routing(const M2nSource& s, std::vector<char>* extra,
                                     const std::shared_ptr<const void>& keep) {
  const size_t slots = s.dest.size();
  extra->resize(static_cast<size_t>(s.tokens * h) * sizeof(float) + slots * (sizeof(float) + sizeof(int32_t)));
  char* at = extra->data();
  std::memcpy(at, s.residual->data(), static_cast<size_t>(s.tokens * h) * sizeof(float));
  at += static_cast<size_t>(s.tokens * h) * sizeof(float);
  std::memcpy(at, s.weight.data(), slots * sizeof(float));
  at += slots * sizeof(float);
  for (size_t i = 0; i < slots; ++i) {
    const int32_t d = s.dest[i];
    std::memcpy(at + i * sizeof(int32_t), &d, sizeof(int32_t));
  }
  return post_same_dp(true, extra->data(), extra->size(), keep);
}

// The rows of every source in (source, token, slot) order, with their local experts and weights.
Result<std::shared_ptr<EpRows>> M2n::Call::recv_dispatch_rows(const std::vector<size_t>& rows_from) {
  auto payload = std::make_shared<std::vector<std::vector<char>>>(peers);
  const size_t row_bytes = static_cast<size_t>(h) * sizeof(float);
  std::vector<void*> pb(peers);
  std::vector<size_t> pbytes(peers);
  int64_t rows = 0;
  for (size_t s = 0; s < peers; ++s) {
    (*payload)[s].resize(rows_from[s] * (sizeof(Meta) + row_bytes));
    pb[s] = (*payload)[s].data();
    pbytes[s] = (*payload)[s].size();
    rows += static_cast<int64_t>(rows_from[s]);
  }
  PIPER_RETURN_IF_ERROR(post_all(false, pb, pbytes, payload));
  auto got = std::make_shared<EpRows>();
  PIPER_ASSIGN_OR_RETURN(Tensor t_rows, Tensor::zeros({rows, h}, MemCategory::kActivations, core.allocator));
  auto rows_t = std::make_shared<Tensor>(std::move(t_rows));
  got->expert.resize(static_cast<size_t>(rows));
  got->weight.resize(static_cast<size_t>(rows));
  size_t r = 0;
  for (size_t s = 0; s < peers; ++s) {
    const char* block = (*payload)[s].data();
    const size_t n = rows_from[s];
    for (size_t j = 0; j < n; ++j) {
      Meta m;
      std::memcpy(&m, block + j * sizeof(Meta), sizeof(Meta));
      got->expert[r + j] = m.expert;
      got->weight[r + j] = m.weight;
    }
    if (n > 0) std::memcpy(rows_t->data() + r * static_cast<size_t>(h), block + n * sizeof(Meta), n * row_bytes);
    r += n;
  }
  got->rows = std::move(rows_t);
  return got;
}

// router -> experts F (FFN rank): every source's rows, the experts chunk's expert-parallel input.
Status M2n::Call::dispatch_recv() {
  auto counts = std::make_shared<std::vector<int64_t>>(peers, 0);
  std::vector<void*> cb(peers);
  for (size_t s = 0; s < peers; ++s) cb[s] = &(*counts)[s];
  PIPER_RETURN_IF_ERROR(post_all(false, cb, std::vector<size_t>(peers, sizeof(int64_t)), counts));
  auto sink = std::make_shared<M2nSink>();
  for (size_t s = 0; s < peers; ++s) {
    if ((*counts)[s] < 0 || (*counts)[s] > int64_t{1} << 40) {
      return internal_error("'" + in.label + "': " + who(s) + " announced " + std::to_string((*counts)[s]) + " rows");
    }
    sink->rows_from.push_back(static_cast<size_t>((*counts)[s]));
  }
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<EpRows> got, recv_dispatch_rows(sink->rows_from));
  if (t.m2n_local) {
    // The same-dp source's residual and routing, for the combine before the head (local_inputs).
    PIPER_ASSIGN_OR_RETURN(sink->local, recv_local_routing());
  }
  {
    std::lock_guard<std::mutex> lock(x.mu_);
    x.sinks_[key] = sink;
  }
  core.notify();
  Activation a;
  a.ep = std::move(got);
  core.publish_message(t, std::move(a));
  return ok_status();
}

Result<std::shared_ptr<M2nSource>> M2n::Call::recv_local_routing() {
  auto local = std::make_shared<M2nSource>();
  local->tokens = core.mbs * core.batch->seq_len / core.tp->token_shards();  // the source's token slice
  const size_t slots = static_cast<size_t>(local->tokens * k);
  auto extra = std::make_shared<std::vector<char>>(static_cast<size_t>(local->tokens * h) * sizeof(float) +
                                                   slots * (sizeof(float) + sizeof(int32_t)));
  PIPER_RETURN_IF_ERROR(post_same_dp(false, extra->data(), extra->size(), extra));
  const char* at = extra->data();
  auto res =
      std::make_shared<Tensor>(Tensor::zeros_or_die({local->tokens, h}, MemCategory::kActivations, core.allocator));
  std::memcpy(res->data(), at, static_cast<size_t>(local->tokens * h) * sizeof(float));
  at += static_cast<size_t>(local->tokens * h) * sizeof(float);
  local->residual = std::move(res);
  local->weight.resize(slots);
  std::memcpy(local->weight.data(), at, slots * sizeof(float));
  at += slots * sizeof(float);
  local->dest.resize(slots);
  for (size_t i = 0; i < slots; ++i) {
    int32_t d = 0;
    std::memcpy(&d, at + i * sizeof(int32_t), sizeof(int32_t));
    if (d < 0 || static_cast<size_t>(d) >= peers) {
      return internal_error("'" + in.label + "': " + who(me_idx) + " sent a slot for expert block " +
                            std::to_string(d));
    }
    local->dest[i] = d;
  }
  route_slots(local.get(), peers);
  return local;
}

// experts -> next F (FFN rank): the output rows back to their sources.
Status M2n::Call::combine_send() {
  PIPER_ASSIGN_OR_RETURN(Activation a, core.take_message<Activation>(t, t.source));
  PIPER_ASSIGN_OR_RETURN(auto sink, sink_state());
  if (!a.ep || !a.ep->rows) return internal_error("'" + in.label + "': the experts chunk produced no rows");
  if (t.m2n_local) return combine_in_ffn_group(*a.ep, *sink);
  std::shared_ptr<const Tensor> rows = a.ep->rows;
  size_t total = 0;
  for (size_t n : sink->rows_from) total += n;
  if (static_cast<int64_t>(total) * h != rows->numel()) {
    return internal_error("'" + in.label + "': the experts returned another number of rows than they received");
  }
  return post_blocks(true, const_cast<float*>(rows->data()), sink->rows_from, static_cast<size_t>(h), rows);
}

// The next attention is on another attention rank than the router: combine in the FFN group here and send the
// hidden state to the same-dp rank of that attention rank.
Status M2n::Call::combine_in_ffn_group(const EpRows& rows, const M2nSink& sink) {
  if (sink.local == nullptr) return internal_error("'" + in.label + "': no routing of the same-dp source");
  const M2nSource& local = *sink.local;
  std::vector<float> back(static_cast<size_t>(local.tokens * k * h));
  PIPER_RETURN_IF_ERROR(ffn_group_exchange(t.comm, rows.rows->data(), sink.rows_from, back.data(), local.rows_to, h,
                                           core.dist->timeout_s()));
  std::shared_ptr<Tensor> out = combine_rows(local, back.data(), h, k, scale, core.allocator);
  return post_same_dp(true, out->data(), static_cast<size_t>(out->nbytes()), out);
}

// experts -> next F (attention rank): the weighted sum in slot order plus the residual.
Status M2n::Call::combine_recv() {
  PIPER_ASSIGN_OR_RETURN(auto s, source_state());
  const size_t total = static_cast<size_t>(s->tokens * k);
  auto back = std::make_shared<std::vector<float>>(total * static_cast<size_t>(h));
  PIPER_RETURN_IF_ERROR(post_blocks(false, back->data(), s->rows_to, static_cast<size_t>(h), back));
  std::shared_ptr<Tensor> out = combine_rows(*s, back->data(), h, k, scale, core.allocator);
  Activation a;
  a.hidden = std::move(out);
  core.publish_message(t, std::move(a));
  return ok_status();
}

// next -> experts B (attention rank): the scaled output gradient dispatched like the tokens; the unscaled one is
// kept as the residual's gradient for the router.
Status M2n::Call::combine_grad_send() {
  PIPER_ASSIGN_OR_RETURN(Gradient g, core.take_message<Gradient>(t, t.source));
  PIPER_ASSIGN_OR_RETURN(auto s, source_state());
  if (!g.dhidden || g.dhidden->numel() != s->tokens * h) {
    return internal_error("'" + in.label + "': the gradient is not [tokens, hidden]");
  }
  {
    std::lock_guard<std::mutex> lock(x.mu_);
    if (s->dresidual) {
      return unimplemented("'" + in.label + "': the experts' output of layer " + std::to_string(layer) +
                           " has two consumers; the runtime's M2N combine serves one");
    }
    s->dresidual = g.dhidden;
  }
  auto rows = scatter_grad(*s, g.dhidden->data(), h, k, scale);
  return post_blocks(true, rows->data(), s->rows_to, static_cast<size_t>(h), rows);
}

// next -> experts B (FFN rank): the row gradients in the forward's receive order.
Status M2n::Call::combine_grad_recv() {
  PIPER_ASSIGN_OR_RETURN(auto sink, sink_state());
  size_t total = 0;
  for (size_t n : sink->rows_from) total += n;
  PIPER_ASSIGN_OR_RETURN(Tensor t_rows,
                         Tensor::zeros({static_cast<int64_t>(total), h}, MemCategory::kBuffers, core.allocator));
  auto rows_t = std::make_shared<Tensor>(std::move(t_rows));
  PIPER_RETURN_IF_ERROR(post_blocks(false, rows_t->data(), sink->rows_from, static_cast<size_t>(h), rows_t));
  auto got = std::make_shared<EpRows>();
  got->rows = std::move(rows_t);
  Gradient g;
  g.ep = std::move(got);
  core.publish_message(t, std::move(g));
  return ok_status();
}

// experts -> router B (FFN rank): each source's input-gradient rows, then its routing-weight gradients.
Status M2n::Call::dispatch_grad_send() {
  PIPER_ASSIGN_OR_RETURN(Gradient g, core.take_message<Gradient>(t, t.source));
  PIPER_ASSIGN_OR_RETURN(auto sink, sink_state());
  if (!g.ep || !g.ep->rows) return internal_error("'" + in.label + "': the experts chunk produced no row gradients");
  const size_t stride = static_cast<size_t>(h) + 1;
  auto packed = std::make_shared<std::vector<float>>();
  size_t total = 0;
  for (size_t n : sink->rows_from) total += n;
  if (g.ep->rows->numel() != static_cast<int64_t>(total) * h || g.ep->dweight.size() != total) {
    return internal_error("'" + in.label + "': the experts' row gradients do not match the received rows");
  }
  packed->resize(total * stride);
  size_t r = 0;
  for (size_t s = 0; s < peers; ++s) {
    const size_t n = sink->rows_from[s];
    float* block = packed->data() + r * stride;
    if (n > 0) {
      std::memcpy(block, g.ep->rows->data() + r * static_cast<size_t>(h), n * static_cast<size_t>(h) * sizeof(float));
      std::memcpy(block + n * static_cast<size_t>(h), g.ep->dweight.data() + r, n * sizeof(float));
    }
    r += n;
  }
  PIPER_RETURN_IF_ERROR(post_blocks(true, packed->data(), sink->rows_from, stride, packed));
  if (t.m2n_local) {
    // The head's gradient is the residual's: back to the same-dp source for its router.
    if (!sink->local || !sink->local->dresidual) {
      return internal_error("'" + in.label + "' runs before the head's gradient reached the experts");
    }
    const std::shared_ptr<const Tensor>& dres = sink->local->dresidual;
    PIPER_RETURN_IF_ERROR(
        post_same_dp(true, const_cast<float*>(dres->data()), static_cast<size_t>(dres->nbytes()), dres));
  }
  std::lock_guard<std::mutex> lock(x.mu_);
  x.sinks_.erase(key);
  return ok_status();
}

// Row slot_row[i] lies in peer dest[i]'s block at (slot_row[i] - first[d]): rows, then dweights.
Result<Gradient> M2n::Call::router_grads(const M2nSource& s, const std::vector<float>& packed,
                                         const std::vector<size_t>& first) const {
  const size_t stride = static_cast<size_t>(h) + 1;
  PIPER_ASSIGN_OR_RETURN(Tensor dn, Tensor::zeros({s.tokens, h}, MemCategory::kBuffers, core.allocator));
  PIPER_ASSIGN_OR_RETURN(Tensor dw, Tensor::zeros({s.tokens, k}, MemCategory::kBuffers, core.allocator));
  auto dnormed = std::make_shared<Tensor>(std::move(dn));
  auto dtopk_w = std::make_shared<Tensor>(std::move(dw));
  auto row_of = [&](size_t i) {
    const size_t d = static_cast<size_t>(s.dest[i]);
    return packed.data() + first[d] * stride + (s.slot_row[i] - first[d]) * static_cast<size_t>(h);
  };
  auto dweight_of = [&](size_t i) {
    const size_t d = static_cast<size_t>(s.dest[i]);
    return packed.data()[first[d] * stride + s.rows_to[d] * static_cast<size_t>(h) + (s.slot_row[i] - first[d])];
  };
  for (int64_t tok = 0; tok < s.tokens; ++tok) {
    float* acc = dnormed->data() + tok * h;
    for (int j = 0; j < k; ++j) {
      const size_t i = static_cast<size_t>(tok * k + j);
      const float* row = row_of(i);
      for (int64_t col = 0; col < h; ++col) acc[col] += 1.0f * row[col];
      dtopk_w->data()[i] = dweight_of(i);
    }
  }
  Gradient g;
  g.dnormed = std::move(dnormed);
  g.dtopk_w = std::move(dtopk_w);
  return g;
}

// experts -> router B (attention rank): dnormed, dtopk_w and the residual gradient, the router's backward input.
Status M2n::Call::dispatch_grad_recv() {
  PIPER_ASSIGN_OR_RETURN(auto s, source_state());
  const size_t stride = static_cast<size_t>(h) + 1;
  const size_t total = static_cast<size_t>(s->tokens * k);
  auto packed = std::make_shared<std::vector<float>>(total * stride);
  std::vector<size_t> first(peers + 1, 0);
  for (size_t d = 0; d < peers; ++d) first[d + 1] = first[d] + s->rows_to[d];
  PIPER_RETURN_IF_ERROR(post_blocks(false, packed->data(), s->rows_to, stride, packed));
  if (t.m2n_local) {  // the residual's gradient: the head's, from the same-dp FFN rank
    auto dres = std::make_shared<Tensor>(Tensor::zeros_or_die({s->tokens, h}, MemCategory::kBuffers, core.allocator));
    PIPER_RETURN_IF_ERROR(post_same_dp(false, dres->data(), static_cast<size_t>(dres->nbytes()), dres));
    std::lock_guard<std::mutex> lock(x.mu_);
    s->dresidual = std::move(dres);
  }
  {
    // The FFN ranks sent these rows after the experts' backward, which needed the output gradient that this
    // rank's combine B send recorded first.
    std::lock_guard<std::mutex> lock(x.mu_);
    if (!s->dresidual) {
      return internal_error("'" + in.label + "' received the experts' gradients before this rank sent theirs");
    }
  }
  PIPER_ASSIGN_OR_RETURN(Gradient g, router_grads(*s, *packed, first));
  {
    std::lock_guard<std::mutex> lock(x.mu_);
    g.dhidden = s->dresidual;
    x.sources_.erase(key);
  }
  core.publish_message(t, std::move(g));
  return ok_status();
}

// The experts of the FFN group exchange rows among themselves (pairwise all-to-all-v on the group's ep
// communicator, rank i = dp coordinate block + i; a single FFN rank per block copies).
namespace {

Status ffn_group_exchange(comm::Communicator* group, const float* send, const std::vector<size_t>& send_rows,
                          float* recv, const std::vector<size_t>& recv_rows, int64_t h, double timeout_s) {
  if (group == nullptr) {
    if (send_rows.size() != 1 || recv_rows.size() != 1 || send_rows[0] != recv_rows[0]) {
      return internal_error("m2n: an FFN group of one rank exchanges with itself only");
    }
    std::memcpy(recv, send, send_rows[0] * static_cast<size_t>(h) * sizeof(float));
    return ok_status();
  }
  std::vector<size_t> sb(send_rows.size()), rb(recv_rows.size());
  for (size_t i = 0; i < sb.size(); ++i) sb[i] = send_rows[i] * static_cast<size_t>(h) * sizeof(float);
  for (size_t i = 0; i < rb.size(); ++i) rb[i] = recv_rows[i] * static_cast<size_t>(h) * sizeof(float);
  return comm::pairwise_all_to_all_v(*group, send, sb, recv, rb, timeout_s);
}

}  // namespace

std::shared_ptr<M2nSink> M2n::find_sink(std::pair<int, int> key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sinks_.find(key);
  return it == sinks_.end() ? nullptr : it->second;
}

Result<std::shared_ptr<const Tensor>> M2n::combine_local(const Task& reader, ir::NodeId src, int mb,
                                                         const Activation& a, comm::Communicator* group) {
  const int64_t h = core_.model->dims().hidden;
  const int k = core_.model->dims().top_k;
  const float scale = static_cast<float>(core_.model->dims().routed_scaling);
  // The experts' output rows of this FFN rank (every source's) -> the same-dp source's tokens, combined.
  const auto key = std::make_pair(core_.instr_of(src).layer, mb);
  std::shared_ptr<M2nSink> sink = find_sink(key);
  if (sink == nullptr || sink->local == nullptr || !a.ep || !a.ep->rows) {
    return internal_error("'" + reader.in->label + "': expert rows of layer " + std::to_string(key.first) +
                          " without the routing of their same-dp source");
  }
  const M2nSource& local = *sink->local;
  std::vector<float> back(static_cast<size_t>(local.tokens * k * h));
  PIPER_RETURN_IF_ERROR(ffn_group_exchange(group, a.ep->rows->data(), sink->rows_from, back.data(), local.rows_to, h,
                                           core_.dist->timeout_s()));
  return std::shared_ptr<const Tensor>(combine_rows(local, back.data(), h, k, scale, core_.allocator));
}

Result<comm::Communicator*> M2n::combine_comm_off_compute() {
  comm::Communicator* group = core_.dist->group("ep");
  if (group == nullptr) return nullptr;
  if (combine_off_compute_ == nullptr) {
    PIPER_ASSIGN_OR_RETURN(combine_off_compute_, group->dup("m2n_combine_tp"));
  }
  return combine_off_compute_.get();
}

Status M2n::local_inputs(const Task& t, std::vector<Activation>* inputs) {
  if (!active_ || t.chunk == nullptr || t.chunk->part() == Part::kExperts) return ok_status();
  for (size_t i = 0; i < inputs->size() && i < t.sources.size(); ++i) {
    Activation& a = (*inputs)[i];
    if (!a.ep || a.hidden) continue;
    Activation out;
    PIPER_ASSIGN_OR_RETURN(out.hidden, combine_local(t, t.sources[i], t.mb, a, core_.dist->group("ep")));
    a = std::move(out);
  }
  return ok_status();
}

Status M2n::local_grads(const Task& t, std::vector<Gradient>* grads) {
  if (!active_ || t.chunk == nullptr || t.chunk->part() != Part::kExperts) return ok_status();
  if (grads->size() != 1 || (*grads)[0].ep || !(*grads)[0].dhidden) return ok_status();
  // The head's gradient of the same-dp source's tokens -> the row gradients of this rank's experts.
  const int64_t h = core_.model->dims().hidden;
  const int k = core_.model->dims().top_k;
  const float scale = static_cast<float>(core_.model->dims().routed_scaling);
  const auto key = std::make_pair(t.chunk->layer(), t.mb);
  std::shared_ptr<M2nSink> sink = find_sink(key);
  if (sink == nullptr || sink->local == nullptr) {
    return internal_error("'" + t.in->label + "': a gradient for the experts of layer " + std::to_string(key.first) +
                          " without the routing of their same-dp source");
  }
  const Gradient& g = (*grads)[0];
  if (g.dhidden->numel() != sink->local->tokens * h) {
    return internal_error("'" + t.in->label + "': the head's gradient is not [tokens, hidden]");
  }
  sink->local->dresidual = g.dhidden;  // back to the source with the experts' input gradients
  auto rows = scatter_grad(*sink->local, g.dhidden->data(), h, k, scale);
  size_t total = 0;
  for (size_t n : sink->rows_from) total += n;
  auto got = std::make_shared<EpRows>();
  auto rows_t = std::make_shared<Tensor>(
      Tensor::zeros_or_die({static_cast<int64_t>(total), h}, MemCategory::kBuffers, core_.allocator));
  PIPER_RETURN_IF_ERROR(ffn_group_exchange(core_.dist->group("ep"), rows->data(), sink->local->rows_to, rows_t->data(),
                                           sink->rows_from, h, core_.dist->timeout_s()));
  got->rows = std::move(rows_t);
  Gradient out;
  out.ep = std::move(got);
  (*grads)[0] = std::move(out);
  return ok_status();
}

}  // namespace piper::runtime::detail
