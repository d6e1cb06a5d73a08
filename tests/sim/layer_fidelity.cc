#include "layer_fidelity.h"

#include <string>

#include "piper/cost/layer_cost.h"
#include "piper/cost/network.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::fidelity {
namespace {

// Korthikanti et al. Table 3 and its experiments section: the 22B model is GPT-3 style (learned positions,
// LayerNorm, GeLU MLP of 4h, biases), 48 layers, hidden 6144, 64 heads, vocabulary 51200, sequence 2048.
constexpr const char* kGpt22b =
    R"({"name": "gpt-22b", "source": "Korthikanti et al., arXiv:2205.05198, Table 3",
        "num_layers": 48, "hidden_size": 6144, "attention": "standard", "num_heads": 64, "num_kv_heads": 64,
        "attention_bias": true, "mlp": "gelu", "intermediate_size": 24576, "mlp_bias": true,
        "vocab_size": 51200, "tie_embeddings": true, "norm": "layernorm", "norm_bias": true,
        "learned_positions": true, "max_seq_len": 2048})";

constexpr const char* kSource =
    "Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models (MLSys'23, "
    "arXiv:2205.05198), Table 4 (one layer of the 22B model; Table 3: tp 8, micro batch 4, s 2048; A100 80 GB)";

// Measured on this row: backward 11 % slow, forward 4 % fast. The paper, discussing Table 4, says Megatron's
// backward overlaps the tensor-parallel all-reduce with the weight-gradient GEMMs; the closed form prices the
// backward's two all-reduces (1.55 ms here) exposed. The sequence-parallel rows are within band because their
// backward prices ~1 ms less compute (norms on 1/tp of the tokens); the full- and selective-recompute rows add
// re-run work to the same backward and stay within 10 %.
constexpr const char* kBackwardTpOverlapGap =
    "backward 11 % slow: Megatron overlaps the backward's tensor-parallel all-reduce with the weight-gradient "
    "GEMMs (arXiv:2205.05198, on Table 4); the closed form prices it exposed (1.55 ms of 13.3)";

}  // namespace

bool LayerResult::in_band() const {
  auto in = [&](double r) { return r >= lo && r <= hi; };
  return in(forward_ratio) && in(backward_ratio) && in(combined_ratio);
}

std::vector<LayerRow> korthikanti_layer_rows() {
  struct Spec {
    const char* name;
    bool sp;
    LayerRecompute recompute;
    double fwd_ms, bwd_ms;
  };
  // Table 4 as published: forward, backward (combined = their sum; overhead against the first row).
  const Spec specs[] = {
      {"baseline, no recompute", false, LayerRecompute::kNone, 7.7, 11.9},
      {"sequence parallelism", true, LayerRecompute::kNone, 7.2, 11.8},
      {"baseline with full recompute", false, LayerRecompute::kFull, 7.7, 19.5},
      {"selective recompute", false, LayerRecompute::kAttentionCore, 7.7, 13.2},
      {"selective + sequence", true, LayerRecompute::kAttentionCore, 7.2, 13.1},
  };
  std::vector<LayerRow> rows;
  for (const Spec& s : specs) {
    LayerRow r;
    r.name = s.name;
    r.source = kSource;
    r.model = kGpt22b;
    r.cluster = "dgx-a100";
    r.seq_len = 2048;
    r.mbs = 4;
    r.tp = 8;
    r.sp = s.sp;
    r.recompute = s.recompute;
    r.published_forward_ms = s.fwd_ms;
    r.published_backward_ms = s.bwd_ms;
    r.lo = 0.90;
    r.hi = 1.10;
    // 2022 Megatron-LM: attention scores materialised (no fused attention), and activation checkpointing re-runs
    // the forward's tensor-parallel all-reduces: the SC'21 rows' calibration, not fitted to these rows.
    r.calibration.attention_score_bytes = 13;
    r.calibration.recompute_reruns_tp_collectives = true;
    if (!s.sp && s.recompute == LayerRecompute::kNone) {
      r.status = RowStatus::kOpenGap;
      r.note = kBackwardTpOverlapGap;
    }
    rows.push_back(r);
  }
  return rows;
}

Result<LayerResult> evaluate_layer(const LayerRow& row) {
  if (row.tp < 1 || row.mbs < 1 || row.seq_len < 1) {
    return invalid_argument("layer row '" + row.name + "': tp, mbs and seq_len must be >= 1 (got tp " +
                            std::to_string(row.tp) + ", mbs " + std::to_string(row.mbs) + ", seq_len " +
                            std::to_string(row.seq_len) + "); fix the row");
  }
  PIPER_ASSIGN_OR_RETURN(ModelSpec model, load_model_from_text(row.model, "", row.name));
  PIPER_ASSIGN_OR_RETURN(ClusterSpec cluster, load_cluster(row.cluster, 1));
  const cost::PartTable table = cost::make_part_table(model, row.seq_len);
  cost::PartShape shape;
  shape.tokens = static_cast<double>(row.mbs) * static_cast<double>(row.seq_len);
  shape.tp = row.tp;
  shape.sp = row.sp;
  shape.act_bytes = 2;
  shape.param_bytes = 2;
  shape.grad_bytes = 4;
  shape.attention_score_bytes = row.calibration.attention_score_bytes;
  const cost::DeviceModel device(cluster.device, DType::kBF16, row.calibration);
  auto time = [&](const cost::TaskCost& k) {
    return device.time_s(k.flops, k.bytes, k.gemm_dim, k.attention_kernel) + device.memory_time_s(k.pointwise_bytes);
  };
  LayerResult out;
  for (cost::Part part :
       {cost::Part::kNorms, cost::Part::kAttention, cost::Part::kAttentionCore, cost::Part::kDenseMlp}) {
    const cost::PartCost c = cost::part_cost(table, part, shape);
    const double f = time(c.f);
    out.compute_forward_s += f;
    out.compute_backward_s += time(c.b) + time(c.w);
    if (part == cost::Part::kAttention) out.attention_projections_forward_s = f;
    if (row.recompute == LayerRecompute::kFull ||
        (row.recompute == LayerRecompute::kAttentionCore && part == cost::Part::kAttentionCore)) {
      out.compute_backward_s += f;
    }
  }
  // Two tensor-parallel collectives forward and two backward (all-reduces; under sequence parallelism an
  // all-gather and a reduce-scatter each, the same bytes), priced as the closed form prices them.
  const cost::Network net(cluster);
  const cost::GroupLayout g = net.layout(row.tp, 1);
  const double bytes = shape.tokens * table.hidden * shape.act_bytes;
  const double one = row.tp == 1 ? 0.0
                     : row.sp    ? net.all_gather_s(bytes, g) + net.reduce_scatter_s(bytes, g)
                                 : net.all_reduce_s(bytes, g, cost::AllReduceAlgo::kRing);
  out.tp_forward_s = 2 * one;
  out.tp_backward_s = 2 * one;
  if (row.recompute == LayerRecompute::kFull && row.calibration.recompute_reruns_tp_collectives) {
    out.tp_backward_s += 2 * one;
  }
  const double pf = row.published_forward_ms * 1e-3, pb = row.published_backward_ms * 1e-3;
  out.forward_ratio = out.forward_s() / pf;
  out.backward_ratio = out.backward_s() / pb;
  out.combined_ratio = (out.forward_s() + out.backward_s()) / (pf + pb);
  out.lo = row.lo;
  out.hi = row.hi;
  return out;
}

}  // namespace piper::fidelity
