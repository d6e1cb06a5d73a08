#include "piper/cost/estimate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "piper/cost/activations.h"
#include "piper/cost/copy_cost.h"
#include "piper/cost/estimate_internal.h"
#include "piper/cost/pipeline_model.h"
#include "piper/cost/tp_overlap.h"
#include "piper/cost/vocab_parallel.h"
#include "piper/spec/counting.h"

namespace piper::cost {
namespace {

double dtype_width(DType d) { return d == DType::kFP32 ? 4 : d == DType::kFP8 ? 1 : 2; }

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
  // Expert replicas: the expert-data-parallel ranks, times the TP ranks that hold the same expert slice. The plan's
  // edp group (ir::MeshInfo::experts_reduce_over_edp): MoE with tp > 1 needs sp (Strategy::validate_for), under
  // which the compiler reduces the experts over these ranks, tensor ranks included.
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
      device_(cluster.device, train.gemm_dtype(), cal, rate_share(cluster.node, cal), cluster.node.device_cores),
      device_hp_(cluster.device, train.param_dtype, cal, rate_share(cluster.node, cal), cluster.node.device_cores),
      flops_per_token_(training_flops_per_token(model, train.seq_len)),
      task_profile_(TaskProfileTable::find(cal, model, train.seq_len)),
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
  shape.expert_call_s[0] = cal.expert_call_forward_s;
  shape.expert_call_s[1] = cal.expert_call_backward_input_s;
  shape.expert_call_s[2] = cal.expert_call_backward_weight_s;
  shape.expert_row_s[0] = cal.expert_row_forward_s;
  shape.expert_row_s[1] = cal.expert_row_backward_input_s;
  shape.expert_row_s[2] = cal.expert_row_backward_weight_s;
  shape.expert_shape_hidden = cal.expert_shape_hidden;
  shape.expert_shape_ffn = cal.expert_shape_ffn;
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

namespace {

// The closed form's steps (CostModel::estimate, at the end of this file): one microbatch's layer times, the
// activation bytes per token, then each pipeline rank's layers, memory and time, then the step on the bottleneck
// rank (pipeline P2P, the data-parallel sync, the bubble, the optimizer).

bool split_backward(ScheduleKind kind) { return kind == ScheduleKind::kZBH1 || kind == ScheduleKind::kDualPipeV; }

PartTimes part_times(const CostModel& cm, const Strategy& s, const PartShape& shape) {
  PartTimes pt;
  pt.recompute = s.recompute;
  const TaskScales scales = cm.task_scales(shape.tokens);
  for (int i = 0; i < kNumParts; ++i) {
    const Part part = static_cast<Part>(i);
    pt.t[i] = scaled(part_fbw(part_cost(cm.parts(), part, shape), cm.device_for(part)), scales, part);
  }
  pt.update_scale = scales.update;
  return pt;
}

// One layer per microbatch, identical on every rank: the compute of its chunks (with recomputation, and the
// slower GEMMs under tp_overlap) and the communication of each kind.
struct LayerTimes {
  Fbw attn, moe_ffn, dense_ffn;
  double tp_dense_s = 0, tp_moe_s = 0;  // TP collectives of a dense and of a MoE layer, exposed
  double ep_s = 0;                      // EP dispatch and combine, both passes
  double etp_s = 0;                     // the etp group's gather and reduce-scatter, both passes
};

// Megatron's --tp-comm-overlap (cost/tp_overlap.h): each block's all-gather and reduce-scatter pipeline with its
// first and last GEMM, forward and backward, as the compiled plan runs them; the last GEMM runs on the SMs the
// reduce-scatter leaves it (compute grows by that). A fused backward (B and W in one chunk) overlaps with both its
// gradient GEMMs; a split one (zb-h1, dualpipev) with the B's. The re-run collectives of a recomputed forward stay
// whole (compile/lower.h).
struct TpOverlap {
  double ag = 0, rs = 0;  // the whole all-gather; the reduce-scatter as kTpOverlapRsPieces smaller ones
  double slow = 1;        // the last GEMM's slow-down
  bool split = false;     // split backward
  int tp = 1;
};

// The exposed TP time of one block whose GEMMs are `matmul`'s; adds the last GEMM's slow-down to *compute.
double tp_overlap_block_s(const CostModel& cm, const PartShape& shape, const TpOverlap& o, Part matmul, Fbw* compute) {
  BlockGemms gm = block_gemms(cm.parts(), cm.device(), shape, matmul);
  const TaskScales scales = cm.task_scales(shape.tokens);  // the block's GEMMs as its task: the simulator's too
  for (int k = 0; k < 3; ++k) {
    gm.first_s[static_cast<size_t>(k)] *= scales.of(matmul, k);
    gm.last_s[static_cast<size_t>(k)] *= scales.of(matmul, k);
  }
  const double b_first = gm.first_s[1] + (o.split ? 0 : gm.first_s[2]);
  compute->f += gm.last_s[0] * (o.slow - 1);
  compute->b += gm.last_s[1] * (o.slow - 1);
  if (!o.split) compute->w += gm.last_s[2] * (o.slow - 1);
  const double b_last = (gm.last_s[1] + (o.split ? 0 : gm.last_s[2])) * o.slow;
  return tp_overlap_all_gather_exposed_s(o.ag, gm.first_s[0], o.tp) +
         tp_overlap_reduce_scatter_exposed_s(o.rs, gm.last_s[0] * o.slow, kTpOverlapRsPieces) +
         tp_overlap_all_gather_exposed_s(o.ag, b_first, o.tp) +
         tp_overlap_reduce_scatter_exposed_s(o.rs, b_last, kTpOverlapRsPieces);
}

// TP: two all-reduces (or reduce-scatter + all-gather under SP, the same bytes) forward, two backward, and two
// more when full recomputation re-runs them (Calibration::recompute_reruns_tp_collectives: Megatron-LM's).
void add_tp_times(const CostModel& cm, const Strategy& s, ScheduleKind kind, const PartShape& shape,
                  const GroupLayout& tp, double tokens, LayerTimes* lt) {
  const Network& net = cm.network();
  const Calibration& cal = cm.calibration();
  const double wire_b = cm.train().comm_bytes();
  const double h = cm.parts().hidden;
  const double tp_ar_s = s.tp > 1 ? net.all_reduce_s(tokens * h * wire_b, tp, AllReduceAlgo::kRing) : 0.0;
  const double tp_rerun_s = s.recompute == Recompute::kFull && cal.recompute_reruns_tp_collectives ? 2 * tp_ar_s : 0.0;
  lt->tp_dense_s = 4 * tp_ar_s + tp_rerun_s;
  lt->tp_moe_s = lt->tp_dense_s;
  if (!s.tp_overlap) return;
  TpOverlap o;
  o.split = split_backward(kind);
  o.ag = net.all_gather_s(tokens * h * wire_b, tp);
  o.rs = kTpOverlapRsPieces * net.reduce_scatter_s(tokens * h * wire_b / kTpOverlapRsPieces, tp);
  o.slow = 1 / cal.tp_overlap_gemm_sm_share;
  o.tp = s.tp;
  const double attn_s = tp_overlap_block_s(cm, shape, o, Part::kAttention, &lt->attn);
  lt->tp_dense_s = attn_s + tp_overlap_block_s(cm, shape, o, Part::kDenseMlp, &lt->dense_ffn) + tp_rerun_s;
  // A MoE layer's second pair overlaps with the shared experts' GEMMs, if the model has them.
  lt->tp_moe_s = attn_s +
                 (cm.parts().shared_params > 0 ? tp_overlap_block_s(cm, shape, o, Part::kSharedExperts, &lt->moe_ffn)
                                               : 2 * tp_ar_s) +
                 tp_rerun_s;
}

// Expert tensor parallelism: the gather of the routed rows over the etp group before the experts and the
// reduce-scatter of their partial outputs after, forward and backward (the plan's etp exchanges, on the ep
// stream beside the all-to-alls, or alone with ep = 1); each buffer holds the etp group's rows.
double etp_layer_s(const CostModel& cm, const Strategy& s, const GroupLayout& etp, double tokens) {
  if (s.etp <= 1 || s.fold || !cm.model().is_moe()) return 0.0;
  const double group_rows_bytes = tokens / s.tp * cm.parts().top_k * cm.combine_bytes_per_token() * s.etp;
  const Network& net = cm.network();
  return 2 * (net.all_gather_s(group_rows_bytes, etp) + net.reduce_scatter_s(group_rows_bytes, etp));
}

// Every layer time but the EP all-to-alls (CostModel::ep_layer_s).
LayerTimes layer_times(const CostModel& cm, const Strategy& s, ScheduleKind kind, const PartShape& shape,
                       const PartTimes& pt, const MeshGroups& g, double tokens) {
  LayerTimes lt;
  lt.attn = pt.attention();
  lt.moe_ffn = pt.recomputed(Part::kRouter);
  lt.moe_ffn += pt.recomputed(Part::kExperts);
  lt.moe_ffn += pt.recomputed(Part::kSharedExperts);
  lt.dense_ffn = pt.recomputed(Part::kDenseMlp);
  add_tp_times(cm, s, kind, shape, g.tp, tokens, &lt);
  lt.etp_s = etp_layer_s(cm, s, g.etp, tokens);
  return lt;
}

// Bytes per token that a layer (dense, MoE), the head and the embedding stash for the backward (activations.h),
// the B -> W gradients a split backward holds between them (zb-h1, dualpipev's zero-bubble steps), and what a
// recomputed layer re-materialises during its backward.
struct ActBytes {
  double dense = 0, moe = 0, head = 0, emb = 0;
  double wg_dense = 0, wg_moe = 0, wg_head = 0, wg_emb = 0;
  double recomputed_layer = 0;
  LayerWorkingSet ws;  // the backward's working set, by chunk kind
};

// A recomputed layer's peak: the attention chunk's stash under selective recomputation per chunk; under full,
// the largest chunk's stash (attention or FFN with its norm), as Piper's runtime re-runs one chunk at a time.
double recomputed_layer_bytes_per_token(const ModelSpec& model, const Strategy& s, const ActivationOptions& ao) {
  if (s.recompute == Recompute::kSelective && ao.recompute_per_chunk) {
    return layer_activation_peak_bytes_per_token(model, false, ao).attention;  // the same for dense and MoE layers
  }
  if (s.recompute != Recompute::kFull) return 0.0;
  auto rematerialised = [&](bool moe_layer) {
    LayerActivation a = layer_activation_peak_bytes_per_token(model, moe_layer, ao);
    return ao.recompute_per_chunk ? std::max(a.attention, a.mlp) + a.norms / 2 : a.total();
  };
  return std::max(rematerialised(false), model.is_moe() ? rematerialised(true) : 0.0);
}

ActBytes act_bytes_per_token(const CostModel& cm, const Strategy& s, ScheduleKind kind) {
  const ModelSpec& model = cm.model();
  ActivationOptions ao;
  ao.tp = s.tp;
  ao.etp = s.etp;
  ao.sp = s.sp;
  ao.recompute = s.recompute;
  ao.recompute_moe_norm = s.recomputes_module("layernorm");
  ao.recompute_moe_act = s.recomputes_module("moe_act");
  ao.seq_len = cm.train().seq_len;
  ao.act_bytes = cm.train().activation_bytes();
  ao.expert_load = cm.calibration().memory_load();  // the ep rank that holds the most rows at its peak
  ActBytes a;
  a.dense = layer_activation_bytes_per_token(model, false, ao).total();
  a.moe = model.is_moe() ? layer_activation_bytes_per_token(model, true, ao).total() : 0.0;
  a.head = head_activation_bytes_per_token(model, ao);
  a.emb = embedding_activation_bytes_per_token(model, ao);
  const bool split_bw = split_backward(kind);
  a.wg_dense = split_bw ? layer_weight_grad_input_bytes_per_token(model, false, ao) : 0.0;
  a.wg_moe = split_bw && model.is_moe() ? layer_weight_grad_input_bytes_per_token(model, true, ao) : 0.0;
  a.wg_head = split_bw ? head_weight_grad_input_bytes_per_token(model, ao) : 0.0;
  a.wg_emb = split_bw ? embedding_weight_grad_input_bytes_per_token(model, ao) : 0.0;
  a.recomputed_layer = recomputed_layer_bytes_per_token(model, s, ao);
  ao.materialised_scores = cm.calibration().attention_score_bytes > 0;
  ao.expert_parallel = s.ep > 1;
  a.ws = backward_working_set_bytes_per_token(model, ao);
  return a;
}

// Pipeline rank r's share of the model: its layers over its chunks (the compiler's partition), the embedding and
// the head if its chunks hold the first and last stage, and the activations it holds.
struct RankLayers {
  int layers = 0, moe = 0;
  bool emb = false, head = false;
  double act_peak = 0;  // bytes held at the rank's peak: in-flight units x each chunk's microbatch bytes
  double chunk_act_b[2] = {0, 0}, chunk_wg_b[2] = {0, 0};  // per microbatch: stash, B -> W gradients
  int dense() const { return layers - moe; }
};

RankLayers rank_layers(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const ActBytes& a,
                       double tokens, int r) {
  const ScheduleKind kind = pl.kind;
  const int p = pl.p, v = pl.v, stages = pl.stages(), m = pl.m;
  const double T = tokens;
  RankLayers x;
  for (int c = 0; c < v; ++c) {
    const int st = stage_of_chunk(kind, p, v, r, c);
    const auto [lo, hi] = stage_layers(cm.model().num_layers, stages, st);  // the compiler's partition
    const int moe = cm.moe_layers_before(hi) - cm.moe_layers_before(lo);
    x.layers += hi - lo;
    x.moe += moe;
    double chunk_act = T * ((hi - lo - moe) * a.dense + moe * a.moe);
    double chunk_wg = T * ((hi - lo - moe) * a.wg_dense + moe * a.wg_moe);
    if (st == 0) {
      x.emb = true;
      chunk_act += T * a.emb;
      chunk_wg += T * a.wg_emb;
    }
    if (st == stages - 1) {
      x.head = true;
      chunk_act += T * a.head;
      chunk_wg += T * a.wg_head;
    }
    // ep_overlap: one more warm-up forward holds one more chunk-microbatch (spread over the rank's chunks).
    const double units = chunk_in_flight_units(kind, p, m, v, r, c) + (s.ep_overlap ? 1.0 / v : 0.0);
    x.act_peak += std::min(units, static_cast<double>(m)) * chunk_act;
    if (c < 2) {
      x.chunk_act_b[c] = chunk_act;
      x.chunk_wg_b[c] = chunk_wg;
    }
  }
  return x;
}

RankParams rank_params(const CostModel& cm, const Strategy& s, const RankLayers& x) {
  const PartTable& table = cm.parts();
  RankParams params;
  params.dense = x.layers * (table.attention_params / s.tp + table.norm_params_per_layer) +
                 x.dense() * table.dense_mlp_params / s.tp + x.moe * (table.router_params + table.shared_params / s.tp);
  if (x.emb) params.dense += table.embedding_params / s.tp;
  if (x.head && (!cm.model().tie_embeddings || !x.emb)) params.dense += table.head_params / s.tp;
  params.expert = x.moe * local_experts(cm, s) * table.expert_params / s.etp;
  return params;
}

// The largest layer's parameters that ZeRO shards: experts only when they are replicated (edp > 1); with ep == dp
// each rank's experts are its own, never gathered or reduce-scattered.
double largest_sharded_layer_params(const CostModel& cm, const Strategy& s, const RankLayers& x) {
  const PartTable& table = cm.parts();
  if (s.dp <= 1) return 0.0;
  const double sharded_experts = expert_shard(s) > 1 ? local_experts(cm, s) * table.expert_params / s.etp : 0.0;
  return table.attention_params / s.tp +
         std::max(x.dense() > 0 ? table.dense_mlp_params / s.tp : 0.0,
                  x.moe > 0 ? table.shared_params / s.tp + table.router_params + sharded_experts : 0.0);
}

// Deferred W: its B -> W gradients on top of the activation peak (counted as buffers, as the runtime does).
double deferred_w_bytes(const PipelineShape& pl, const RankLayers& x, int r) {
  const ScheduleKind kind = pl.kind;
  const int p = pl.p, m = pl.m;
  if (kind == ScheduleKind::kZBH1) return deferred_w_units(kind, p, m, r) * x.chunk_wg_b[0];
  if (kind != ScheduleKind::kDualPipeV) return 0.0;
  // Step 3 (B1 W1 F1): 2p-r-1 + r+1 units and one chunk-1 W pending; cool-down (steps 6-8): p-r-1 chunk-0 units
  // not yet backwarded plus r+1 deferred units of either chunk. The main phase (the 2p+1 peak) has no split
  // backward.
  const double a_max = std::max(x.chunk_act_b[0], x.chunk_act_b[1]);
  const double g_max = std::max(x.chunk_wg_b[0], x.chunk_wg_b[1]);
  const double step3 =
      r < p - 1 ? (2 * p - r - 1) * x.chunk_act_b[0] + (r + 1) * x.chunk_act_b[1] + x.chunk_wg_b[1] : 0.0;
  const double cool = (p - r - 1) * x.chunk_act_b[0] + (r + 1) * (a_max + g_max);
  return std::max(0.0, std::max(step3, cool) - x.act_peak);
}

// The largest backward working set among the chunk kinds rank r holds, per token (activations.h): it comes on
// top of the activation peak (an upper bound: the chunks before it in the backward have freed their stash).
double working_set_bytes_per_token(const ActBytes& a, const RankLayers& x) {
  double ws = x.layers > 0 ? a.ws.attention : 0.0;
  if (x.dense() > 0) ws = std::max(ws, a.ws.dense_mlp);
  if (x.moe > 0) ws = std::max(ws, a.ws.moe);
  if (x.head) ws = std::max(ws, a.ws.head);
  return ws;
}

// Communication staging, ZeRO's buffers, the recomputed layer's scratch, the backward's working set, the
// workspace and deferred W.
double rank_buffer_bytes(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const RankLayers& x,
                         const ActBytes& a, double tokens, int r) {
  const ByteConvention& bytes = cm.bytes();
  const double T = tokens;
  double buffers = cm.calibration().workspace_bytes;
  const double sp_div = s.sp ? s.tp : 1;
  if (s.pp > 1) buffers += 4 * T * cm.parts().hidden * cm.train().comm_bytes() / sp_div;  // P2P, both ways
  if (s.ep > 1 && x.moe > 0) {  // all-to-all staging: the tokens dispatched to its experts and the combine's
    buffers += T / s.tp * cm.parts().top_k *
               (cm.calibration().expert_load_imbalance * cm.dispatch_bytes_per_token() + cm.combine_bytes_per_token());
  }
  // ZeRO-2/3: the full gradients of the chunks between their weight-gradient task and their per-microbatch
  // reduce-scatter; ZeRO-3: the gathered parameters of the unit running and the one prefetched. The compiler's
  // prefetch window (stream_order.cc) holds two FSDP units: two layers.
  const double largest_layer = largest_sharded_layer_params(cm, s, x);
  if (s.zero >= 2) buffers += largest_layer * bytes.grad;       // gradient bucket
  if (s.zero >= 3) buffers += 2 * largest_layer * bytes.param;  // gathered + prefetched
  buffers += T * (a.recomputed_layer + working_set_bytes_per_token(a, x));
  return buffers + deferred_w_bytes(pl, x, r);
}

MemoryBreakdown rank_memory(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const RankLayers& x,
                            const RankParams& params, const ActBytes& a, double tokens, int r) {
  ModelStateBytes states = model_state_bytes(params.dense, s.zero, s.dp, cm.bytes());
  states += model_state_bytes(params.expert, s.zero, expert_shard(s), cm.bytes());
  MemoryBreakdown mem;
  mem.params = states.params;
  mem.grads = states.grads;
  mem.optimizer = states.optimizer;
  mem.activations = x.act_peak;
  mem.buffers = rank_buffer_bytes(cm, s, pl, x, a, tokens, r);
  return mem;
}

// One microbatch on a rank: compute, and the TP and EP communication it cannot hide. DualPipeV overlaps one
// microbatch's forward with another's backward, hiding the EP all-to-all behind the paired compute; the other
// schedules run it on the critical path.
struct RankTime {
  Fbw t;
  double tp_s = 0, ep_exposed_s = 0;
  double total() const { return t.f + t.b + t.w + tp_s + ep_exposed_s; }
};

RankTime rank_time(const PartTimes& pt, const LayerTimes& lt, const Strategy& s, const PipelineShape& pl,
                   const RankLayers& x, int r) {
  const ScheduleKind kind = pl.kind;
  const int p = pl.p, v = pl.v, m = pl.m;
  RankTime rt;
  rt.t = lt.attn * x.layers;
  rt.t += lt.moe_ffn * x.moe;
  rt.t += lt.dense_ffn * x.dense();
  if (x.emb) rt.t += pt(Part::kEmbedding);
  if (x.head) rt.t += pt(Part::kHead);
  const double compute = rt.t.f + rt.t.b + rt.t.w;
  rt.tp_s = (x.layers - x.moe) * lt.tp_dense_s + x.moe * lt.tp_moe_s;
  const double ep_s = x.moe * (lt.ep_s + lt.etp_s);
  // ep_overlap (Megatron's combined 1F1B) pairs only the steady-state steps: m v - warm-up of the rank's m v
  // forwards (and as many backwards) run in a pair, the warm-up forwards and cool-down backwards alone.
  double paired = kind == ScheduleKind::kDualPipeV ? 1.0 : 0.0;
  if (s.ep_overlap) {
    const double warmup = std::min<double>(in_flight_units(kind, p, m, v, r), m * v);  // incl. the extra one
    paired = std::max(0.0, (m * v - warmup) / (m * v));
  }
  rt.ep_exposed_s = paired * std::max(0.0, ep_s - compute) + (1 - paired) * ep_s;
  return rt;
}

// The rank that sets the pace (the largest time per microbatch), its parameters and layers, for the step.
struct Bottleneck {
  RankTime time;
  RankParams params;
  RankLayers layers;
};

// Every pipeline rank's memory (out->ranks, worst_rank, memory, fits) and time (bottleneck_rank).
Bottleneck price_ranks(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const PartTimes& pt,
                       const LayerTimes& lt, double tokens, Estimate* out) {
  const ActBytes a = act_bytes_per_token(cm, s, pl.kind);
  out->ranks.resize(pl.p);
  out->device_memory_bytes = static_cast<double>(cm.cluster().device.memory_bytes);
  double worst_total = -1, worst_time = -1;
  Bottleneck b;
  for (int r = 0; r < pl.p; ++r) {
    const RankLayers x = rank_layers(cm, s, pl, a, tokens, r);
    const RankParams params = rank_params(cm, s, x);
    MemoryBreakdown& mem = out->ranks[r];
    mem = rank_memory(cm, s, pl, x, params, a, tokens, r);
    if (mem.total() > worst_total) {
      worst_total = mem.total();
      out->worst_rank = r;
    }
    const RankTime t = rank_time(pt, lt, s, pl, x, r);
    if (t.total() > worst_time) {
      worst_time = t.total();
      b = {t, params, x};
      out->bottleneck_rank = r;
    }
  }
  out->memory = out->ranks[out->worst_rank];
  out->fits = out->memory.total() <= out->device_memory_bytes;
  return b;
}

// Pipeline P2P on the critical path per step.
double pp_exposed_s(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const MeshGroups& g,
                    double tokens) {
  const ScheduleKind kind = pl.kind;
  const int p = pl.p, v = pl.v, m = pl.m;
  if (p <= 1) return 0.0;
  const Network& net = cm.network();
  const Calibration& cal = cm.calibration();
  // Scatter/gather (2021 Megatron-LM, Calibration::p2p_scatter_gather): each tp rank sends 1/tp of the boundary
  // tensor and the receiver all-gathers it over tp on the compute stream, so a transfer costs both.
  const double sp_div = s.sp ? s.tp : 1;
  const double boundary_b = tokens * cm.parts().hidden * cm.train().comm_bytes() / sp_div;
  const bool split = cal.p2p_scatter_gather && s.tp > 1 && !s.sp;
  const double hop = split ? net.p2p_s(boundary_b / s.tp, g.pp_cross_node) + net.all_gather_s(boundary_b, g.tp)
                           : net.p2p_s(boundary_b, g.pp_cross_node);
  // Blocking P2P per microbatch (activations forward, gradients backward) unless the schedule overlaps it
  // (interleaved and dualpipev post P2P asynchronously; only the fill and drain hops stay exposed). With
  // Calibration::p2p_blocking (2021 Megatron-LM waits for every batched isend/irecv) every one of the rank's
  // 2 m v transfers is exposed, v per microbatch and direction under the interleaved schedule; for v = 1 this
  // is the 1F1B count.
  const bool async = !cal.p2p_blocking && (kind == ScheduleKind::kInterleaved || kind == ScheduleKind::kDualPipeV);
  const double chunks = kind == ScheduleKind::kInterleaved ? v : 1;
  return async ? 2.0 * (p - 1) * hop : 2.0 * (m * chunks + p - 1) * hop;
}

}  // namespace

double copy_seconds_per_byte_at_share(const CostModel& cm, CopyKind kind) {
  const double per_byte = copy_seconds_per_byte(cm.cluster().node, kind);
  if (!(per_byte > 0)) return 0;
  return per_byte / cm.device().core_share();
}

double staging_seconds_per_byte_at_share(const CostModel& cm) {
  const double per_byte = staging_seconds_per_byte(cm.cluster().node, cm.cluster().device, cm.calibration());
  return per_byte > 0 ? per_byte / cm.device().core_share() : 0.0;
}

namespace {

// On a node whose ranks share its cores, every byte a rank's transfers move is copied by one of them (copy_cost.h):
// its bytes per step by kind, at one core's copy rate and the rank's static share of the cores (one core at most),
// so that a kind's communication costs at least that, hidden behind compute or not (each kind of out->comm becomes
// the larger). The bytes a rank sends per step: the data-parallel ring collectives of its parameters and gradients
// ((n - 1)/n of the tensor per reduce-scatter or all-gather, twice per all-reduce; ZeRO-2 reduce-scatters per
// microbatch, ZeRO-3 also gathers before each F and B); per layer and microbatch 8 (tp - 1)/tp of its T x h
// activations over tp (two all-reduces each pass, or with sp two all-gathers and two reduce-scatters); per MoE
// layer and microbatch (ep - 1)/ep of the dispatch and the combine and their transposes; per microbatch and chunk
// the pipeline's activation and gradient. Each kind of byte at its rate (CopyKind): gradients and tp's all-reduces
// summed, parameters and sp's all-gathers gathered (sp's reduce-scatters summed), ep's and pp's exchanged. Nothing on
// other nodes.
void add_copies(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const MeshGroups& g,
                const Bottleneck& b, double tokens, CommBreakdown* comm) {
  const double summed = copy_seconds_per_byte_at_share(cm, CopyKind::kSummed);
  const double gathered = copy_seconds_per_byte_at_share(cm, CopyKind::kGathered);
  const double exchanged = copy_seconds_per_byte_at_share(cm, CopyKind::kExchanged);
  const double stage_at = staging_seconds_per_byte_at_share(cm);
  if (!(summed > 0) && !(gathered > 0) && !(exchanged > 0) && !(stage_at > 0)) return;  // cores not shared
  auto f = [](int n) { return n > 1 ? (n - 1.0) / n : 0.0; };
  const double m = pl.m;
  const double dp_s = dp_copy_seconds(cm, s.zero, m, f(g.dp.size), f(g.expert_dp.size),
                                      b.params.dense * cm.bytes().grad, b.params.expert * cm.bytes().grad,
                                      b.params.dense * cm.bytes().param, b.params.expert * cm.bytes().param);
  const double tp_at = s.sp ? (summed + gathered) / 2 : summed;
  const double act = tokens * cm.parts().hidden * cm.train().comm_bytes();
  const double tp = m * b.layers.layers * 8 * f(s.tp) * act;
  const double routed = tokens / s.tp * cm.parts().top_k;
  const double ep = m * b.layers.moe * f(s.ep) * routed *
                    (cm.dispatch_bytes_per_token() + 3 * cm.combine_bytes_per_token());
  const double pp = pl.p > 1 ? m * pl.v * 2 * act / (s.sp ? s.tp : 1) : 0.0;
  const double staged = dp_staging_bytes(s.zero, m, g.dp.size, g.expert_dp.size, b.params.dense * cm.bytes().grad,
                                         b.params.expert * cm.bytes().grad, b.params.dense * cm.bytes().param,
                                         b.params.expert * cm.bytes().param);
  comm->dp_s = std::max(comm->dp_s, dp_s + staged * stage_at);
  comm->tp_s = std::max(comm->tp_s, tp * tp_at);
  comm->ep_s = std::max(comm->ep_s, ep * exchanged);
  comm->pp_s = std::max(comm->pp_s, pp * exchanged);
}

// On a node whose ranks share its cores (NodeSpec::shared_cores, fewer than they would use alone), a rank waiting in
// the pipeline's bubble leaves its cores to the ranks that compute, which then run faster than the static share
// prices them, up to `share` (cost::rate_share) of the price: with balanced stages the node's work takes compute_s
// whatever the bubble, and the bubble costs only what the pipeline's critical path at that speed, (compute_s +
// bubble_s) x share, exceeds it. The simulator's core pool follows who computes when; this is its bound. Elsewhere
// the bubble as priced.
double shared_core_bubble_s(const NodeSpec& node, double share, double compute_s, double bubble_s) {
  if (!(node.shared_cores > 0) || !(node.static_core_share() < 1)) return bubble_s;
  return std::max(0.0, (compute_s + bubble_s) * share - compute_s);
}

// The step on the bottleneck rank: its microbatches, the pipeline's P2P and bubble, the data-parallel sync and the
// optimizer step; then tokens/s and MFU.
void price_step(const CostModel& cm, const Strategy& s, const PipelineShape& pl, const PartTimes& parts,
                const MeshGroups& g, const LayerTimes& layer, const Bottleneck& b, double tokens, Estimate* out) {
  const int m = pl.m;
  const Fbw& t = b.time.t;
  const double per_mb_comm = b.time.tp_s + b.time.ep_exposed_s;
  const double t_f = t.f + per_mb_comm / 2;
  const double t_b = t.b + t.w + per_mb_comm / 2;  // B and W
  const double shard_params =
      s.zero >= 1 ? b.params.dense / s.dp + b.params.expert / expert_shard(s) : b.params.dense + b.params.expert;
  out->t_f_s = t_f;
  out->t_b_s = t_b;
  out->t_w_s = t.w;
  out->comm.tp_s = m * b.time.tp_s;
  out->comm.ep_s = m * b.time.ep_exposed_s;
  out->comm.pp_s = pp_exposed_s(cm, s, pl, g, tokens);
  out->comm.dp_s =
      dp_exposed_s(cm, s, pl, parts, g, {out->bottleneck_rank, b.params, t_f, t_b, layer.ep_s, b.time.ep_exposed_s});
  add_copies(cm, s, pl, g, b, tokens, &out->comm);
  out->time.compute_s = m * (t.f + t.b + t.w);
  out->time.exposed_comm_s = out->comm.tp_s + out->comm.ep_s + out->comm.pp_s + out->comm.dp_s;
  out->time.bubble_s = shared_core_bubble_s(cm.cluster().node, rate_share(cm.cluster().node, cm.calibration()),
                                            out->time.compute_s, bubble_time_s(pl.kind, pl.p, pl.v, t_f, t_b, t.w));
  out->time.optimizer_s =
      parts.update_scale * cm.device().time_s(0, shard_params * optimizer_step_bytes_per_param(cm.bytes()), 0);
  finish_step(s, static_cast<double>(cm.train().seq_len), cm.flops_per_token(), cm.device().peak_flops(), out);
}

}  // namespace

// EP: dispatch and combine forward, their transposes backward.
Result<double> CostModel::ep_layer_s(const Strategy& s, const GroupLayout& ep_group, double tokens) const {
  if (s.ep <= 1 || !model_.is_moe()) return 0.0;
  const double rank_tokens = tokens / s.tp;
  if (s.a2a == "halo") return halo_ep_layer_s(ep_group, rank_tokens);
  const double k = table_.top_k;
  return net_.all_to_all_flat_s(rank_tokens * k * dispatch_bytes_per_token(), ep_group) +
         3 * net_.all_to_all_flat_s(rank_tokens * k * combine_bytes_per_token(), ep_group);
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
  const PipelineShape pl{kind, s.pp, s.chunks_per_rank(), s.microbatches};
  const double tokens = static_cast<double>(s.mbs) * static_cast<double>(train_.seq_len);
  const PartShape shape = part_shape(s, calibration_);
  const PartTimes pt = part_times(*this, s, shape);
  const MeshGroups g = mesh_groups(s, net_);
  LayerTimes layer = layer_times(*this, s, kind, shape, pt, g, tokens);
  PIPER_ASSIGN_OR_RETURN(layer.ep_s, ep_layer_s(s, g.ep, tokens));
  const Bottleneck b = price_ranks(*this, s, pl, pt, layer, tokens, out);
  price_step(*this, s, pl, pt, g, layer, b, tokens, out);
  return ok_status();
}

double vocab_stats_exchange_s(const CostModel& cm, const Strategy& s, double tokens) {
  if (s.tp <= 1) return 0.0;
  const Network& net = cm.network();
  // all_gather_s takes the gathered tensor's bytes: every tensor rank's stats of every token.
  return net.all_gather_s(s.tp * tokens * kVocabStatsBytesPerToken, mesh_groups(s, net).tp);
}

}  // namespace piper::cost
