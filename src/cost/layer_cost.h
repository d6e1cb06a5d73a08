// FLOPs and bytes of the F (forward), B (input gradient) and W (weight gradient) tasks of every layer part,
// per rank and per microbatch, under tensor, sequence and expert parallelism. The IR compiler and the simulator
// annotate instructions with these; the closed-form estimate sums them per stage.
//
// Conventions: 2 FLOPs per multiply-add. For a matmul part F = 2 * tokens * weights, B = F (activation
// gradient), W = F (weight gradient), so F + B + W = 6 * tokens * weights. The attention core (QK^T and AV,
// causal, as counted in docs/counting.md) has no weights: B = 2F, W = 0. Bytes are what the task reads and
// writes in device memory: its weight shard (param dtype; W writes gradients), plus its input and output
// activations (activation dtype). Pointwise kernels around the GEMMs (norms, residual adds, RoPE, the
// activation function, router softmax/top-k, token permute and weighted combine, softmax + loss) are
// memory-bound; their traffic is `pointwise_bytes` (read + write once forward, about twice that backward)
// [inferred: kernel-by-kernel byte counts, docs/resource_model.md]. The GEMM dimension `gemm_dim` is the smallest of
// the part's GEMM shapes; it sets the shape-dependent efficiency (device_model.h). Tokens per rank:
//   attention, dense MLP, shared experts, head: all tokens of the microbatch; weights split over tp
//   router and routed experts: tokens split over tp (sequence parallel), each routed to k experts; the
//   busiest expert rank receives `expert_load` times the mean.
#pragma once

#include <cstdint>

#include "piper/spec/model_spec.h"
#include "piper/spec/part.h"
#include "piper/spec/train_spec.h"

namespace piper::cost {

// The parts the model is priced by: the one enum of spec/part.h, whose chunks the Plan and the runtime run too.
using piper::kNumParts;
using piper::Part;

struct TaskCost {
  double flops = 0;
  double bytes = 0;            // GEMM operands: overlaps with the FLOPs (roofline max)
  double gemm_dim = 0;         // 0: no GEMM (memory-bound)
  // The attention core (one fused kernel, gemm_dim = head dim): priced by the device's curve, not its measured
  // GEMM table (cost/gemm_table.h measures plain matmuls).
  bool attention_kernel = false;
  double pointwise_bytes = 0;  // separate memory-bound kernels (norms, activation function, RoPE, softmax,
                               // permute/combine, loss): their time adds to the GEMM time
  // Seconds on one thread of one whole core beyond the roofline and the pointwise traffic: measured costs that no
  // FLOP or byte count prices (the routed experts' per expert call and per row, PartShape::expert_call_s /
  // expert_row_s). Adds to the time, stretched by the rank's share of a core (DeviceModel::fixed_time_s).
  double fixed_s = 0;
};

struct PartCost {
  TaskCost f, b, w;
};

class DeviceModel;
// A task's time on `dev`: its roofline plus its pointwise traffic plus its fixed cost, as the simulator and the
// closed form price it (and `piper calibrate` prices what it measures).
double task_time_s(const TaskCost& k, const DeviceModel& dev);

// Per-token, per-layer quantities of a model at a sequence length, computed once (counting.h) and reused for
// every strategy. Parameter counts are elements; FLOPs are forward FLOPs per token for the full (unsharded) part.
struct PartTable {
  double hidden = 0, vocab = 0, top_k = 0, num_experts = 0;
  double expert_width = 0, shared_width = 0, dense_width = 0, head_dim = 0;
  double attention_params = 0, norm_params_per_layer = 0, router_params = 0, expert_params = 0, shared_params = 0,
         dense_mlp_params = 0, embedding_params = 0, head_params = 0;
  double attention_core_flops = 0;  // average over layers (sliding-window layers differ)
  // Share of a block's matmul weights in its output projection (attention: o_proj; MLP and shared experts: the
  // down projection, 1/3 with SwiGLU, else 1/2). The rest is the block's input GEMM(s). tp_overlap pipelines
  // the tp collectives with these two GEMMs.
  double attention_out_share = 0, mlp_out_share = 0;
  // Attention-score elements per token and layer when the scores are materialised (non-fused attention
  // computes the full s x s matrix per head even for causal masks): num_heads * seq_len.
  double score_elements_per_token = 0;
};

PartTable make_part_table(const ModelSpec& model, int64_t seq_len);

struct PartShape {
  double tokens = 0;  // tokens of one microbatch on one data-parallel rank (mbs * seq_len)
  int tp = 1;
  int ep = 1;
  int etp = 1;
  // Sequence parallelism: norms, dropout and residual adds run on 1/tp of the tokens. Without it every tensor-
  // parallel rank runs them on the whole (replicated) hidden state.
  bool sp = false;
  double act_bytes = 2;
  double param_bytes = 2;
  double grad_bytes = 4;
  double expert_load = 1;
  // Device-memory bytes moved per attention-score element in the forward when the attention kernel
  // materialises the scores (Calibration::attention_score_bytes); 0: fused (flash) attention keeps them on chip.
  double attention_score_bytes = 0;
  // Strategy::recompute_modules: the backward first re-runs the MoE layer's pre-MLP norm (router part) or the
  // routed experts' activation function (experts part), the same pointwise traffic as in the forward.
  // Seconds per routed-expert call that receives rows, and per row an expert computes, beyond their FLOPs' and
  // bytes' price, by task (F, B, W): Calibration::expert_call_*_s and expert_row_*_s, measured by `piper
  // calibrate` (cli/calibrate_experts.h); 0 without one.
  double expert_call_s[3] = {0, 0, 0};
  double expert_row_s[3] = {0, 0, 0};
  // The expert shape they were measured at (Calibration::expert_shape_*), which they are scaled from to this
  // model's; 0: charged as they are.
  double expert_shape_hidden = 0;
  double expert_shape_ffn = 0;
  bool recompute_moe_norm = false;
  bool recompute_moe_act = false;
  // FP8 GEMMs (TrainSpec::precision fp8/mxfp8) in the block parts (attention projections, experts, shared
  // experts, dense MLP): quantising kernels are memory-bound work beside them, per element of a GEMM input:
  // quantize_f_bytes in the forward (the block input and the inner activation: read bf16, write fp8 + scales;
  // MXFP8 also writes the column-wise copy the weight gradient needs), quantize_b_bytes in the backward (the
  // output gradients, read once and written row-wise and column-wise). 0: bf16 GEMMs, no quantisation.
  double quantize_f_bytes = 0;
  double quantize_b_bytes = 0;
};

// Quantisation traffic per element for a precision (0, 0 under bf16); see PartShape.
void quantize_bytes_per_element(Precision precision, double* forward, double* backward);

// Expected number of `local_experts` experts that receive at least one of `rows` rows routed uniformly at random
// (each row to one of them): local_experts x (1 - (1 - 1 / local_experts)^rows); local_experts once rows >> it.
double experts_with_rows(double local_experts, double rows);

// One layer's part (or the embedding/head), on one rank, for one microbatch.
PartCost part_cost(const PartTable& table, Part part, const PartShape& shape);

}  // namespace piper::cost
