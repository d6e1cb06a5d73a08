#include "piper/cost/estimate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "piper/cost/activations.h"
#include "piper/cost/estimate_internal.h"
#include "piper/cost/pipeline_model.h"
#include "piper/cost/tp_overlap.h"
#include "piper/spec/counting.h"

namespace piper::cost {
namespace {

double dtype_width(DType d) { return d == DType::kFP32 ? 4 : d == DType::kFP8 ? 1 : 2; }

// Communication groups of the mesh: ranks are numbered with the first axis of `order` innermost.
struct MeshGroups {
  GroupLayout tp, ep, dp, expert_dp;
  GroupLayout etp;  // the etp consecutive tensor ranks that slice the same experts (size 1 folded: etp = 1)
  bool pp_cross_node = false;
};

MeshGroups mesh_groups(const Strategy& s, const Network& net) {
  int stride_tp = 1, stride_ep = 1, stride_dp = 1, stride_pp = 1;
  int stride = 1;
  for (const auto& axis : s.order) {
    if (axis == "tp") {
      stride_tp = stride;
      stride *= s.tp;
    } else if (axis == "ep") {
      stride_ep = stride;
      stride *= s.ep;
    } else if (axis == "dp") {
      stride_dp = stride;
      stride *= s.edp();
    } else {
      stride_pp = stride;
      stride *= s.pp;
    }
  }
  MeshGroups g;
  if (s.fold) {
    // MoE parallel folding (validated: default order, etp = 1): tp innermost, then dp, then pp; the expert
    // groups are ep consecutive ranks of a stage's tp*dp, their replicas tp*dp/ep ranks ep apart.
    g.tp = net.layout(s.tp, 1);
    g.dp = net.layout(s.dp, s.tp);
    g.ep = net.layout(s.ep, 1);
    g.expert_dp = net.layout(s.expert_replicas(), s.ep);
    g.pp_cross_node = s.pp > 1 && s.tp * s.dp >= net.devices_per_node();
    return g;
  }
  g.tp = net.layout(s.tp, stride_tp);
  g.etp = net.layout(s.etp, stride_tp);
  g.ep = net.layout(s.ep, stride_ep);
  GroupLayout edp = net.layout(s.edp(), stride_dp);
  g.dp = net.combine(g.ep, edp, stride_dp);
  // Expert replicas: the expert-data-parallel ranks, times the TP ranks that hold the same expert slice.
  g.expert_dp = s.tp / s.etp > 1 ? net.combine(net.layout(s.tp / s.etp, stride_tp * s.etp), edp, stride_dp) : edp;
  g.pp_cross_node = s.pp > 1 && stride_pp >= net.devices_per_node();
  return g;
}

}  // namespace

CostModel::CostModel(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train, const Calibration& cal,
                     const ByteConvention& bytes)
    : model_(model),
      cluster_(cluster),
      train_(train),
      calibration_(cal),
      bytes_(bytes),
      table_(make_part_table(model, train.seq_len)),
      net_(cluster),
      device_(cluster.device, train.gemm_dtype(), cal),
      device_hp_(cluster.device, train.param_dtype, cal),
      flops_per_token_(training_flops_per_token(model, train.seq_len)),
      halo_memo_(std::make_shared<HaloMemo>()) {}

void CostModel::set_halo_memo(bool on) { halo_memo_ = on ? std::make_shared<HaloMemo>() : nullptr; }

void CostModel::share_halo_memo(const CostModel& other) {
  if (halo_memo_ && other.halo_memo_) halo_memo_ = other.halo_memo_;
}

Result<CostModel> CostModel::create(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                    const Calibration& calibration) {
  PIPER_RETURN_IF_ERROR(model.validate());
  PIPER_RETURN_IF_ERROR(cluster.validate());
  if (train.seq_len < 1) return invalid_argument("train.seq_len=" + std::to_string(train.seq_len) + " must be >= 1");
  if (train.global_batch < 0)
    return invalid_argument("train.global_batch must be >= 0 (0 = take it from the strategy)");
  PIPER_ASSIGN_OR_RETURN(ByteConvention bytes, ByteConvention::from_train(train));
  CostModel cm(model, cluster, train, calibration, bytes);
  if (cm.device_.peak_flops() <= 0) {
    return invalid_argument("cluster " + cluster.name + ": device " + cluster.device.name + " has no peak FLOP/s for " +
                            to_string(train.param_dtype) + "; set it in the cluster file or change train.param_dtype");
  }
  if (train.precision != Precision::kBF16 && !(cluster.device.peak_flops_fp8 > 0)) {
    return invalid_argument("cluster " + cluster.name + ": device " + cluster.device.name +
                            " has no fp8 peak (device.peak_flops_fp8 = 0) for precision " + to_string(train.precision) +
                            "; use --precision bf16 or a device with fp8 tensor cores");
  }
  if (cluster.num_nodes > 1 && cm.net_.nic_bw_per_device() <= 0) {
    return invalid_argument("cluster " + cluster.name + ": " + std::to_string(cluster.num_nodes) +
                            " nodes but no NIC bandwidth; describe node.nics in the cluster file");
  }
  return cm;
}

const DeviceModel& CostModel::device_for(Part part) const {
  switch (part) {
    case Part::kAttention:
    case Part::kExperts:
    case Part::kSharedExperts:
    case Part::kDenseMlp:
      return device_;
    default:
      return device_hp_;
  }
}

int CostModel::moe_layers_before(int x) const {
  if (!model_.is_moe()) return 0;
  const int k = model_.moe.first_k_dense_layers;
  const int f = std::max(1, model_.moe.layer_freq);
  x = std::min(x, model_.num_layers);
  return x <= k ? 0 : (x - k + f - 1) / f;
}

Result<Estimate> CostModel::estimate(const Strategy& s) const {
  Estimate e;
  PIPER_RETURN_IF_ERROR(estimate(s, &e));
  return e;
}

PartShape CostModel::part_shape(const Strategy& s, const Calibration& cal) const {
  PartShape shape;
  shape.tokens = static_cast<double>(s.mbs) * static_cast<double>(train_.seq_len);
  shape.tp = s.tp;
  shape.ep = s.ep;
  shape.etp = s.etp;
  shape.sp = s.sp;
  // Working activations (what the kernels read and write): the activation dtype, or bf16 when the stash is fp8
  // (fp8 exists only as the GEMM inputs; norms, the activation function and residuals run in bf16).
  shape.act_bytes = train_.precision == Precision::kBF16 ? dtype_width(train_.activation_dtype) : 2.0;
  quantize_bytes_per_element(train_.precision, &shape.quantize_f_bytes, &shape.quantize_b_bytes);
  shape.param_bytes = bytes_.param;
  shape.grad_bytes = bytes_.grad;
  shape.expert_load = cal.expert_load_imbalance;
  shape.attention_score_bytes = cal.attention_score_bytes;
  shape.recompute_moe_norm = s.recomputes_module("layernorm");
  shape.recompute_moe_act = s.recomputes_module("moe_act");
  return shape;
}

// The runtime's HALO messages (halo_traffic.h, the simulator's flows): the forward dispatch in
// dispatch_bytes_per_token (fp8 under DeepSeek-V3's recipe), the combine's backward (a dispatch) in the wire dtype,
// and two combines (forward, and the dispatch's backward). Building the messages is O(group size^2), so the time
// is memoised per (shape, link, tokens): the planner asks for the same few groups for 100,000s of strategies.
Result<double> CostModel::halo_ep_layer_s(const GroupLayout& ep_group, double tokens) const {
  const HaloGroupShape halo_shape = net_.halo_shape(ep_group);
  const HaloLinkModel link = net_.halo_link(ep_group);
  const HaloRouting routing{static_cast<int>(table_.num_experts), static_cast<int>(table_.top_k),
                            std::max(1, model_.moe.num_groups), std::max(1, model_.moe.topk_groups)};
  const HaloMemo::Key key{halo_shape.nodes,
                          halo_shape.ranks_per_node,
                          halo_shape.lanes,
                          routing.num_experts,
                          routing.top_k,
                          routing.num_groups,
                          routing.topk_groups,
                          link.intra_bw,
                          link.intra_alpha_s,
                          link.lane_bw,
                          link.inter_alpha_s,
                          tokens,
                          dispatch_bytes_per_token(),
                          combine_bytes_per_token()};
  if (halo_memo_) {
    std::lock_guard<std::mutex> lock(halo_memo_->mutex);
    auto it = halo_memo_->time_s.find(key);
    if (it != halo_memo_->time_s.end()) return it->second;
  }
  double halo_s = 0;
  for (double tb : {dispatch_bytes_per_token(), combine_bytes_per_token()}) {
    PIPER_ASSIGN_OR_RETURN(HaloTraffic d, halo_dispatch_traffic(halo_shape, routing, tokens, tb));
    halo_s += halo_traffic_time_s(halo_shape, d, link);
  }
  PIPER_ASSIGN_OR_RETURN(HaloTraffic c, halo_combine_traffic(halo_shape, routing, tokens, combine_bytes_per_token()));
  const double layer_s = halo_s + 2 * halo_traffic_time_s(halo_shape, c, link);
  if (halo_memo_) {
    std::lock_guard<std::mutex> lock(halo_memo_->mutex);
    halo_memo_->time_s.emplace(key, layer_s);
  }
  return layer_s;
}

Status CostModel::estimate(const Strategy& s, Estimate* out) const {
  PIPER_RETURN_IF_ERROR(s.validate_for(model_, train_, cluster_.world_size()));
  if (s.disaggregate) return estimate_af_pipe(s, out);
  const ScheduleKind kind = s.schedule_kind();
  if (kind == ScheduleKind::kCustom) {
    return unimplemented("estimate: schedule=" + s.schedule +
                         " is a registered schedule the closed form has no model of (its order is code); "
                         "price it with `piper simulate`");
  }
  const int p = s.pp, v = s.chunks_per_rank(), stages = p * v, m = s.microbatches;
  const int L = model_.num_layers;
  const double T = static_cast<double>(s.mbs) * static_cast<double>(train_.seq_len);
  const double act_b = train_.activation_bytes();  // stashed for the backward
  const double wire_b = train_.comm_bytes();       // TP collectives, PP sends, combine
  const double h = table_.hidden;
  const double sp_div = s.sp ? s.tp : 1;

  // --- per-layer part times (identical on every rank) ---
  const PartShape shape = part_shape(s, calibration_);
  Fbw part_t[kNumParts];
  for (int i = 0; i < kNumParts; ++i) {
    PartCost c = part_cost(table_, static_cast<Part>(i), shape);
    part_t[i] = part_fbw(c, device_for(static_cast<Part>(i)));
  }
  auto part = [&](Part q) { return part_t[static_cast<int>(q)]; };
  auto recomputed = [&](Part q) { return with_recompute(part(q), q, s.recompute); };
  Fbw attn = recomputed(Part::kAttention);
  attn += recomputed(Part::kAttentionCore);
  attn += recomputed(Part::kNorms);
  Fbw moe_ffn = recomputed(Part::kRouter);
  moe_ffn += recomputed(Part::kExperts);
  moe_ffn += recomputed(Part::kSharedExperts);
  Fbw dense_ffn = recomputed(Part::kDenseMlp);

  // --- communication per layer and microbatch ---
  MeshGroups g = mesh_groups(s, net_);
  // TP: two all-reduces (or reduce-scatter + all-gather under SP, the same bytes) forward, two backward, and two
  // more when full recomputation re-runs them (Calibration::recompute_reruns_tp_collectives: Megatron-LM's).
  const double tp_ar_s = s.tp > 1 ? net_.all_reduce_s(T * h * wire_b, g.tp, AllReduceAlgo::kRing) : 0.0;
  const double tp_rerun_s =
      s.recompute == Recompute::kFull && calibration_.recompute_reruns_tp_collectives ? 2 * tp_ar_s : 0.0;
  double tp_dense_layer_s = 4 * tp_ar_s + tp_rerun_s, tp_moe_layer_s = tp_dense_layer_s;
  if (s.tp_overlap) {
    // Megatron's --tp-comm-overlap (cost/tp_overlap.h): each block's all-gather and reduce-scatter pipeline
    // with its first and last GEMM, forward and backward, as the compiled plan runs them; the last GEMM runs on
    // the SMs the reduce-scatter leaves it (compute grows by that). A fused backward (B and W in one chunk)
    // overlaps with both its gradient GEMMs; a split one (zb-h1, dualpipev) with the B's. The re-run
    // collectives of a recomputed forward stay whole (compile/lower.h).
    const bool split = kind == ScheduleKind::kZBH1 || kind == ScheduleKind::kDualPipeV;
    // The all-gather's ring steps take the whole all-gather's time; the reduce-scatter runs as k smaller ones.
    const double ag = net_.all_gather_s(T * h * wire_b, g.tp),
                 rs = kTpOverlapRsPieces * net_.reduce_scatter_s(T * h * wire_b / kTpOverlapRsPieces, g.tp);
    const double slow = 1 / calibration_.tp_overlap_gemm_sm_share;
    auto block = [&](Part matmul, Fbw* compute) {
      const BlockGemms gm = block_gemms(table_, device_, shape, matmul);
      const double b_first = gm.first_s[1] + (split ? 0 : gm.first_s[2]);
      compute->f += gm.last_s[0] * (slow - 1);
      compute->b += gm.last_s[1] * (slow - 1);
      if (!split) compute->w += gm.last_s[2] * (slow - 1);
      const double b_last = (gm.last_s[1] + (split ? 0 : gm.last_s[2])) * slow;
      return tp_overlap_all_gather_exposed_s(ag, gm.first_s[0], s.tp) +
             tp_overlap_reduce_scatter_exposed_s(rs, gm.last_s[0] * slow, kTpOverlapRsPieces) +
             tp_overlap_all_gather_exposed_s(ag, b_first, s.tp) +
             tp_overlap_reduce_scatter_exposed_s(rs, b_last, kTpOverlapRsPieces);
    };
    const double attn_s = block(Part::kAttention, &attn);
    tp_dense_layer_s = attn_s + block(Part::kDenseMlp, &dense_ffn) + tp_rerun_s;
    // A MoE layer's second pair overlaps with the shared experts' GEMMs, if the model has them.
    tp_moe_layer_s =
        attn_s + (table_.shared_params > 0 ? block(Part::kSharedExperts, &moe_ffn) : 2 * tp_ar_s) + tp_rerun_s;
  }
  // EP: dispatch and combine forward, their transposes backward.
  double ep_layer_s = 0;
  if (s.ep > 1 && model_.is_moe()) {
    const double tokens = T / s.tp;
    const double k = table_.top_k;
    if (s.a2a == "halo") {
      PIPER_ASSIGN_OR_RETURN(ep_layer_s, halo_ep_layer_s(g.ep, tokens));
    } else {
      ep_layer_s = net_.all_to_all_flat_s(tokens * k * dispatch_bytes_per_token(), g.ep) +
                   3 * net_.all_to_all_flat_s(tokens * k * combine_bytes_per_token(), g.ep);
    }
  }

  // Expert tensor parallelism: the gather of the routed rows over the etp group before the experts and the
  // reduce-scatter of their partial outputs after, forward and backward (the plan's etp exchanges, on the ep
  // stream beside the all-to-alls, or alone with ep = 1); each buffer holds the etp group's rows.
  double etp_layer_s = 0;
  if (s.etp > 1 && !s.fold && model_.is_moe()) {
    const double group_rows_bytes = T / s.tp * table_.top_k * combine_bytes_per_token() * s.etp;
    etp_layer_s = 2 * (net_.all_gather_s(group_rows_bytes, g.etp) + net_.reduce_scatter_s(group_rows_bytes, g.etp));
  }

  // --- per pipeline rank: layers, parameters, memory, compute ---
  ActivationOptions ao;
  ao.tp = s.tp;
  ao.etp = s.etp;
  ao.sp = s.sp;
  ao.recompute = s.recompute;
  ao.recompute_moe_norm = s.recomputes_module("layernorm");
  ao.recompute_moe_act = s.recomputes_module("moe_act");
  ao.seq_len = train_.seq_len;
  ao.act_bytes = act_b;
  const double act_dense = layer_activation_bytes_per_token(model_, false, ao).total();
  const double act_moe = model_.is_moe() ? layer_activation_bytes_per_token(model_, true, ao).total() : 0.0;
  const double act_head = head_activation_bytes_per_token(model_, ao);
  const double act_emb = embedding_activation_bytes_per_token(model_, ao);
  // B -> W gradients of a split backward (zb-h1, dualpipev's zero-bubble steps).
  const bool split_bw = kind == ScheduleKind::kZBH1 || kind == ScheduleKind::kDualPipeV;
  const double wg_dense = split_bw ? layer_weight_grad_input_bytes_per_token(model_, false, ao) : 0.0;
  const double wg_moe = split_bw && model_.is_moe() ? layer_weight_grad_input_bytes_per_token(model_, true, ao) : 0.0;
  const double wg_head = split_bw ? head_weight_grad_input_bytes_per_token(model_, ao) : 0.0;
  const double wg_emb = split_bw ? embedding_weight_grad_input_bytes_per_token(model_, ao) : 0.0;
  double peak_layer_act = 0;  // a recomputed layer re-materialises this during its backward
  if (s.recompute == Recompute::kSelective && ao.recompute_per_chunk) {
    // The attention chunk's stash, re-run before its backward (the same for dense and MoE layers).
    peak_layer_act = layer_activation_peak_bytes_per_token(model_, false, ao).attention;
  } else if (s.recompute == Recompute::kFull) {
    // Piper's runtime re-runs one chunk at a time: the largest chunk's stash (attention or FFN with its norm).
    auto rematerialised = [&](bool moe_layer) {
      LayerActivation a = layer_activation_peak_bytes_per_token(model_, moe_layer, ao);
      return ao.recompute_per_chunk ? std::max(a.attention, a.mlp) + a.norms / 2 : a.total();
    };
    peak_layer_act = std::max(rematerialised(false), model_.is_moe() ? rematerialised(true) : 0.0);
  }
  const double local_experts = table_.num_experts / s.ep;
  const int expert_shard = std::max(1, s.expert_replicas());
  const bool tied = model_.tie_embeddings;

  out->ranks.resize(p);
  out->device_memory_bytes = static_cast<double>(cluster_.device.memory_bytes);
  double worst_total = -1, worst_time = -1;
  Fbw bottleneck;
  double bottleneck_tp = 0, bottleneck_ep = 0, bottleneck_dense_params = 0, bottleneck_expert_params = 0;
  for (int r = 0; r < p; ++r) {
    int n_layers = 0, n_moe = 0;
    bool has_emb = false, has_head = false;
    double act_peak = 0;  // bytes held at the rank's peak: in-flight units x each chunk's microbatch bytes
    double chunk_act_b[2] = {0, 0}, chunk_wg_b[2] = {0, 0};  // per microbatch: stash, B -> W gradients
    for (int c = 0; c < v; ++c) {
      const int st = stage_of_chunk(kind, p, v, r, c);
      const auto [lo, hi] = stage_layers(L, stages, st);  // the compiler's partition
      const int moe = moe_layers_before(hi) - moe_layers_before(lo);
      n_layers += hi - lo;
      n_moe += moe;
      double chunk_act = T * ((hi - lo - moe) * act_dense + moe * act_moe);
      double chunk_wg = T * ((hi - lo - moe) * wg_dense + moe * wg_moe);
      if (st == 0) {
        has_emb = true;
        chunk_act += T * act_emb;
        chunk_wg += T * wg_emb;
      }
      if (st == stages - 1) {
        has_head = true;
        chunk_act += T * act_head;
        chunk_wg += T * wg_head;
      }
      // ep_overlap: one more warm-up forward holds one more chunk-microbatch (spread over the rank's chunks).
      const double units = chunk_in_flight_units(kind, p, m, v, r, c) + (s.ep_overlap ? 1.0 / v : 0.0);
      act_peak += std::min(units, static_cast<double>(m)) * chunk_act;
      if (c < 2) {
        chunk_act_b[c] = chunk_act;
        chunk_wg_b[c] = chunk_wg;
      }
    }
    const int n_dense = n_layers - n_moe;
    double dense_params = n_layers * (table_.attention_params / s.tp + table_.norm_params_per_layer) +
                          n_dense * table_.dense_mlp_params / s.tp +
                          n_moe * (table_.router_params + table_.shared_params / s.tp);
    if (has_emb) dense_params += table_.embedding_params / s.tp;
    if (has_head && (!tied || !has_emb)) dense_params += table_.head_params / s.tp;
    const double expert_params = n_moe * local_experts * table_.expert_params / s.etp;

    MemoryBreakdown& mem = out->ranks[r];
    ModelStateBytes states = model_state_bytes(dense_params, s.zero, s.dp, bytes_);
    states += model_state_bytes(expert_params, s.zero, expert_shard, bytes_);
    mem.params = states.params;
    mem.grads = states.grads;
    mem.optimizer = states.optimizer;
    mem.activations = act_peak;
    double buffers = calibration_.workspace_bytes;
    if (p > 1) buffers += 4 * T * h * wire_b / sp_div;  // P2P send/recv, activations and gradients
    if (s.ep > 1 && n_moe > 0) {                        // all-to-all staging: the dispatched tokens and the combine's
      buffers += T / s.tp * table_.top_k * (dispatch_bytes_per_token() + combine_bytes_per_token());
    }
    // The largest layer's parameters that ZeRO shards: experts only when they are replicated (edp > 1); with
    // ep == dp each rank's experts are its own, never gathered or reduce-scattered.
    const double sharded_experts = expert_shard > 1 ? local_experts * table_.expert_params / s.etp : 0.0;
    const double largest_layer =
        s.dp <= 1
            ? 0.0
            : table_.attention_params / s.tp +
                  std::max(n_dense > 0 ? table_.dense_mlp_params / s.tp : 0.0,
                           n_moe > 0 ? table_.shared_params / s.tp + table_.router_params + sharded_experts : 0.0);
    // ZeRO-2/3: the full gradients of the chunks between their weight-gradient task and their per-microbatch
    // reduce-scatter; ZeRO-3: the gathered parameters of the unit running and the one prefetched. The compiler's
    // prefetch window (stream_order.cc) holds two FSDP units: two layers.
    if (s.zero >= 2) buffers += largest_layer * bytes_.grad;       // gradient bucket
    if (s.zero >= 3) buffers += 2 * largest_layer * bytes_.param;  // gathered + prefetched
    buffers += T * peak_layer_act;
    // Deferred W: its B -> W gradients on top of the activation peak (counted as buffers, as the runtime does).
    if (kind == ScheduleKind::kZBH1) {
      buffers += deferred_w_units(kind, p, m, r) * chunk_wg_b[0];
    } else if (kind == ScheduleKind::kDualPipeV) {
      // Step 3 (B1 W1 F1): 2p-r-1 + r+1 units and one chunk-1 W pending; cool-down (steps 6-8): p-r-1 chunk-0
      // units not yet backwarded plus r+1 deferred units of either chunk. The main phase (the 2p+1 peak) has
      // no split backward.
      const double a_max = std::max(chunk_act_b[0], chunk_act_b[1]), g_max = std::max(chunk_wg_b[0], chunk_wg_b[1]);
      const double step3 =
          r < p - 1 ? (2 * p - r - 1) * chunk_act_b[0] + (r + 1) * chunk_act_b[1] + chunk_wg_b[1] : 0.0;
      const double cool = (p - r - 1) * chunk_act_b[0] + (r + 1) * (a_max + g_max);
      buffers += std::max(0.0, std::max(step3, cool) - act_peak);
    }
    mem.buffers = buffers;
    if (mem.total() > worst_total) {
      worst_total = mem.total();
      out->worst_rank = r;
    }

    Fbw t = attn * n_layers;
    t += moe_ffn * n_moe;
    t += dense_ffn * n_dense;
    if (has_emb) t += part(Part::kEmbedding);
    if (has_head) t += part(Part::kHead);
    // The slowest rank per microbatch sets the pace: compute plus the TP and EP communication it cannot hide.
    // DualPipeV overlaps one microbatch's forward with another's backward, hiding the EP all-to-all behind
    // the paired compute; the other schedules run it on the critical path.
    const double compute = t.f + t.b + t.w;
    const double tp_r = (n_layers - n_moe) * tp_dense_layer_s + n_moe * tp_moe_layer_s,
                 ep_r = n_moe * (ep_layer_s + etp_layer_s);
    // ep_overlap (Megatron's combined 1F1B) pairs only the steady-state steps: m v - warm-up of the rank's m v
    // forwards (and as many backwards) run in a pair, the warm-up forwards and cool-down backwards alone.
    double paired = kind == ScheduleKind::kDualPipeV ? 1.0 : 0.0;
    if (s.ep_overlap) {
      const double warmup = std::min<double>(in_flight_units(kind, p, m, v, r), m * v);  // incl. the extra one
      paired = std::max(0.0, (m * v - warmup) / (m * v));
    }
    const double ep_exposed_r = paired * std::max(0.0, ep_r - compute) + (1 - paired) * ep_r;
    if (compute + tp_r + ep_exposed_r > worst_time) {
      worst_time = compute + tp_r + ep_exposed_r;
      bottleneck = t;
      out->bottleneck_rank = r;
      bottleneck_tp = tp_r;
      bottleneck_ep = ep_exposed_r;
      bottleneck_dense_params = dense_params;
      bottleneck_expert_params = expert_params;
    }
  }
  out->memory = out->ranks[out->worst_rank];
  out->fits = out->memory.total() <= out->device_memory_bytes;

  // --- step time on the bottleneck rank ---
  const double mb_compute = bottleneck.f + bottleneck.b + bottleneck.w;
  const double ep_exposed = bottleneck_ep;
  const double per_mb_comm = bottleneck_tp + ep_exposed;
  const double t_f = bottleneck.f + per_mb_comm / 2;
  const double t_b = bottleneck.b + bottleneck.w + per_mb_comm / 2;  // B and W
  double pp_s = 0;
  if (p > 1) {
    // Scatter/gather (2021 Megatron-LM, Calibration::p2p_scatter_gather): each tp rank sends 1/tp of the boundary
    // tensor and the receiver all-gathers it over tp on the compute stream, so a transfer costs both.
    const double boundary_b = T * h * wire_b / sp_div;
    const bool split = calibration_.p2p_scatter_gather && s.tp > 1 && !s.sp;
    const double hop = split ? net_.p2p_s(boundary_b / s.tp, g.pp_cross_node) + net_.all_gather_s(boundary_b, g.tp)
                             : net_.p2p_s(boundary_b, g.pp_cross_node);
    // Blocking P2P per microbatch (activations forward, gradients backward) unless the schedule overlaps it
    // (interleaved and dualpipev post P2P asynchronously; only the fill and drain hops stay exposed). With
    // Calibration::p2p_blocking (2021 Megatron-LM waits for every batched isend/irecv) every one of the rank's
    // 2 m v transfers is exposed, v per microbatch and direction under the interleaved schedule; for v = 1 this
    // is the 1F1B count.
    const bool async =
        !calibration_.p2p_blocking && (kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kDualPipeV);
    const double chunks = kind == ScheduleKind::kInterleaved ? v : 1;
    pp_s = async ? 2.0 * (p - 1) * hop : 2.0 * (m * chunks + p - 1) * hop;
  }
  // ZeRO-2/3's exposed time per microbatch on rank r (ZeRO-2: reduce-scatters only). Items are FSDP units (a
  // layer's chunks of one pass; the embedding; the head), F in layer order, then B (+ W) in reverse; on the
  // cyclic sequence (steady state: a microbatch's backward is followed by another's forward) the gathers of unit
  // j+1 start when unit j's compute starts (the compiler's window of two gathered units, stream_order.cc), so
  // unit j+1 starts max(c_j, d_{j+1}) after unit j: exposed = sum_j max(0, d_{j+1} - c_j), where d is the NIC
  // stream's work before unit j+1 may run: its gathers, plus in the backward the reduce-scatters of unit j, plus
  // the EP dispatches and combines of unit j.
  auto sharded_dp_exposed_per_microbatch = [&](int r) {
    struct Item {
      double f = 0, bw = 0;            // compute: forward; backward + weight gradient (with recomputation)
      double ag = 0, rs = 0, a2a = 0;  // NIC: all-gather, reduce-scatter, EP all-to-all per pass
      bool moe = false;                // a MoE layer's unit: its compute also waits for the EP all-to-alls
      Item& operator+=(const Item& o) {
        f += o.f;
        bw += o.bw;
        ag += o.ag;
        rs += o.rs;
        a2a += o.a2a;
        return *this;
      }
    };
    auto item = [&](Fbw t, double params, const GroupLayout& ring) {
      Item it;
      it.f = t.f;
      it.bw = t.b + t.w;
      it.ag = s.zero >= 3 ? net_.all_gather_s(params * bytes_.param, ring) : 0.0;  // ZeRO-2: no gathers
      it.rs = net_.reduce_scatter_s(params * bytes_.grad, ring);
      return it;
    };
    // From the parts' own times: attn above also carries tp_overlap's slower GEMMs, these units do not.
    Fbw attn_t = recomputed(Part::kAttention);
    attn_t += recomputed(Part::kAttentionCore);
    attn_t += recomputed(Part::kNorms);
    const Item attn_i = item(attn_t, table_.attention_params / s.tp + table_.norm_params_per_layer, g.dp);
    const Item router_i = item(recomputed(Part::kRouter), table_.router_params, g.dp);
    Item experts_i = item(recomputed(Part::kExperts),
                          expert_shard > 1 ? local_experts * table_.expert_params / s.etp : 0, g.expert_dp);
    // Dispatch + combine in each pass, on the NIC only when the expert group spans nodes (folded EP 8 inside
    // a node runs over NVLink beside the gathers).
    experts_i.a2a = g.ep.nodes > 1 ? ep_layer_s / 2 : 0.0;
    const Item shared_i = item(recomputed(Part::kSharedExperts), table_.shared_params / s.tp, g.dp);
    const Item mlp_i = item(recomputed(Part::kDenseMlp), table_.dense_mlp_params / s.tp, g.dp);
    // FSDP units (a layer's chunks of one pass): the order of the chunks inside a unit does not change its sums.
    Item dense_unit = attn_i;
    dense_unit += mlp_i;
    Item moe_unit = attn_i;
    moe_unit += router_i;
    moe_unit += experts_i;
    if (table_.shared_params > 0) moe_unit += shared_i;
    moe_unit.moe = true;
    bool rank_has_emb = false;
    for (int c = 0; c < v; ++c) rank_has_emb = rank_has_emb || stage_of_chunk(kind, p, v, r, c) == 0;
    const Item emb_i = item(part(Part::kEmbedding), table_.embedding_params / s.tp, g.dp);
    const Item head_i = item(part(Part::kHead), !tied || !rank_has_emb ? table_.head_params / s.tp : 0.0, g.dp);
    // The rank's tasks of one pass in execution order: F in layer order, B in reverse (no allocation).
    auto visit = [&](bool backward, auto&& fn) {
      for (int i = 0; i < v; ++i) {
        const int c = backward ? v - 1 - i : i;
        const int st = stage_of_chunk(kind, p, v, r, c);
        const auto [lo, hi] = stage_layers(L, stages, st);  // the compiler's partition
        if (backward && st == stages - 1) fn(head_i);
        if (!backward && st == 0) fn(emb_i);
        for (int k = lo; k < hi; ++k) {
          const int l = backward ? hi - 1 - (k - lo) : k;
          fn(moe_layers_before(l + 1) > moe_layers_before(l) ? moe_unit : dense_unit);
        }
        if (backward && st == 0) fn(emb_i);
        if (!backward && st == stages - 1) fn(head_i);
      }
    };
    // The cycle: F tasks, then B tasks; the first F task follows the last B task (the first F task, backward).
    // A MoE unit lasts its compute plus the time it waits for its all-to-alls (the closed form's exposed EP time
    // per microbatch, spread over the rank's MoE units of both passes): the gathers run beside that wait too.
    int moe_units = 0;
    visit(false, [&](const Item& u) { moe_units += u.moe ? 2 : 0; });
    const double ep_wait = moe_units > 0 ? ep_exposed / moe_units : 0.0;
    Item prev = stage_of_chunk(kind, p, v, r, 0) == 0 ? emb_i : attn_i;
    bool prev_fwd = false;
    double exposed = 0;
    for (bool backward : {false, true}) {
      visit(backward, [&](const Item& cur) {
        const double c_prev = (prev_fwd ? prev.f : prev.bw) + (prev.moe ? ep_wait : 0.0);
        const double d = cur.ag + prev.a2a + (prev_fwd ? 0.0 : prev.rs);
        exposed += std::max(0.0, d - c_prev);
        prev = cur;
        prev_fwd = !backward;
      });
    }
    return exposed;
  };
  // DP: gradient sync of the dense part over dp and of the experts over their replicas.
  double dp_s = 0;
  const double dense_grad_b = bottleneck_dense_params * bytes_.grad;
  const double expert_grad_b = bottleneck_expert_params * bytes_.grad;
  const double dense_param_b = bottleneck_dense_params * bytes_.param;
  const double expert_param_b = bottleneck_expert_params * bytes_.param;
  if (s.zero == 0) {
    double ar = net_.all_reduce_s(dense_grad_b, g.dp) + net_.all_reduce_s(expert_grad_b, g.expert_dp);
    // Overlapped with the last microbatch's backward, unless the all-reduce runs after the whole backward
    // (Calibration::dp_reduce_after_backward: 2021 Megatron-LM's --DDP-impl local).
    dp_s = calibration_.dp_reduce_after_backward ? ar : std::max(0.0, ar - t_b);
  } else if (s.zero == 1) {
    double rs = net_.reduce_scatter_s(dense_grad_b, g.dp) + net_.reduce_scatter_s(expert_grad_b, g.expert_dp);
    double ag = net_.all_gather_s(dense_param_b, g.dp) + net_.all_gather_s(expert_param_b, g.expert_dp);
    dp_s = std::max(0.0, rs - t_b) + std::max(0.0, ag - t_f);  // param gather overlaps the next first forward
  } else if (s.zero == 2) {
    // ZeRO-2 reduce-scatters each chunk's gradients per microbatch (the compiler's replicate pass), on the NIC
    // stream with the EP all-to-alls: the same cycle without gathers; the updated parameters are gathered once.
    double ag = net_.all_gather_s(dense_param_b, g.dp) + net_.all_gather_s(expert_param_b, g.expert_dp);
    dp_s = m * sharded_dp_exposed_per_microbatch(out->bottleneck_rank) + std::max(0.0, ag - t_f);
  } else {
    // Per microbatch and parameter chunk (embedding, attention, router, experts, shared experts or dense MLP,
    // head -- the compiler's replicate pass): an all-gather before its F, another before its B, a
    // reduce-scatter after its W, each a separate ring paying (n-1) alpha. The prefetch window (two gathered
    // chunks) lets chunk j+1's gather overlap only chunk j's compute, and one NIC stream carries the gathers,
    // the reduce-scatters and the EP all-to-alls; see docs/resource_model.md "ZeRO-3".
    dp_s = m * sharded_dp_exposed_per_microbatch(out->bottleneck_rank);
  }
  const double shard_params = s.zero >= 1 ? bottleneck_dense_params / s.dp + bottleneck_expert_params / expert_shard
                                          : bottleneck_dense_params + bottleneck_expert_params;

  out->t_f_s = t_f;
  out->t_b_s = t_b;
  out->t_w_s = bottleneck.w;
  out->comm.tp_s = m * bottleneck_tp;
  out->comm.ep_s = m * ep_exposed;
  out->comm.pp_s = pp_s;
  out->comm.dp_s = dp_s;
  out->time.compute_s = m * mb_compute;
  out->time.exposed_comm_s = out->comm.tp_s + out->comm.ep_s + out->comm.pp_s + out->comm.dp_s;
  out->time.bubble_s = bubble_time_s(kind, p, v, t_f, t_b, bottleneck.w);
  out->time.optimizer_s = device_.time_s(0, shard_params * optimizer_step_bytes_per_param(bytes_), 0);
  finish_step(s, static_cast<double>(train_.seq_len), flops_per_token_, device_.peak_flops(), out);
  return ok_status();
}

}  // namespace piper::cost
