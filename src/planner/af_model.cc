#include "piper/planner/af_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "piper/base/check.h"
#include "piper/cost/activations.h"
#include "piper/cost/layer_cost.h"
#include "piper/cost/model_state.h"
#include "piper/cost/network.h"
#include "piper/spec/counting.h"

namespace piper::planner {
namespace {

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// F + B + W FLOPs (and F alone) of one part for one token, whole layer (no parallelism).
struct PartFlops {
  double all = 0, fwd = 0;
};

PartFlops part_flops(const cost::PartTable& table, cost::Part part) {
  cost::PartShape shape;
  shape.tokens = 1;
  cost::PartCost c = cost::part_cost(table, part, shape);
  return {c.f.flops + c.b.flops + c.w.flops, c.f.flops};
}

// Per-token FLOPs of the attention side (whole model) at a sequence length, F + B + W.
double attn_side_flops(const ModelSpec& m, int64_t seq_len) {
  cost::PartTable t = cost::make_part_table(m, seq_len);
  const int n_moe = m.num_moe_layers(), n_dense = m.num_layers - n_moe;
  using cost::Part;
  return m.num_layers * (part_flops(t, Part::kAttention).all + part_flops(t, Part::kAttentionCore).all +
                         part_flops(t, Part::kNorms).all) +
         n_dense * part_flops(t, Part::kDenseMlp).all +
         n_moe * (part_flops(t, Part::kRouter).all + part_flops(t, Part::kSharedExperts).all) +
         part_flops(t, Part::kEmbedding).all + part_flops(t, Part::kHead).all;
}

}  // namespace

const char* to_string(AfPlacement p) { return p == AfPlacement::kNode ? "node" : "spread"; }

Result<AfPlacement> parse_af_placement(const std::string& text) {
  if (text == "spread") return AfPlacement::kSpread;
  if (text == "node") return AfPlacement::kNode;
  return invalid_argument("--af-placement=" + text + " is not one of {spread, node}");
}

Strategy AfCandidate::strategy() const {
  Strategy s;
  s.dp = dp_a;
  s.pp = pp;
  s.ep = ep;
  s.zero = 1;
  s.recompute = recompute;
  s.schedule = "af-pipe";
  s.microbatches = microbatches;
  s.disaggregate = true;
  s.attn_ranks = attn;
  s.ffn_ranks = ffn;
  return s;
}

Result<AfModel> AfModel::create(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                const AfOptions& options) {
  PIPER_RETURN_IF_ERROR(model.validate());
  PIPER_RETURN_IF_ERROR(cluster.validate());
  PIPER_RETURN_IF_ERROR(train.validate());
  if (!model.is_moe()) {
    return invalid_argument("plan --disaggregate: model " + model.name +
                            " has no routed experts; attention/FFN disaggregation needs a MoE model");
  }
  if (train.global_batch < 1) return invalid_argument("plan --disaggregate: the global batch must be >= 1 sequence");
  if (options.pp.empty() || options.recompute.empty()) {
    return invalid_argument("plan --disaggregate: the pp and recompute lists must not be empty");
  }
  for (int p : options.pp) {
    if (p < 1) return invalid_argument("plan --disaggregate: pp=" + std::to_string(p) + " must be >= 1");
  }
  PIPER_RETURN_IF_ERROR(cost::ByteConvention::from_train(train).status());
  if (options.mbs < 1) return invalid_argument("plan --disaggregate: mbs must be >= 1");
  if (!(options.memory_fraction > 0 && options.memory_fraction <= 1)) {
    return invalid_argument("plan --disaggregate: memory_fraction must be in (0, 1]");
  }
  if (cluster.world_size() < 2) {
    return invalid_argument("plan --disaggregate: needs at least 2 devices (one attention, one FFN); the cluster has " +
                            std::to_string(cluster.world_size()));
  }
  AfModel a;
  a.model_ = model;
  a.cluster_ = cluster;
  a.train_ = train;
  a.options_ = options;
  a.world_ = cluster.world_size();
  const int dpn = cluster.node.devices_per_node;
  if (cluster.num_nodes > 1) {
    if (cluster.node.nics.empty()) {
      return invalid_argument("cluster " + cluster.name + ": several nodes but no NICs; describe node.nics");
    }
    a.ports_are_nics_ = true;
    a.ports_per_node_ = static_cast<int>(cluster.node.nics.size());
    a.port_bw_ = cluster.node.nic_bw_total() / a.ports_per_node_;
  } else {
    a.ports_per_node_ = dpn;  // one node: A and F exchange over the device links, one port per GPU
    a.port_bw_ = cluster.node.intra.bw_bytes_per_s;
  }
  if (a.port_bw_ <= 0) return invalid_argument("cluster " + cluster.name + ": no bandwidth between devices");
  a.total_ports_ = a.ports_per_node_ * cluster.num_nodes;
  cost::DeviceModel device(cluster.device, train.param_dtype, a.calibration_,
                           cost::rate_share(cluster.node, a.calibration_), cluster.node.device_cores);
  a.peak_ = device.peak_flops();
  if (a.peak_ <= 0) return invalid_argument("cluster " + cluster.name + ": no peak FLOP/s for the compute dtype");
  a.memory_limit_ = options.memory_fraction * static_cast<double>(cluster.device.memory_bytes);

  const cost::PartTable t = cost::make_part_table(model, train.seq_len);
  const int n_moe = model.num_moe_layers();
  a.attn_flops_per_token_ = attn_side_flops(model, train.seq_len);
  a.ffn_flops_per_token_ = n_moe * part_flops(t, cost::Part::kExperts).all;
  a.bytes_per_token_ = n_moe * t.hidden * dtype_bytes(train.activation_dtype) * (t.top_k + 1);
  a.attn_core_flops_per_token_per_seq_ =
      (attn_side_flops(model, 2 * train.seq_len) - a.attn_flops_per_token_) / static_cast<double>(train.seq_len);
  a.model_flops_per_token_ = training_flops_per_token(model, train.seq_len);
  return a;
}

std::vector<AfCandidate> AfModel::candidates(std::vector<std::pair<std::string, int64_t>>* rejected) const {
  std::vector<std::pair<std::string, int64_t>> counts = {{"pp_divides_world", 0},   {"pp_exceeds_moe_layers", 0},
                                                         {"batch_divisibility", 0}, {"microbatches_lt_2pp", 0},
                                                         {"memory_attention", 0},   {"memory_ffn", 0}};
  using cost::Part;
  const cost::PartTable t = cost::make_part_table(model_, train_.seq_len);
  const cost::DeviceModel device(cluster_.device, train_.param_dtype, calibration_,
                                 cost::rate_share(cluster_.node, calibration_), cluster_.node.device_cores);
  const auto bytes_or = cost::ByteConvention::from_train(train_);
  const cost::ByteConvention bytes = bytes_or.ok() ? *bytes_or : cost::ByteConvention{};
  const int L = model_.num_layers, n_moe = model_.num_moe_layers(), n_dense = L - n_moe;
  const int dpn = cluster_.node.devices_per_node;
  const double h = t.hidden, k = t.top_k, E = t.num_experts;
  const double act_b = dtype_bytes(train_.activation_dtype);
  const double T = static_cast<double>(options_.mbs) * static_cast<double>(train_.seq_len);
  const double head = part_flops(t, Part::kHead).all, emb = part_flops(t, Part::kEmbedding).all;
  const double a_layer =
      part_flops(t, Part::kAttention).all + part_flops(t, Part::kAttentionCore).all + part_flops(t, Part::kNorms).all;
  const double a_layer_fwd =
      part_flops(t, Part::kAttention).fwd + part_flops(t, Part::kAttentionCore).fwd + part_flops(t, Part::kNorms).fwd;
  const PartFlops dense = part_flops(t, Part::kDenseMlp);
  const PartFlops moe_a = {part_flops(t, Part::kRouter).all + part_flops(t, Part::kSharedExperts).all,
                           part_flops(t, Part::kRouter).fwd + part_flops(t, Part::kSharedExperts).fwd};
  const double experts = part_flops(t, Part::kExperts).all;
  cost::ActivationOptions ao;
  ao.seq_len = train_.seq_len;
  ao.act_bytes = act_b;
  const cost::LayerActivation act_moe = cost::layer_activation_bytes_per_token(model_, true, ao);
  const cost::LayerActivation act_dense = cost::layer_activation_bytes_per_token(model_, false, ao);
  const double act_head = cost::head_activation_bytes_per_token(model_, ao);
  const double eff_a = device.gemm_efficiency(std::min(h, T));
  auto max_ports = [&](int gpus, int per_node) {
    if (!ports_are_nics_) return gpus;  // one node: each GPU's own device link
    const int nodes =
        options_.placement == AfPlacement::kNode ? ceil_div(gpus, per_node) : std::min(cluster_.num_nodes, gpus);
    return ports_per_node_ * nodes;
  };
  std::vector<AfCandidate> out;
  const int64_t per_p = static_cast<int64_t>(options_.recompute.size());
  for (int p : options_.pp) {
    const int64_t splits = world_ / p - 1;  // dp_a = 1 .. world/p - 1
    if (world_ % p != 0) {
      counts[0].second += std::max<int64_t>(0, splits) * per_p;
      continue;
    }
    if (p > n_moe) {
      counts[1].second += std::max<int64_t>(0, splits) * per_p;
      continue;
    }
    const int moe_stage = ceil_div(n_moe, p), dense_stage = n_dense > 0 ? ceil_div(n_dense, p) : 0;
    const int layers_stage = ceil_div(L, p);
    // Worst A stage: an even share of the layers plus the head (and the embedding when there is one stage).
    const double stage_a = (L * a_layer + n_dense * dense.all + n_moe * moe_a.all) / p + head + (p == 1 ? emb : 0);
    const double stage_a_fwd = (L * a_layer_fwd + n_dense * dense.fwd + n_moe * moe_a.fwd) / p;
    const double stage_f = moe_stage * experts;
    for (int dp_a = 1; dp_a <= splits; ++dp_a) {
      const int attn = dp_a * p, ffn = world_ - attn, ffn_stage = ffn / p;
      const int64_t per_mb = static_cast<int64_t>(dp_a) * options_.mbs;
      if (train_.global_batch % per_mb != 0) {
        counts[2].second += per_p;
        continue;
      }
      const int64_t m = train_.global_batch / per_mb;
      if (m < 2 * p) {
        counts[3].second += per_p;
        continue;
      }
      const int ep = std::gcd(static_cast<int>(E), ffn_stage);  // experts sharded as widely as the stage allows
      const double d = cost::expected_distinct_nodes(ffn_stage, k);
      const double tokens_per_expert = dp_a * T * k / E;
      const double eff_f = device.gemm_efficiency(std::min(h, tokens_per_expert));
      const double t_f_plain = dp_a * T * stage_f / ffn_stage / (peak_ * eff_f);
      for (Recompute rc : options_.recompute) {
        AfCandidate c;
        c.attn = attn;
        c.ffn = ffn;
        c.pp = p;
        c.ep = ep;
        c.dp_a = dp_a;
        c.microbatches = static_cast<int>(m);
        c.recompute = rc;
        c.distinct_ffn_ranks = d;
        // Recomputation (attention side only) re-runs the stage's forward inside the backward.
        const double t_a = T * (stage_a + (rc == Recompute::kNone ? 0.0 : stage_a_fwd)) / (peak_ * eff_a);
        // On the F side it re-runs the expert forward on the re-dispatched tokens: +1/3.
        const double t_f = rc == Recompute::kNone ? t_f_plain : t_f_plain * 4.0 / 3.0;
        c.step_attn_s = m * t_a;
        c.step_ffn_s = m * t_f;
        // A<->F bytes per direction per MoE layer: forward dispatch (d copies) + backward combine gradient (1);
        // recomputation dispatches the tokens again in the backward (F keeps nothing): 2d + 1.
        const double x = moe_stage * T * h * act_b * (rc == Recompute::kNone ? d + 1 : 2 * d + 1);
        c.step_bytes = static_cast<double>(m) * attn * x;
        c.fill_s = (2 * p - 1) * (t_a + t_f) / 2;
        c.max_ports_attn = max_ports(attn, dpn);
        c.max_ports_ffn = max_ports(ffn, dpn);
        // Memory: ZeRO-1 model states, in-flight activations, workspace, M2N buffers.
        // Like 1F1B, the first stage holds pp microbatches; the head's logits are held for one.
        const int in_flight = static_cast<int>(std::min<int64_t>(m, p));
        const double params_a =
            layers_stage * (t.attention_params + t.norm_params_per_layer) + dense_stage * t.dense_mlp_params +
            moe_stage * (t.router_params + t.shared_params) +
            (p == 1 ? t.embedding_params + t.head_params : std::max(t.embedding_params, t.head_params));
        double act_layer_a = rc == Recompute::kNone ? std::max(act_moe.attention + act_moe.norms, act_dense.total())
                                                    : act_b * h;  // full recomputation keeps the layer input only
        const double buffers = calibration_.workspace_bytes + 2 * T * h * act_b * (d + 1);
        // Worst of the first stage (pp microbatches in flight) and the last (one, plus the head's logits).
        const double act_a =
            p == 1 ? T * (layers_stage * act_layer_a + act_head)
                   : T * std::max(in_flight * layers_stage * act_layer_a, layers_stage * act_layer_a + act_head);
        c.mem_attn_bytes = cost::model_state_bytes(params_a, 1, dp_a, bytes).total() + act_a + buffers +
                           (rc == Recompute::kNone ? 0.0 : T * (act_moe.attention + act_moe.norms));
        const double params_f = moe_stage * (E / ep) * t.expert_params;
        const double tokens_f = dp_a * T / ffn_stage;  // tokens (each with k experts) per F GPU per microbatch
        const double act_f = rc == Recompute::kNone ? in_flight * moe_stage * tokens_f * act_moe.mlp
                                                    : tokens_f * act_moe.mlp;  // one layer being recomputed
        c.mem_ffn_bytes = cost::model_state_bytes(params_f, 1, ffn_stage / ep, bytes).total() + act_f + buffers;
        if (c.mem_attn_bytes > memory_limit_) {
          ++counts[4].second;
        } else if (c.mem_ffn_bytes > memory_limit_) {
          ++counts[5].second;
        } else {
          out.push_back(c);
        }
      }
    }
  }
  if (rejected) *rejected = counts;
  return out;
}

bool AfModel::ports_feasible(const AfCandidate& c, int ports_attn) const {
  const int ports_ffn = total_ports_ - ports_attn;
  return ports_attn >= 1 && ports_ffn >= 1 && ports_attn <= c.max_ports_attn && ports_ffn <= c.max_ports_ffn;
}

double AfModel::net_attn_s(const AfCandidate& c, int ports_attn) const {
  return c.step_bytes / (ports_attn * port_bw_);
}

double AfModel::net_ffn_s(const AfCandidate& c, int ports_attn) const {
  return c.step_bytes / ((total_ports_ - ports_attn) * port_bw_);
}

double AfModel::bottleneck_s(const AfCandidate& c, int ports_attn) const {
  return std::max({c.step_attn_s, c.step_ffn_s, net_attn_s(c, ports_attn), net_ffn_s(c, ports_attn)});
}

double AfModel::objective(const AfCandidate& c, int ports_attn) const {
  return step_time_s(c, ports_attn) - options_.busy_weight * std::min(c.step_attn_s, c.step_ffn_s);
}

double AfModel::balance(int gpus, int ports) const {
  const cost::DeviceModel device(cluster_.device, train_.param_dtype, calibration_,
                                 cost::rate_share(cluster_.node, calibration_), cluster_.node.device_cores);
  return gpus * peak_ * device.gemm_efficiency(static_cast<double>(model_.hidden_size)) / (ports * port_bw_);
}

double AfModel::attn_turning_seq(double balance_flops_per_byte) const {
  if (attn_core_flops_per_token_per_seq_ <= 0) return 0;
  const double fixed = attn_flops_per_token_ - attn_core_flops_per_token_per_seq_ * static_cast<double>(train_.seq_len);
  return std::max(0.0, (balance_flops_per_byte * bytes_per_token_ - fixed) / attn_core_flops_per_token_per_seq_);
}

double AfModel::mfu(double step_time_s) const {
  const double tokens = static_cast<double>(train_.global_batch) * static_cast<double>(train_.seq_len);
  return model_flops_per_token_ * tokens / (step_time_s * world_ * peak_);
}

}  // namespace piper::planner
