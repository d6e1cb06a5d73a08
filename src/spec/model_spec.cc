#include "piper/spec/model_spec.h"

#include <cmath>
#include <string>

#include "piper/spec/counting.h"
#include "piper/spec/limits.h"

namespace piper {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// value in [min_value, max_value]; the message names the range and why the upper bound exists.
Status in_range(const char* field, int64_t value, int64_t min_value, int64_t max_value, const char* why) {
  if (value >= min_value && value <= max_value) return ok_status();
  return invalid_argument(std::string("model.") + field + ": " + str(value) + " is out of range; allowed " +
                          str(min_value) + ".." + str(max_value) + " (" + why + ")");
}

Status finite_in(const char* field, double value, double max_value, const char* why) {
  if (std::isfinite(value) && value > 0 && value <= max_value) return ok_status();
  char buf[160];
  std::snprintf(buf, sizeof(buf), ": %g is out of range; allowed (0, %g] (", value, max_value);
  return invalid_argument(std::string("model.") + field + buf + why + ")");
}

// Upper bounds of every size (limits.h): far above published models, low enough that products fit int64.
Status validate_bounds(const ModelSpec& m) {
  PIPER_RETURN_IF_ERROR(in_range("num_layers", m.num_layers, 1, kMaxLayers, kWhyLayers));
  PIPER_RETURN_IF_ERROR(in_range("hidden_size", m.hidden_size, 1, kMaxHiddenSize, kWhyHidden));
  PIPER_RETURN_IF_ERROR(in_range("num_heads", m.num_heads, 1, kMaxHeads, kWhyHeads));
  PIPER_RETURN_IF_ERROR(in_range("num_kv_heads", m.num_kv_heads, 1, kMaxHeads, kWhyHeads));
  PIPER_RETURN_IF_ERROR(in_range("head_dim", m.head_dim, 0, kMaxHeadDim, kWhyHeadDim));
  PIPER_RETURN_IF_ERROR(in_range("intermediate_size", m.intermediate_size, 0, kMaxIntermediate, kWhyIntermediate));
  PIPER_RETURN_IF_ERROR(in_range("vocab_size", m.vocab_size, 1, kMaxVocab, kWhyVocab));
  PIPER_RETURN_IF_ERROR(in_range("max_seq_len", m.max_seq_len, 1, kMaxSeqLen, kWhySeqLen));
  PIPER_RETURN_IF_ERROR(in_range("sliding_window", m.sliding_window, 0, kMaxSeqLen, "at most max_seq_len's bound"));
  PIPER_RETURN_IF_ERROR(
      in_range("full_attention_every", m.full_attention_every, 1, kMaxLayers, "at most num_layers' bound"));
  const MlaSpec& a = m.mla;
  PIPER_RETURN_IF_ERROR(in_range("mla.q_lora_rank", a.q_lora_rank, 0, kMaxHiddenSize, "at most hidden_size's bound"));
  PIPER_RETURN_IF_ERROR(in_range("mla.kv_lora_rank", a.kv_lora_rank, 0, kMaxHiddenSize, "at most hidden_size's bound"));
  PIPER_RETURN_IF_ERROR(in_range("mla.qk_nope_head_dim", a.qk_nope_head_dim, 0, kMaxHeadDim, kWhyHeadDim));
  PIPER_RETURN_IF_ERROR(in_range("mla.qk_rope_head_dim", a.qk_rope_head_dim, 0, kMaxHeadDim, kWhyHeadDim));
  PIPER_RETURN_IF_ERROR(in_range("mla.v_head_dim", a.v_head_dim, 0, kMaxHeadDim, kWhyHeadDim));
  const MoeSpec& e = m.moe;
  PIPER_RETURN_IF_ERROR(in_range("moe.num_experts", e.num_experts, 0, kMaxExperts, kWhyExperts));
  PIPER_RETURN_IF_ERROR(
      in_range("moe.num_shared_experts", e.num_shared_experts, 0, kMaxExperts, "at most num_experts' bound"));
  PIPER_RETURN_IF_ERROR(in_range("moe.expert_intermediate_size", e.expert_intermediate_size, 0, kMaxIntermediate,
                                 "at most intermediate_size's bound"));
  PIPER_RETURN_IF_ERROR(in_range("moe.shared_expert_intermediate_size", e.shared_expert_intermediate_size, 0,
                                 kMaxIntermediate, "at most intermediate_size's bound"));
  PIPER_RETURN_IF_ERROR(in_range("moe.layer_freq", e.layer_freq, 1, kMaxLayers, "at most num_layers' bound"));
  PIPER_RETURN_IF_ERROR(finite_in("rope_theta", m.rope_theta, kMaxRopeTheta, kWhyRopeTheta));
  if (m.is_moe()) {
    PIPER_RETURN_IF_ERROR(finite_in("moe.routed_scaling_factor", e.routed_scaling_factor, kMaxRoutedScaling,
                                    "published models use 1..16"));
  }
  return ok_status();
}

// The parameter count, formed with saturating products (counting.cc): a count past kMaxParams (or one that
// would overflow int64) is refused here, so every later product of counts and bytes fits int64.
Status validate_total_size(const ModelSpec& m) {
  const int64_t total = count_params(m).total();
  if (total <= kMaxParams) return ok_status();
  const std::string shown = total == INT64_MAX ? "more than 9.2e18" : str(total);
  return invalid_argument("model: " + shown +
                          " parameters exceed the bound of 1e15 (600x the largest published "
                          "model; byte counts of its weights and optimizer state would overflow int64); lower "
                          "num_layers, hidden_size, vocab_size, moe.num_experts or the intermediate sizes");
}

Status at_least(const char* field, int64_t value, int64_t min_value) {
  if (value >= min_value) return ok_status();
  return invalid_argument(std::string("model.") + field + ": " + str(value) +
                          " is out of range; allowed >= " + str(min_value));
}

Status validate_attention(const ModelSpec& m) {
  PIPER_RETURN_IF_ERROR(at_least("num_heads", m.num_heads, 1));
  if (m.attention == AttentionType::kStandard) {
    PIPER_RETURN_IF_ERROR(at_least("head_dim", m.head_dim, 1));
    if (m.num_kv_heads < 1 || m.num_kv_heads > m.num_heads || m.num_heads % m.num_kv_heads != 0) {
      return invalid_argument("model.num_kv_heads: " + str(m.num_kv_heads) + " must divide num_heads=" +
                              str(m.num_heads) + " (MHA: kv = heads, GQA: a divisor, MQA: 1)");
    }
    return ok_status();
  }
  const MlaSpec& a = m.mla;
  PIPER_RETURN_IF_ERROR(at_least("mla.q_lora_rank", a.q_lora_rank, 0));
  PIPER_RETURN_IF_ERROR(at_least("mla.kv_lora_rank", a.kv_lora_rank, 1));
  PIPER_RETURN_IF_ERROR(at_least("mla.qk_nope_head_dim", a.qk_nope_head_dim, 0));
  PIPER_RETURN_IF_ERROR(at_least("mla.qk_rope_head_dim", a.qk_rope_head_dim, 0));
  PIPER_RETURN_IF_ERROR(
      at_least("mla.qk_nope_head_dim + mla.qk_rope_head_dim", a.qk_nope_head_dim + a.qk_rope_head_dim, 1));
  PIPER_RETURN_IF_ERROR(at_least("mla.v_head_dim", a.v_head_dim, 1));
  if (m.head_dim != a.qk_nope_head_dim + a.qk_rope_head_dim) {
    return invalid_argument("model.head_dim: " + str(m.head_dim) + " must equal mla.qk_nope_head_dim + " +
                            "mla.qk_rope_head_dim = " + str(a.qk_nope_head_dim + a.qk_rope_head_dim) + " for MLA");
  }
  if (m.num_kv_heads != m.num_heads) {
    return invalid_argument("model.num_kv_heads: " + str(m.num_kv_heads) + " must equal num_heads=" + str(m.num_heads) +
                            " for MLA (keys and values are up-projected per head)");
  }
  if (m.qk_norm || m.attention_sinks) {
    return invalid_argument("model.attention: qk_norm and attention_sinks are only supported with standard attention");
  }
  return ok_status();
}

Status validate_moe(const ModelSpec& m) {
  const MoeSpec& e = m.moe;
  PIPER_RETURN_IF_ERROR(at_least("moe.num_experts", e.num_experts, 0));
  if (e.num_experts == 0) {
    if (e.top_k != 0 || e.num_shared_experts != 0) {
      return invalid_argument("model.moe: top_k=" + str(e.top_k) + " and num_shared_experts=" +
                              str(e.num_shared_experts) + " need num_experts >= 1; set them to 0 for a dense model");
    }
    return ok_status();
  }
  if (e.top_k < 1 || e.top_k > e.num_experts) {
    return invalid_argument("model.moe.top_k: " + str(e.top_k) +
                            " is out of range; allowed 1..num_experts=" + str(e.num_experts));
  }
  PIPER_RETURN_IF_ERROR(at_least("moe.expert_intermediate_size", e.expert_intermediate_size, 1));
  PIPER_RETURN_IF_ERROR(at_least("moe.num_shared_experts", e.num_shared_experts, 0));
  if (e.num_shared_experts > 0) {
    PIPER_RETURN_IF_ERROR(at_least("moe.shared_expert_intermediate_size", e.shared_expert_intermediate_size, 1));
  }
  if (e.first_k_dense_layers < 0 || e.first_k_dense_layers >= m.num_layers) {
    return invalid_argument("model.moe.first_k_dense_layers: " + str(e.first_k_dense_layers) +
                            " is out of range; allowed 0.." + str(m.num_layers - 1) + " (at least one MoE layer)");
  }
  PIPER_RETURN_IF_ERROR(at_least("moe.layer_freq", e.layer_freq, 1));
  if (e.num_groups < 1 || e.num_experts % e.num_groups != 0) {
    return invalid_argument("model.moe.num_groups: " + str(e.num_groups) +
                            " must divide num_experts=" + str(e.num_experts) + " (1 = no group-limited routing)");
  }
  if (e.topk_groups < 1 || e.topk_groups > e.num_groups) {
    return invalid_argument("model.moe.topk_groups: " + str(e.topk_groups) +
                            " is out of range; allowed 1..num_groups=" + str(e.num_groups));
  }
  if (e.top_k > e.topk_groups * (e.num_experts / e.num_groups)) {
    return invalid_argument("model.moe.top_k: " + str(e.top_k) + " exceeds the experts reachable in topk_groups=" +
                            str(e.topk_groups) + " groups of " + str(e.num_experts / e.num_groups));
  }
  if (!(e.routed_scaling_factor > 0)) {
    return invalid_argument("model.moe.routed_scaling_factor: " + std::to_string(e.routed_scaling_factor) +
                            " must be > 0");
  }
  return ok_status();
}

}  // namespace

