// The af-pipe closed form (CostModel::estimate for disagg=1): the plan the compiler lowers, in arithmetic.
//
// Placement (ir/passes/disaggregate.cc): with a = pp attention and f = ffn_ranks / (dp*tp) FFN pipeline ranks of
// dp*tp ranks each, layer l's attention side (attention, norms, router; the embedding with layer 0) runs on attention
// rank l mod a and its FFN side (routed experts, shared experts or the dense MLP; the head with the last layer) on
// FFN rank l mod f. Every data edge between the sides is one m2n exchange, per microbatch and attention rank:
//   forward   A->F: the router's output to the experts (top_k rows per token) + the attention output to the
//                   shared experts or the dense MLP (one row); F->A: the experts' output (top_k rows where the
//                   router's rank combines, one combined row where the FFN group does) + the shared experts' (one)
//   backward  the transposes: A->F the next layer's input gradient to the experts (top_k rows or one, as the
//             combine) and to the shared experts (one), F->A the experts' input gradients (top_k rows: the
//             dispatch's gradient) + the shared experts' (one)
// The router's rank combines when the next layer's attention runs on it (one attention rank, a = 1); otherwise,
// and for the last layer (whose experts feed the head), the FFN group does (compile/exec_info.cc combine_on_ffn).
// The last layer's FFN side feeds the head on its own rank: no F->A forward and no A->F backward there. Bytes are
// the hidden state in the wire dtype (the plan carries no fp8 dispatch across the sides), a rank's token slice
// (1/tp) under sequence parallelism.
// Tensor parallelism (sp=1): attention, the dense MLP and the shared experts are split over tp and each gathers its
// input and reduce-scatters its output, forward and backward, on the rank's compute path (tp_s); their parameters,
// the embedding's and the head's (vocabulary parallel) are 1/tp, the norms', the router's and the experts' whole;
// the activations are the tp-split per-token counts (spec/activation_counting.h).
// Time: compute, sends and receives run on separate streams (every channel its own), so per microbatch a rank is
// busy max(compute + tp_s, NIC), the NIC carrying the larger of its send and receive bytes (full duplex) and, under
// ZeRO-2/3, the per-microbatch gathers and reduce-scatters of its parameters. With a NIC split (attn_ports,
// ffn_ports; nic_split.h) a side's exchange runs at its share of the ports' bandwidth (the round trip's hop at the
// slower side's); its ZeRO collectives keep the NIC's own bandwidth. The step is m times the slowest
// rank's busy time, plus the fill of the chain of a + f ranks (one layer-side per hop, the interleaved rule
// (P - 1) chunks with P = a + f), plus that rank's gradient synchronisation left exposed and its optimizer step.
// Memory: the ranks' own parameters (the experts sharded over ep, replicated dp / ep times) and the activations of
// the layer-sides in flight: the interleaved count for equal groups (the af-pipe schedule's order), min(m, P)
// microbatches of every layer-side otherwise (af_pipe.cc's chain order).
#include <algorithm>
#include <string>
#include <vector>

#include "piper/cost/activations.h"
#include "piper/cost/estimate.h"
#include "piper/cost/estimate_internal.h"
#include "piper/cost/nic_split.h"

