#include "piper/cost/layer_cost.h"

#include <algorithm>
#include <cmath>

#include "piper/cost/device_model.h"
#include "piper/spec/counting.h"

namespace piper::cost {

PartTable make_part_table(const ModelSpec& m, int64_t seq_len) {
  PartTable t;
  t.hidden = static_cast<double>(m.hidden_size);
  t.vocab = static_cast<double>(m.vocab_size);
  t.top_k = m.moe.top_k;
  t.num_experts = m.moe.num_experts;
  t.expert_width = static_cast<double>(m.moe.expert_intermediate_size);
  t.shared_width = static_cast<double>(m.moe.shared_expert_intermediate_size) * m.moe.num_shared_experts;
  t.dense_width = static_cast<double>(m.intermediate_size);
  t.head_dim = static_cast<double>(m.qk_head_dim());
  t.attention_params = static_cast<double>(attention_params(m));
  t.norm_params_per_layer = 2.0 * static_cast<double>(norm_params(m));
  if (m.is_moe()) {
    t.router_params = static_cast<double>(router_params(m));
    t.expert_params = static_cast<double>(expert_params(m));
    t.shared_params = static_cast<double>(shared_experts_params(m));
  }
  if (m.num_dense_layers() > 0) t.dense_mlp_params = static_cast<double>(dense_mlp_params(m));
  ParamCounts counts = count_params(m);
  t.embedding_params = static_cast<double>(counts.embedding.total);
  t.head_params = static_cast<double>(counts.head.total);
  if (t.head_params == 0) t.head_params = t.hidden * t.vocab;  // tied: the head still computes with V x h
  double core = 0;
  for (int l = 0; l < m.num_layers; ++l) core += attention_core_forward_flops_per_token(m, l, seq_len);
  t.attention_core_flops = m.num_layers > 0 ? core / m.num_layers : 0.0;
  t.score_elements_per_token = static_cast<double>(m.num_heads) * static_cast<double>(seq_len);
  const double v_width = m.num_heads * static_cast<double>(m.v_head_dim());
  const double matmul = static_cast<double>(attention_matmul_params(m));
  t.attention_out_share = matmul > 0 ? v_width * t.hidden / matmul : 0.0;
  t.mlp_out_share = m.mlp == MlpType::kSwiGLU ? 1.0 / 3.0 : 0.5;
  return t;
}

namespace {

// A matmul part: F = B = W = 2 * tokens * weights (per rank); bytes = weights + activations in and out.
// inner_width >= 0 marks a block that runs its GEMMs in fp8 when the shape says so: its GEMM inputs are the
// block input (in_width) and the inner activation (inner_width, e.g. the MLP's f / tp), its output gradients
// out_width and inner_width (PartShape::quantize_*_bytes).
PartCost matmul(double tokens, double weights_per_rank, double in_width, double out_width, double gemm_dim,
                const PartShape& s, double pointwise_f = 0, double inner_width = -1) {
  PartCost c;
  const double flops = 2 * tokens * weights_per_rank;
  const double acts = tokens * (in_width + out_width) * s.act_bytes;
  c.f = {flops, weights_per_rank * s.param_bytes + acts, gemm_dim};
  c.b = {flops, weights_per_rank * s.param_bytes + 2 * acts, gemm_dim};
  c.w = {flops, weights_per_rank * 2 * s.grad_bytes + acts, gemm_dim};
  c.f.pointwise_bytes = pointwise_f;
  c.b.pointwise_bytes = 2 * pointwise_f;
  if (inner_width >= 0) {
    c.f.pointwise_bytes += tokens * (in_width + inner_width) * s.quantize_f_bytes;
    c.b.pointwise_bytes += tokens * (out_width + inner_width) * s.quantize_b_bytes;
  }
  return c;
}

}  // namespace

void quantize_bytes_per_element(Precision precision, double* forward, double* backward) {
  const double fp8 = 1.0 + 1.0 / 32.0;  // an element and its share of the scales (TrainSpec::stored_bytes)
  *forward = 0;
  *backward = 0;
  if (precision == Precision::kBF16) return;
  // Forward: read bf16 (2), write row-wise fp8; MXFP8 scales along the other dimension for the weight gradient
  // too (a second, column-wise copy). Backward: read 2, write both copies (input gradient and weight gradient).
  *forward = 2 + (precision == Precision::kMXFP8 ? 2 : 1) * fp8;
  *backward = 2 + 2 * fp8;
}

double experts_with_rows(double local_experts, double rows) {
  if (!(local_experts > 0) || !(rows > 0)) return 0;
  if (local_experts <= 1) return 1;
  return local_experts * (1 - std::pow(1 - 1 / local_experts, rows));
}

PartCost part_cost(const PartTable& t, Part part, const PartShape& s) {
  const double T = s.tokens;
  const double tp = s.tp;
  const double h = t.hidden;
  switch (part) {
    case Part::kEmbedding: {
      PartCost c;  // a gather forward, a scatter-add of gradients: memory traffic only
      c.f = {0, T * h * s.act_bytes * 2 / tp, 0};
      c.w = {0, T * h * (s.act_bytes + s.grad_bytes) / tp, 0};
      return c;
    }
    case Part::kNorms: {
      PartCost c;  // two norms (read h, write h) and two residual adds (read 2h, write h)
      const double f = T * 10 * h * s.act_bytes / (s.sp ? tp : 1.0);
      c.f.pointwise_bytes = f;
      c.b.pointwise_bytes = 2 * f;
      return c;
    }
    case Part::kAttention:  // + RoPE on Q and K (read and write)
      return matmul(T, t.attention_params / tp, h, h, std::min(T, h / tp), s, T * 4 * h * s.act_bytes / tp, h / tp);
    case Part::kAttentionCore: {
      PartCost c;
      const double flops = T * t.attention_core_flops / tp;
      const double acts = T * 4 * h * s.act_bytes / tp;  // Q, K, V in, O out (order of magnitude for MLA too)
      // Backward: dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q, and a fused (flash) kernel, which kept no
      // scores, first recomputes S = Q K^T: 5 matmuls against the forward's 2, 2.5x its FLOPs (the convention of
      // FlashAttention's and FlashAttention-3's benchmarks, Dao-AILab/flash-attention benchmarks/
      // benchmark_flash_attention.py and hopper/benchmark_attn.py, whose measured backward TFLOP/s are per 2.5x).
      // With materialised scores the backward reads P back: 4 matmuls, 2x.
      const double backward = s.attention_score_bytes > 0 ? 2.0 : 2.5;
      c.f = {flops, acts, t.head_dim};
      c.b = {backward * flops, 2 * acts, t.head_dim};
      c.f.attention_kernel = c.b.attention_kernel = true;
      // Materialised scores: QK^T writes them, softmax and dropout read and write them, AV reads them;
      // the backward moves about twice as much (pointwise convention above).
      c.f.pointwise_bytes = T * t.score_elements_per_token / tp * s.attention_score_bytes;
      c.b.pointwise_bytes = 2 * c.f.pointwise_bytes;
      return c;
    }
    case Part::kRouter: {  // + fp32 scores and top-k (read and write E), token permute (read and write k h)
      const double pw = T / tp * (8 * t.num_experts + 2 * t.top_k * h * s.act_bytes);
      PartCost c = matmul(T / tp, t.router_params, h, t.num_experts, std::min(T / tp, t.num_experts), s, pw);
      // The pre-MLP norm (its parameters are the router chunk's): read h, write h per token.
      if (s.recompute_moe_norm) c.b.pointwise_bytes += T / tp * 2 * h * s.act_bytes;
      return c;
    }
    case Part::kExperts: {
      // Pairs this rank computes; per local expert the GEMM has M = pairs * ep / E rows (gathered over etp).
      const double pairs = T / tp * t.top_k * s.expert_load;
      const double local_experts = t.num_experts / s.ep;
      const double rows_per_expert = pairs * s.etp / local_experts;
      // + the activation function (read 2f, write f per pair) and the weighted combine (read k h, write h)
      const double act_fn = pairs * 3 * t.expert_width * s.act_bytes;
      const double pw = act_fn + T / tp * (t.top_k + 1) * h * s.act_bytes;
      PartCost c = matmul(pairs * s.etp, t.expert_params / s.etp, h, h,
                          std::min({rows_per_expert, t.expert_width / s.etp, h}), s, pw, t.expert_width / s.etp);
      // Weights read: every local expert's shard, not one expert.
      const double wbytes = local_experts * t.expert_params / s.etp;
      c.f.bytes += wbytes * s.param_bytes - t.expert_params / s.etp * s.param_bytes;
      c.b.bytes += wbytes * s.param_bytes - t.expert_params / s.etp * s.param_bytes;
      c.w.bytes += (wbytes - t.expert_params / s.etp) * 2 * s.grad_bytes;
      if (s.recompute_moe_act) c.b.pointwise_bytes += act_fn;
      // Each local expert that gets rows is one call of the runtime's SwiGLU per task (its gather, three GEMMs on
      // weights that other layers and microbatches evicted, activation, scatter): a fixed cost the FLOPs do not
      // price, so many small microbatches cost more than one large one of the same batch.
      // And per row, what the kernels take beyond the GEMM curve's price as the rows grow (the gathered rows and
      // the SwiGLU's intermediates outgrow the core's cache): the same at any microbatch count of a batch.
      // Both are measured at one expert shape (H, F) and scaled to this rank's slice of an expert (h, f / etp).
      // The call's cost is mostly reading the expert's cold weights: by its weight bytes, h f / etp over H F. A
      // row's is the gather and scatter of its h values, the down projection's h outputs and the SwiGLU's gate, up
      // and activation values, f / etp each: by (h + f / etp) / (H + F). Under etp every slice gathers all the rows
      // at full h but computes 1 / etp of the width, so a slice is not charged the full-width row.
      const double f_slice = t.expert_width / s.etp;
      const bool scaled = s.expert_shape_hidden > 0 && s.expert_shape_ffn > 0;
      const double call_scale = scaled ? h * f_slice / (s.expert_shape_hidden * s.expert_shape_ffn) : 1.0;
      const double row_scale = scaled ? (h + f_slice) / (s.expert_shape_hidden + s.expert_shape_ffn) : 1.0;
      const double rows = pairs * s.etp;
      const double calls = experts_with_rows(local_experts, rows);
      c.f.fixed_s = calls * call_scale * s.expert_call_s[0] + rows * row_scale * s.expert_row_s[0];
      c.b.fixed_s = calls * call_scale * s.expert_call_s[1] + rows * row_scale * s.expert_row_s[1];
      c.w.fixed_s = calls * call_scale * s.expert_call_s[2] + rows * row_scale * s.expert_row_s[2];
      return c;
    }
    case Part::kSharedExperts:
      if (!(t.shared_params > 0)) return {};  // none: no GEMM, and no activations to read or write either
      return matmul(T, t.shared_params / tp, h, h, std::min(T, t.shared_width / tp), s,
                    T * 3 * t.shared_width * s.act_bytes / tp, t.shared_width / tp);
    case Part::kDenseMlp:
      return matmul(T, t.dense_mlp_params / tp, h, h, std::min({T, t.dense_width / tp, h}), s,
                    T * 3 * t.dense_width * s.act_bytes / tp, t.dense_width / tp);
    case Part::kHead:
      // + softmax and cross entropy over fp32 logits (write, read, write the gradient)
      return matmul(T, t.head_params / tp, h, t.vocab / tp, std::min({T, t.vocab / tp, h}), s, T * 12 * t.vocab / tp);
  }
  return {};
}

double task_time_s(const TaskCost& k, const DeviceModel& dev) {
  return dev.time_s(k.flops, k.bytes, k.gemm_dim, k.attention_kernel) + dev.memory_time_s(k.pointwise_bytes) +
         dev.fixed_time_s(k.fixed_s);
}

}  // namespace piper::cost
