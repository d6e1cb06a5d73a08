// Activation memory per token of one transformer layer, by part, for one microbatch (multiply by tokens).
//
// The model follows Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
// (arXiv:2205.05198): with 16-bit activations, 1-byte dropout masks, a GELU MLP of width 4h and the s x s
// softmax stored, one layer keeps sbh(34 + 5as/h) bytes: attention 11sbh + 5as^2b, MLP 19sbh, two norms 4sbh.
// Tensor parallelism (t) splits everything but the norm inputs, the QKV/fc1 inputs and the dropout masks
// (10 sbh replicated): sbh(10 + 24/t + 5as/(ht)); sequence parallelism also splits those: sbh(34 + 5as/h)/t;
// selective recompute drops the softmax/dropout s^2 terms; full recompute keeps only the layer input (2sbh).
// The same terms generalise to GQA and MLA projections, SwiGLU (3 tensors of width f), no dropout, flash
// attention (no s x s tensors, an fp32 log-sum-exp per head instead) and other activation widths.
// MoE layers (docs/resource_model.md, following llm-analysis and the X-MoE activation table): the router
// logits/probabilities (fp32, E per token), the dispatched tokens and the expert outputs before the weighted
// combine (each k copies of h), the routing weights (fp32, k per token) and the expert intermediates (k times
// the expert width; divided by expert-TP). Tokens of MoE layers are split over the TP ranks (sequence
// parallel is required for MoE with tp > 1), so every MoE term is divided by tp.
#pragma once

#include <cstdint>

#include "piper/spec/model_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::cost {

struct ActivationOptions {
  int tp = 1;
  int etp = 1;
  bool sp = false;
  Recompute recompute = Recompute::kNone;
  int64_t seq_len = 4096;
  double act_bytes = 2;          // activation dtype width
  bool dropout = false;          // 1-byte masks after attention, after the MLP and on the s x s probabilities
  bool flash_attention = true;   // fused attention: no s x s tensors
};

// Bytes per token of one layer, split by part. `norms` is the two pre-norm inputs.
struct LayerActivation {
  double attention = 0;
  double mlp = 0;  // dense MLP, or router + dispatch/combine + experts + shared experts for a MoE layer
  double norms = 0;
  double total() const { return attention + mlp + norms; }
};

// One layer of the given kind (MoE or dense), under the options. Full recompute returns the layer input only
// (in `norms`). Precondition: the model is valid.
LayerActivation layer_activation_bytes_per_token(const ModelSpec& model, bool moe_layer, const ActivationOptions& o);

// The same layer without any recomputation: what a fully recomputed layer re-materialises during its backward.
LayerActivation layer_activation_peak_bytes_per_token(const ModelSpec& model, bool moe_layer,
                                                      const ActivationOptions& o);

// The LM head and loss on the last stage: Megatron's 4sbh(1 + V/h)/tp (input and fp32 logits for the loss).
double head_activation_bytes_per_token(const ModelSpec& model, const ActivationOptions& o);
// The embedding on the first stage: int64 token ids (+ a dropout mask of h when dropout is on).
double embedding_activation_bytes_per_token(const ModelSpec& model, const ActivationOptions& o);

}  // namespace piper::cost
