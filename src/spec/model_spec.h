// ModelSpec: the architecture of a dense or Mixture-of-Experts decoder-only transformer.
//
// One struct covers llama/mixtral/qwen3_moe/deepseek_v2/v3/gpt_oss/olmoe/dbrx and GPT-2/3-style dense models.
// Sizes are element counts (not bytes). Loaders: our own JSON schema (docs/model_schema.md) and Hugging Face
// config.json (model_loader.h); presets live in configs/models/ and are compiled into the binary.
// validate() names the field and the allowed values for every inconsistency.
#pragma once

#include <cstdint>
#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"

namespace piper {

// Standard attention covers MHA (num_kv_heads == num_heads), GQA (1 < kv < heads) and MQA (kv == 1).
enum class AttentionType { kStandard, kMLA };
enum class MlpType { kGelu, kSwiGLU };  // GELU: 2 matrices (up, down); SwiGLU: 3 (gate, up, down)
enum class RouterType { kSoftmax, kSigmoid };
enum class NormType { kRMSNorm, kLayerNorm };

// DeepSeek multi-head latent attention. q_lora_rank == 0 means Q is projected directly from the hidden size.
struct MlaSpec {
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
};

struct MoeSpec {
  int num_experts = 0;  // routed experts per MoE layer; 0 = dense model
  int top_k = 0;        // routed experts per token
  int num_shared_experts = 0;
  int64_t expert_intermediate_size = 0;         // FFN width of one routed expert
  int64_t shared_expert_intermediate_size = 0;  // FFN width of one shared expert
  int first_k_dense_layers = 0;                 // the first k layers use the dense MLP
  int layer_freq = 1;                           // after those, every layer_freq-th layer is MoE
  RouterType router = RouterType::kSoftmax;
  bool norm_topk_prob = true;  // renormalise the top-k weights to sum to 1
  int num_groups = 1;          // group-limited routing (DeepSeek n_group); 1 = off
  int topk_groups = 1;         // groups a token may use (topk_group)
  double routed_scaling_factor = 1.0;
  bool expert_bias = false;  // biases in expert matrices (gpt-oss)
  bool router_bias = false;  // a per-expert router bias (gpt-oss linear bias, DeepSeek-V3 e_score_correction)
};

struct ModelSpec {
  std::string name;
  std::string source;  // where the numbers come from (documentation only; not part of the architecture)
  int num_layers = 0;
  int64_t hidden_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int64_t head_dim = 0;  // per-head width of Q/K/V in standard attention; for MLA qk_nope + qk_rope (derived)
  AttentionType attention = AttentionType::kStandard;
  MlaSpec mla;
  bool qk_norm = false;  // per-head RMSNorm on Q and K (Qwen3); OLMoE-style full-width if qk_norm_full
  bool qk_norm_full = false;
  bool attention_bias = false;   // biases on Q/K/V/O (gpt-oss)
  bool attention_sinks = false;  // one learned sink logit per head (gpt-oss)
  // Sliding-window attention: 0 = every layer attends to the whole causal context. Otherwise layer l uses a
  // window of `sliding_window` tokens unless (l + 1) % full_attention_every == 0 (gpt-oss: window 128, every 2nd
  // layer full, i.e. layers 0, 2, 4, ... slide).
  int64_t sliding_window = 0;
  int full_attention_every = 1;
  MlpType mlp = MlpType::kSwiGLU;
  int64_t intermediate_size = 0;  // dense MLP width
  bool mlp_bias = false;          // biases in the dense MLP and shared-expert matrices (GPT-2/3)
  MoeSpec moe;
  int64_t vocab_size = 0;
  bool tie_embeddings = false;
  NormType norm = NormType::kRMSNorm;
  bool norm_bias = false;          // LayerNorm with a bias vector (GPT-2/3); RMSNorm never has one
  bool learned_positions = false;  // learned absolute position embeddings of max_seq_len x hidden (GPT-2/3)
  int64_t max_seq_len = 4096;
  double rope_theta = 10000.0;

  bool is_moe() const { return moe.num_experts > 0; }
  // Layer l (0-based) uses routed experts.
  bool is_moe_layer(int layer) const;
  int num_moe_layers() const;
  int num_dense_layers() const { return num_layers - num_moe_layers(); }
  bool uses_sliding_window(int layer) const { return sliding_window > 0 && (layer + 1) % full_attention_every != 0; }
  // Per-head widths of the attention core: Q.K^T uses qk_head_dim, the value product v_head_dim.
  int64_t qk_head_dim() const;
  int64_t v_head_dim() const;

  // Every inconsistency as one error naming the field and the allowed values.
  Status validate() const;
};

const char* to_string(AttentionType t);
const char* to_string(MlpType t);
const char* to_string(RouterType t);
const char* to_string(NormType t);

}  // namespace piper
