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

#include "piper/spec/activation_counting.h"
#include "piper/spec/model_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::cost {

struct ActivationOptions {
  int tp = 1;
  int etp = 1;
  bool sp = false;
  Recompute recompute = Recompute::kNone;
  int64_t seq_len = 4096;
  double act_bytes = 2;         // activation dtype width
  bool dropout = false;         // 1-byte masks after attention, after the MLP and on the s x s probabilities
  bool flash_attention = true;  // fused attention: no s x s tensors
  // Full recompute granularity. Piper's runtime (src/runtime) recomputes per chunk (attn, router, experts,
  // shared, mlp, head): it keeps every chunk's input, i.e. per layer the layer input and the attention output,
  // and per MoE layer also the router's normed output and routing (k int32 indices + k fp32 weights) and, with
  // shared experts, their output (the next layer sums it with the routed output). false = Megatron/Korthikanti
  // per-layer recompute: the layer input only (2sbh).
  bool recompute_per_chunk = true;
  // Strategy::recompute_modules "layernorm" and "moe_act" (spec/activation_counting.h).
  bool recompute_moe_norm = false;
  bool recompute_moe_act = false;
  // The routed experts' rows on this rank over the mean rank's (Calibration::expert_load_imbalance: the busiest ep
  // rank's, as the experts' time is priced; 1 = balanced): everything held per routed row (the dispatched tokens,
  // the experts' intermediates and outputs, and the B -> W gradients of those rows) scales with it; the router,
  // the shared experts and everything per token of the layer do not.
  double expert_load = 1;
  // Backward working set (backward_working_set_bytes_per_token): the attention materialises its s x s
  // probabilities (Calibration::attention_score_bytes > 0: Piper's CPU runtime), and the experts' rows arrive by
  // an all-to-all (ep > 1) rather than from the layer's own tokens.
  bool materialised_scores = false;
  bool expert_parallel = false;
};

// Bytes per token of one layer, split by part. `norms` is the two pre-norm inputs.
struct LayerActivation {
  double attention = 0;
  double mlp = 0;  // dense MLP, or router + dispatch/combine + experts + shared experts for a MoE layer
  double norms = 0;
  double total() const { return attention + mlp + norms; }
};

// One layer of the given kind (MoE or dense), under the options. Full recompute returns the kept chunk inputs
// (see recompute_per_chunk; the layer input in `norms`). Precondition: the model is valid.
LayerActivation layer_activation_bytes_per_token(const ModelSpec& model, bool moe_layer, const ActivationOptions& o);

// The same layer without any recomputation: what a fully recomputed layer re-materialises during its backward.
LayerActivation layer_activation_peak_bytes_per_token(const ModelSpec& model, bool moe_layer,
                                                      const ActivationOptions& o);

// The LM head and loss on the last stage: Megatron's 4sbh(1 + V/h)/tp (input and fp32 logits for the loss).
double head_activation_bytes_per_token(const ModelSpec& model, const ActivationOptions& o);
// The embedding on the first stage: int64 token ids (+ a dropout mask of h when dropout is on).
double embedding_activation_bytes_per_token(const ModelSpec& model, const ActivationOptions& o);

// B -> W: with a split backward (zb-h1, dualpipev's zero-bubble steps) the gradients B leaves for W, per token of one
// layer (spec/activation_counting.h weight_grad_inputs_per_token, the routed experts' rows at o.expert_load), of
// the head and of the embedding.
double layer_weight_grad_input_bytes_per_token(const ModelSpec& model, bool moe_layer, const ActivationOptions& o);
// The head's W inputs: the fp32 logits grad V/tp and the final-norm output grad h; the embedding's: dhidden h.
double head_weight_grad_input_bytes_per_token(const ModelSpec& model, const ActivationOptions& o);
double embedding_weight_grad_input_bytes_per_token(const ModelSpec& model, const ActivationOptions& o);

// The backward's working set (spec/activation_counting.h backward_working_set_per_token) under the options: by chunk
// kind, the routed experts at o.expert_load and the larger of router, experts and shared experts as `moe`.
struct LayerWorkingSet {
  double attention = 0, dense_mlp = 0, moe = 0, head = 0;
};
LayerWorkingSet backward_working_set_bytes_per_token(const ModelSpec& model, const ActivationOptions& o);

}  // namespace piper::cost