const char* to_string(AttentionType t) { return t == AttentionType::kMLA ? "mla" : "standard"; }
const char* to_string(MlpType t) { return t == MlpType::kGelu ? "gelu" : "swiglu"; }
const char* to_string(RouterType t) { return t == RouterType::kSigmoid ? "sigmoid" : "softmax"; }
const char* to_string(NormType t) { return t == NormType::kLayerNorm ? "layernorm" : "rmsnorm"; }

bool ModelSpec::is_moe_layer(int layer) const {
  if (!is_moe() || layer < moe.first_k_dense_layers || layer >= num_layers) return false;
  return (layer - moe.first_k_dense_layers) % moe.layer_freq == 0;
}

int ModelSpec::num_moe_layers() const {
  int n = 0;
  for (int l = 0; l < num_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

int64_t ModelSpec::qk_head_dim() const {
  return attention == AttentionType::kMLA ? mla.qk_nope_head_dim + mla.qk_rope_head_dim : head_dim;
}

int64_t ModelSpec::v_head_dim() const { return attention == AttentionType::kMLA ? mla.v_head_dim : head_dim; }

Status ModelSpec::validate() const {
  PIPER_RETURN_IF_ERROR(at_least("num_layers", num_layers, 1));
  PIPER_RETURN_IF_ERROR(at_least("hidden_size", hidden_size, 1));
  PIPER_RETURN_IF_ERROR(at_least("vocab_size", vocab_size, 1));
  PIPER_RETURN_IF_ERROR(at_least("max_seq_len", max_seq_len, 1));
  PIPER_RETURN_IF_ERROR(validate_attention(*this));
  PIPER_RETURN_IF_ERROR(validate_bounds(*this));
  PIPER_RETURN_IF_ERROR(validate_moe(*this));
  if (num_dense_layers() > 0) {
    PIPER_RETURN_IF_ERROR(at_least("intermediate_size", intermediate_size, 1));
  } else {
    PIPER_RETURN_IF_ERROR(at_least("intermediate_size", intermediate_size, 0));
  }
  PIPER_RETURN_IF_ERROR(at_least("sliding_window", sliding_window, 0));
  PIPER_RETURN_IF_ERROR(at_least("full_attention_every", full_attention_every, 1));
  if (norm_bias && norm == NormType::kRMSNorm) {
    return invalid_argument("model.norm_bias: true needs norm=layernorm (RMSNorm has no bias)");
  }
  if (qk_norm_full && !qk_norm) {
    return invalid_argument("model.qk_norm_full: true needs qk_norm=true");
  }
  if (!(rope_theta > 0)) return invalid_argument("model.rope_theta: " + std::to_string(rope_theta) + " must be > 0");
  return validate_total_size(*this);
}

}  // namespace piper
