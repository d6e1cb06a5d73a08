// Parameter and FLOP counting for a ModelSpec (docs/counting.md has the derivations).
//
// Parameters by part, total and active (touched by one token):
//   embedding       token table V*h (+ learned positions max_seq_len*h); fully counted as active
//   attention       Q/K/V/O projections (or MLA's down/up projections and their norms), biases, sinks, QK-norm
//   dense_mlp       the MLP of the dense layers (2 matrices for GELU, 3 for SwiGLU, + biases)
//   routed_experts  E routed experts per MoE layer (active: top_k of them)
//   shared_experts  the shared experts of MoE layers
//   router          h*E (+E bias) per MoE layer
//   norms           the two per-layer norms and the final norm
//   head            the LM head V*h (0 when tied to the embedding)
// params_active counts every weight one token touches, embedding and head included (DeepSeek's "37B" convention);
// params_active_no_embedding drops the input embedding lookup (gpt-oss's and DeepSeek-V2-Lite's convention).
//
// FLOPs: training_flops_per_token = 3 x forward (backward = 2 x forward: input and weight gradients).
// forward = 2 FLOPs per matmul weight touched (attention projections, dense MLP or top-k routed + shared
// experts, router, LM head; not the embedding lookup, norms, biases or sinks) + the attention core: per layer
// and per head 2*(qk_head_dim + v_head_dim) FLOPs per (query, key) pair, with causal masking counted:
// a token attends on average to s/2 keys (half of the full s^2 products), or w - w^2/(2s) keys under a
// sliding window of w < s. Recomputation is not counted: these are model FLOPs.
//
// MFU (model FLOPs utilisation) = training_flops_per_token(model, s) * tokens per second
//                                 / (number of devices * peak dense FLOP/s of the compute dtype).
// All functions are pure; the model must be valid (ModelSpec::validate()).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "piper/spec/model_spec.h"

namespace piper {

struct PartCounts {
  int64_t total = 0;
  int64_t active = 0;
};

struct ParamCounts {
  PartCounts embedding, attention, dense_mlp, routed_experts, shared_experts, router, norms, head;

  int64_t total() const;
  int64_t active() const;
  int64_t active_no_embedding() const { return active() - embedding.active; }
  // ("embedding", embedding), ("attention", attention), ... in the order above.
  std::vector<std::pair<std::string, PartCounts>> parts() const;
};

// Per-layer building blocks (parameter counts, element counts).
int64_t attention_params(const ModelSpec& m);         // one layer's attention, including QK-norm, biases, sinks
int64_t attention_matmul_params(const ModelSpec& m);  // its projection weights only (no biases, norms, sinks)
int64_t mlp_params(const ModelSpec& m, int64_t intermediate, bool bias);  // one MLP of the model's type
int64_t dense_mlp_params(const ModelSpec& m);                             // one dense layer's MLP
int64_t expert_params(const ModelSpec& m);                                // one routed expert
int64_t shared_experts_params(const ModelSpec& m);                        // all shared experts of one MoE layer
int64_t router_params(const ModelSpec& m);                                // one MoE layer's router
int64_t norm_params(const ModelSpec& m);                                  // one norm of width hidden_size

ParamCounts count_params(const ModelSpec& m);

// Matmul FLOPs of one token through one layer's attention projections, MLP/experts and router (forward),
// and the attention core at sequence length seq_len (causal).
double layer_forward_flops_per_token(const ModelSpec& m, int layer, int64_t seq_len);
double attention_core_forward_flops_per_token(const ModelSpec& m, int layer, int64_t seq_len);
double forward_flops_per_token(const ModelSpec& m, int64_t seq_len);
double training_flops_per_token(const ModelSpec& m, int64_t seq_len);

}  // namespace piper