namespace piper::cost {
namespace {

// One layer's m2n bytes per microbatch and attention rank, both directions, both passes.
struct AfLayerBytes {
  double a2f = 0, f2a = 0;
  int msgs = 0;  // exchanges each way
};

AfLayerBytes af_layer_bytes(bool moe, bool shared, bool last, double hidden, double top_k, bool attn_combines) {
  const int edges_in = moe ? (shared ? 2 : 1) : 1;
  if (!moe) return {(last ? 1 : 2) * hidden, (last ? 1 : 2) * hidden, (last ? 1 : 2) * edges_in};
  const double one = shared ? hidden : 0.0;  // the shared experts' row, either way
  const double routed = top_k * hidden;
  const double combine = (attn_combines && !last) ? routed : hidden;
  // A->F: dispatch (F) and, but for the last layer, the combine's gradient (B); F->A: the combine (F, but for the
  // last layer) and the dispatch's gradient (B).
  const double a2f = routed + one + (last ? 0.0 : combine + one);
  const double f2a = routed + one + (last ? 0.0 : combine + one);
  return {a2f, f2a, (last ? 1 : 2) * edges_in};
}

// One pipeline rank of either side, per microbatch.
struct AfRank {
  bool ffn = false;
  int layers = 0;
  Fbw t;                          // compute
  double tp_s = 0;                // its chunks' tp all-gathers and reduce-scatters, in line with the compute
  double send_b = 0, recv_b = 0;  // m2n bytes
  int msgs = 0;                   // m2n exchanges each way
  double dense_params = 0, expert_params = 0;
  double act_b = 0;       // activation bytes of all its layer-sides for one microbatch
  double head_act_b = 0;  // the head's, for one microbatch (held for a different count: af_memory)
};

// The ranks of one pipeline slice and the chain's round trip: one microbatch's forward and backward through every
// layer-side and every exchange between them, with nothing else running.
struct AfChain {
  std::vector<AfRank> ranks;  // attention ranks 0 .. a-1, FFN ranks a .. a+f-1
  double round_trip_s = 0;
};

// Seconds of `bytes` in `msgs` exchanges between the sides; across nodes the NICs carry nic_scale times their
// bandwidth (af-pipe's NIC split, nic_split.h).
double af_hop_s(const CostModel& cm, bool cross_node, double bytes, int msgs, double nic_scale) {
  const Network& net = cm.network();
  return bytes / (cross_node ? net.nic_bw_per_device() * nic_scale : net.intra_bw()) +
         msgs * net.p2p_s(1, cross_node);
}

// Per microbatch: each rank's parts, exchanges, parameters and activations, and the chain's round trip.
AfChain af_chain(const CostModel& cm, const Strategy& s, const NicSplit& nics) {
  const ModelSpec& model = cm.model();
  const PartTable& table = cm.parts();
  const int a = s.pp, f = s.ffn_ranks / (s.dp * s.tp), L = model.num_layers;
  const double T = static_cast<double>(s.mbs) * static_cast<double>(cm.train().seq_len);
  // Under sequence parallelism a rank exchanges its token slice (ir/passes/disaggregate.cc).
  const double hidden = T * table.hidden * cm.train().comm_bytes() / (s.sp ? s.tp : 1);
  // A tp-split block (attention; the dense MLP or the shared experts) gathers its input and reduce-scatters its
  // output, forward and backward: two all-reduces' time (the compiled plan's tp collectives; the experts are whole).
  const double tp_block_s = s.tp > 1 ? 2 * cm.network().all_reduce_s(T * table.hidden * cm.train().comm_bytes(),
                                                                     cm.network().layout(s.tp, 1), AllReduceAlgo::kRing)
                                     : 0.0;
  const bool shared = model.is_moe() && table.shared_params > 0;
  const PartShape shape = cm.part_shape(s, cm.calibration());
  const TaskScales scales = cm.task_scales(shape.tokens);
  auto part = [&](Part q) {
    return with_recompute(scaled(part_fbw(part_cost(table, q, shape), cm.device_for(q)), scales, q), q, s.recompute);
  };
  Fbw attn_t = part(Part::kAttention);
  attn_t += part(Part::kAttentionCore);
  attn_t += part(Part::kNorms);
  Fbw moe_ffn_t = part(Part::kExperts);
  if (shared) moe_ffn_t += part(Part::kSharedExperts);
  const Fbw router_t = part(Part::kRouter), mlp_t = part(Part::kDenseMlp);

  ActivationOptions ao;
  ao.tp = s.tp;
  ao.sp = s.sp;
  ao.recompute = s.recompute;
  ao.recompute_moe_norm = s.recomputes_module("layernorm");
  ao.recompute_moe_act = s.recomputes_module("moe_act");
  ao.seq_len = cm.train().seq_len;
  ao.act_bytes = cm.train().activation_bytes();
  ao.expert_load = cm.calibration().memory_load();  // the FFN rank that holds the most rows at its peak
  const LayerActivation act_dense = layer_activation_bytes_per_token(model, false, ao);
  const LayerActivation act_moe = model.is_moe() ? layer_activation_bytes_per_token(model, true, ao) : act_dense;

  const bool cross = cm.cluster().num_nodes > 1;
  AfChain chain;
  std::vector<AfRank>& ranks = chain.ranks;
  ranks.resize(static_cast<size_t>(a + f));
  for (int r = 0; r < a + f; ++r) ranks[static_cast<size_t>(r)].ffn = r >= a;
  for (int l = 0; l < L; ++l) {
    const bool moe = model.is_moe_layer(l);
    const AfLayerBytes bytes = af_layer_bytes(moe, shared, l == L - 1, hidden, table.top_k, a == 1);
    const LayerActivation& act = moe ? act_moe : act_dense;
    AfRank& A = ranks[static_cast<size_t>(l % a)];
    AfRank& F = ranks[static_cast<size_t>(a + l % f)];
    ++A.layers;
    ++F.layers;
    A.t += moe ? attn_t + router_t : attn_t;
    A.tp_s += tp_block_s;
    A.dense_params += table.attention_params / s.tp + table.norm_params_per_layer + (moe ? table.router_params : 0.0);
    A.act_b += T * (act.attention + act.norms);
    F.t += moe ? moe_ffn_t : mlp_t;
    const bool ffn_split = !moe || shared;  // the dense MLP or the shared experts
    F.tp_s += ffn_split ? tp_block_s : 0.0;
    F.dense_params += (moe ? table.shared_params : table.dense_mlp_params) / s.tp;
    F.expert_params += moe ? table.num_experts / s.ep * table.expert_params : 0.0;
    F.act_b += T * act.mlp;
    A.send_b += bytes.a2f;
    A.recv_b += bytes.f2a;
    F.recv_b += bytes.a2f;
    F.send_b += bytes.f2a;
    A.msgs += bytes.msgs;
    F.msgs += bytes.msgs;
    chain.round_trip_s += (moe ? attn_t + router_t : attn_t).total() + (moe ? moe_ffn_t : mlp_t).total() +
                          tp_block_s * (ffn_split ? 2 : 1) +
                          af_hop_s(cm, cross, bytes.a2f + bytes.f2a, 2 * bytes.msgs,
                                   std::min(nics.attn_scale, nics.ffn_scale));
  }
  AfRank& first = ranks[0];
  const Fbw emb_t = part(Part::kEmbedding), head_t = part(Part::kHead);
  chain.round_trip_s += emb_t.total() + head_t.total();
  first.t += emb_t;
  first.dense_params += table.embedding_params / s.tp;  // vocabulary parallel
  first.act_b += T * embedding_activation_bytes_per_token(model, ao);
  AfRank& last = ranks[static_cast<size_t>(a + (L - 1) % f)];  // the head sits with the last layer's FFN side
  last.t += head_t;
  last.dense_params += table.head_params / s.tp;  // tied or not: the embedding's rank is another one
  last.head_act_b = T * head_activation_bytes_per_token(model, ao);
  return chain;
}

// NIC seconds per microbatch of ZeRO-2/3's per-microbatch collectives of x's parameters (the compiler's replicate
// pass: ZeRO-2 reduce-scatters each chunk's gradients, ZeRO-3 also gathers its parameters before F and before B).
double af_zero_nic_s(const CostModel& cm, const Strategy& s, const AfRank& x, const GroupLayout& dp,
                     const GroupLayout& edp) {
  if (s.zero < 2) return 0;
  const Network& net = cm.network();
  const ByteConvention& b = cm.bytes();
  double t = net.reduce_scatter_s(x.dense_params * b.grad, dp) + net.reduce_scatter_s(x.expert_params * b.grad, edp);
  if (s.zero >= 3) {
    t += 2 * (net.all_gather_s(x.dense_params * b.param, dp) + net.all_gather_s(x.expert_params * b.param, edp));
  }
  return t;
}

// Gradient synchronisation left exposed after x's last backward, and the parameter gather after its step.
double af_dp_tail_s(const CostModel& cm, const Strategy& s, const AfRank& x, const GroupLayout& dp,
                    const GroupLayout& edp) {
  const Network& net = cm.network();
  const ByteConvention& b = cm.bytes();
  const double grads = x.dense_params * b.grad, expert_grads = x.expert_params * b.grad;
  const double params = x.dense_params * b.param, expert_params = x.expert_params * b.param;
  const double t_b = x.t.b + x.t.w, t_f = x.t.f;
  if (s.zero == 0) return std::max(0.0, net.all_reduce_s(grads, dp) + net.all_reduce_s(expert_grads, edp) - t_b);
  const double gather = std::max(0.0, net.all_gather_s(params, dp) + net.all_gather_s(expert_params, edp) - t_f);
  if (s.zero == 1) {
    return std::max(0.0, net.reduce_scatter_s(grads, dp) + net.reduce_scatter_s(expert_grads, edp) - t_b) + gather;
  }
  return s.zero == 2 ? gather : 0.0;  // ZeRO-2/3 reduce per microbatch (af_zero_nic_s); ZeRO-3 gathers per use
}

// Whether the schedule runs the interleaved order: equal groups and the microbatches in whole rounds of the
// chain's ranks (af_pipe.cc, interleaved_ops' rule); otherwise the chain order.
bool af_interleaved(const Strategy& s, int ranks) {
  const int m = s.microbatches;
  return 2 * s.pp == ranks && m >= ranks && m % std::max(1, m / ranks) == 0;
}

// Memory of pipeline rank r (chain position: attention rank i at 2i, FFN rank j at 2j + 1 with equal groups).
MemoryBreakdown af_memory(const CostModel& cm, const Strategy& s, const AfRank& x, int r) {
  const int a = s.pp, f = s.ffn_ranks / (s.dp * s.tp), P = a + f, m = s.microbatches, v = std::max(1, x.layers);
  MemoryBreakdown mem;
  ModelStateBytes st = model_state_bytes(x.dense_params, s.zero, s.dp, cm.bytes());
  st += model_state_bytes(x.expert_params, s.zero, std::max(1, s.expert_replicas()), cm.bytes());
  mem.params = st.params;
  mem.grads = st.grads;
  mem.optimizer = st.optimizer;
  // Layer-side units (one layer's side, one microbatch) in flight: the interleaved order's count for equal groups,
  // min(m, P) whole microbatches for the chain order of unequal ones.
  // The head, the last stage, holds one microbatch in the interleaved order (its backward follows its forward)
  // and min(m, P) in the chain order (all of them run their forward before the first backward).
  double units = static_cast<double>(std::min(m, P)) * v, head_units = std::min(m, P);
  if (af_interleaved(s, P)) {
    const int pos = r < a ? 2 * r : 2 * (r - a) + 1;
    units = std::min(2 * (P - pos - 1) + (v - 1) * P + 1, m * v);
    head_units = 1;
  }
  mem.activations = units * x.act_b / v + head_units * x.head_act_b;
  // Staging of one layer's exchanges (both directions), the workspace, ZeRO-2/3's gradient bucket and gathered
  // parameters of the largest layer-side (two under ZeRO-3: running and prefetched).
  const double largest = (x.dense_params + x.expert_params) / v;
  mem.buffers = cm.calibration().workspace_bytes + (x.send_b + x.recv_b) / v;
  if (s.zero >= 2) mem.buffers += largest * cm.bytes().grad;
  if (s.zero >= 3) mem.buffers += 2 * largest * cm.bytes().param;
  return mem;
}

// The compiler's rules for an af-pipe plan (compile/strategy_directives.cc, which the cost module cannot call):
// every pipeline rank on dp ranks, ep inside them, a layer for every rank, equal groups dividing the layers.
Status af_check(const ModelSpec& model, const Strategy& s) {
  const std::string what = "estimate: af-pipe " + s.to_string() + ": ";
  const int width = s.dp * s.tp;
  if (s.ffn_ranks < width || s.ffn_ranks % width != 0) {
    return invalid_argument(what + "every FFN pipeline rank runs on dp*tp = " + std::to_string(width) +
                            " ranks, so ffn_ranks=" + std::to_string(s.ffn_ranks) + " must be a multiple of it");
  }
  if (s.ep < 1 || s.dp % s.ep != 0) {
    return invalid_argument(what + "ep=" + std::to_string(s.ep) + " must divide dp=" + std::to_string(s.dp));
  }
  const int f = s.ffn_ranks / width, L = model.num_layers;
  if (L < std::max(s.pp, f)) {
    return invalid_argument(what + "num_layers=" + std::to_string(L) + " cannot give each of pp=" +
                            std::to_string(s.pp) + " attention and " + std::to_string(f) +
                            " FFN pipeline ranks a layer; lower pp or ffn_ranks");
  }
  if (f == s.pp && L % s.pp != 0) {
    return invalid_argument(what + "equal groups deal num_layers=" + std::to_string(L) + " round-robin: pp=" +
                            std::to_string(s.pp) + " must divide it");
  }
  return ok_status();
}

}  // namespace

Status CostModel::estimate_af_pipe(const Strategy& s, Estimate* out) const {
  PIPER_RETURN_IF_ERROR(af_check(model_, s));
  PIPER_ASSIGN_OR_RETURN(const NicSplit nics, nic_split(s, cluster_));
  const AfChain chain = af_chain(*this, s, nics);
  const std::vector<AfRank>& ranks = chain.ranks;
  const int P = static_cast<int>(ranks.size()), m = s.microbatches;
  const bool cross = cluster_.num_nodes > 1;
  // Ranks tp innermost (compile::Plan::rank_of): dp at stride tp; the experts' replicas are the dp / ep ranks of
  // an expert block at stride tp * ep, times the tp ranks (etp = 1: every tensor rank keeps whole experts).
  const GroupLayout dp = net_.layout(s.dp, s.tp);
  const GroupLayout edp_dp = net_.layout(std::max(1, s.dp / s.ep), s.tp * s.ep);
  const GroupLayout edp = s.tp > 1 ? net_.combine(net_.layout(s.tp, 1), edp_dp, s.tp * s.ep) : edp_dp;
  out->ranks.resize(static_cast<size_t>(P));
  out->device_memory_bytes = static_cast<double>(cluster_.device.memory_bytes);
  const double update_scale = task_scales(part_shape(s, calibration_).tokens).update;
  double worst_total = -1, worst_time = -1, chunk[2] = {0, 0};
  double busy_b = 0, nic_b = 0, copies_b = 0, tail_b = 0, opt_b = 0;
  // On a node whose ranks share its cores, each transferred byte is copied by those cores (copy_cost.h): a rank's
  // half of each m2n exchange per microbatch, and its data-parallel bytes per step (and their staging), at its
  // static share.
  const double at = copy_seconds_per_byte_at_share(*this, CopyKind::kExchanged);
  const double stage_at = staging_seconds_per_byte_at_share(*this);
  auto f = [](int n) { return n > 1 ? (n - 1.0) / n : 0.0; };
  for (int r = 0; r < P; ++r) {
    const AfRank& x = ranks[static_cast<size_t>(r)];
    out->ranks[static_cast<size_t>(r)] = af_memory(*this, s, x, r);
    if (out->ranks[static_cast<size_t>(r)].total() > worst_total) {
      worst_total = out->ranks[static_cast<size_t>(r)].total();
      out->worst_rank = r;
    }
    // Per microbatch: compute against the NIC (the larger direction, ZeRO-2/3's collectives on the same NIC).
    const double nic = af_hop_s(*this, cross, std::max(x.send_b, x.recv_b), x.msgs,
                                x.ffn ? nics.ffn_scale : nics.attn_scale) +
                       af_zero_nic_s(*this, s, x, dp, edp);
    const double copies = at * (x.send_b + x.recv_b) / 2;
    const double busy = std::max(x.t.total() + x.tp_s + copies, nic);
    chunk[x.ffn ? 1 : 0] = std::max(chunk[x.ffn ? 1 : 0], busy / std::max(1, x.layers));
    const double shard = s.zero >= 1 ? x.dense_params / s.dp + x.expert_params / std::max(1, s.expert_replicas())
                                     : x.dense_params + x.expert_params;
    const double opt = update_scale * device_.time_s(0, shard * optimizer_step_bytes_per_param(bytes_), 0);
    const double dp_copies =
        dp_copy_seconds(*this, s.zero, m, f(dp.size), f(edp.size), x.dense_params * bytes_.grad,
                        x.expert_params * bytes_.grad, x.dense_params * bytes_.param, x.expert_params * bytes_.param);
    const double staging = stage_at * dp_staging_bytes(s.zero, m, dp.size, edp.size, x.dense_params * bytes_.grad,
                                                       x.expert_params * bytes_.grad, x.dense_params * bytes_.param,
                                                       x.expert_params * bytes_.param);
    const double tail = std::max(af_dp_tail_s(*this, s, x, dp, edp), dp_copies + staging);
    if (m * busy + tail + opt > worst_time) {
      worst_time = m * busy + tail + opt;
      out->bottleneck_rank = r;
      busy_b = busy;
      nic_b = nic;
      copies_b = copies;
      tail_b = tail;
      opt_b = opt;
    }
  }
  out->memory = out->ranks[static_cast<size_t>(out->worst_rank)];
  out->fits = out->memory.total() <= out->device_memory_bytes;
  const Fbw& t = ranks[static_cast<size_t>(out->bottleneck_rank)].t;
  out->t_f_s = t.f;
  out->t_b_s = t.b + t.w;
  out->t_w_s = t.w;
  out->comm = CommBreakdown{};
  // The m2n exchanges (and ZeRO-2/3's) not under compute, and at least a shared-core node's copies of them.
  out->comm.ep_s = m * std::max({0.0, nic_b - t.total(), copies_b});
  out->comm.dp_s = tail_b;
  out->time.compute_s = m * t.total();
  out->time.exposed_comm_s = out->comm.ep_s + out->comm.dp_s;
  // Fill: the chain of P ranks, one layer-side per hop. The chain also bounds the steady state: the interleaved
  // order takes P microbatches a round; the chain order (unequal groups, or microbatches not in whole rounds) a
  // rank's next microbatch only after the previous one's whole pass (af_pipe.cc), one at a time. What the round
  // trips take beyond the busy time is idle time too.
  const double fill = (P - 1) * (chunk[0] + chunk[1]) / 2;
  const int ahead = af_interleaved(s, P) ? P : 1;
  const double rounds = static_cast<double>(m) / ahead * chain.round_trip_s;
  out->time.bubble_s = std::max(fill, rounds - m * busy_b);
  out->time.optimizer_s = opt_b;
  finish_step(s, static_cast<double>(train_.seq_len), flops_per_token_, device_.peak_flops(), out);
  return ok_status();
}

}  // namespace piper::cost
