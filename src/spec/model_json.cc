#include "piper/spec/model_json.h"

#include "piper/spec/limits.h"

namespace piper {
namespace {

// An out-of-range read of a bounded key says why the bound exists (spec/limits.h).
Status with_reason(Status s, const char* why) {
  if (s.ok() || s.message().find("is out of range") == std::string::npos) return s;
  return Status(s.code(), s.message() + " (" + why + ")");
}

Status read_mla(const Json& json, MlaSpec* mla) {
  JsonReader r(json, "model.mla");
  PIPER_RETURN_IF_ERROR(r.get_int("q_lora_rank", &mla->q_lora_rank, true, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("kv_lora_rank", &mla->kv_lora_rank, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("qk_nope_head_dim", &mla->qk_nope_head_dim, true, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("qk_rope_head_dim", &mla->qk_rope_head_dim, true, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("v_head_dim", &mla->v_head_dim, true, 1));
  return r.check_no_unknown_keys();
}

Status read_moe(const Json& json, MoeSpec* moe) {
  JsonReader r(json, "model.moe");
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("num_experts", &moe->num_experts, true, 1, kMaxExperts), kWhyExperts));
  PIPER_RETURN_IF_ERROR(r.get_int("top_k", &moe->top_k, true, 1));
  PIPER_RETURN_IF_ERROR(
      with_reason(r.get_int("expert_intermediate_size", &moe->expert_intermediate_size, true, 1, kMaxIntermediate),
                  kWhyIntermediate));
  PIPER_RETURN_IF_ERROR(r.get_int("num_shared_experts", &moe->num_shared_experts, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("shared_expert_intermediate_size", &moe->shared_expert_intermediate_size,
                                  moe->num_shared_experts > 0, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("first_k_dense_layers", &moe->first_k_dense_layers, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("layer_freq", &moe->layer_freq, false, 1));
  std::string router;
  PIPER_RETURN_IF_ERROR(r.get_enum("router", &router, {"softmax", "sigmoid"}, true));
  moe->router = router == "sigmoid" ? RouterType::kSigmoid : RouterType::kSoftmax;
  PIPER_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", &moe->norm_topk_prob, true));
  PIPER_RETURN_IF_ERROR(r.get_int("num_groups", &moe->num_groups, false, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("topk_groups", &moe->topk_groups, false, 1));
  PIPER_RETURN_IF_ERROR(r.get_double("routed_scaling_factor", &moe->routed_scaling_factor, false, 1e-9));
  PIPER_RETURN_IF_ERROR(r.get_bool("expert_bias", &moe->expert_bias, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("router_bias", &moe->router_bias, false));
  return r.check_no_unknown_keys();
}

Status read_attention(JsonReader& r, ModelSpec* m) {
  std::string type;
  PIPER_RETURN_IF_ERROR(r.get_enum("attention", &type, {"standard", "mla"}, true));
  m->attention = type == "mla" ? AttentionType::kMLA : AttentionType::kStandard;
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("num_heads", &m->num_heads, true, 1, kMaxHeads), kWhyHeads));
  if (m->attention == AttentionType::kMLA) {
    const Json* mla = r.find("mla");
    if (mla == nullptr || !mla->is_object()) {
      return invalid_argument(
          "model.mla: required object is missing for attention=mla (q_lora_rank, kv_lora_rank, "
          "qk_nope_head_dim, qk_rope_head_dim, v_head_dim)");
    }
    PIPER_RETURN_IF_ERROR(read_mla(*mla, &m->mla));
    // Derived for MLA; a stated value must agree (validate() checks).
    m->head_dim = m->mla.qk_nope_head_dim + m->mla.qk_rope_head_dim;
    m->num_kv_heads = m->num_heads;
    PIPER_RETURN_IF_ERROR(r.get_int("head_dim", &m->head_dim, false));
    PIPER_RETURN_IF_ERROR(r.get_int("num_kv_heads", &m->num_kv_heads, false));
  } else {
    if (r.has("mla")) return invalid_argument("model.mla: only allowed with attention=mla (got attention=standard)");
    PIPER_RETURN_IF_ERROR(with_reason(r.get_int("num_kv_heads", &m->num_kv_heads, true, 1, kMaxHeads), kWhyHeads));
    if (r.has("head_dim")) {
      PIPER_RETURN_IF_ERROR(with_reason(r.get_int("head_dim", &m->head_dim, true, 1, kMaxHeadDim), kWhyHeadDim));
    } else if (m->hidden_size % m->num_heads != 0) {
      return invalid_argument("model.num_heads: " + std::to_string(m->num_heads) + " does not divide hidden_size=" +
                              std::to_string(m->hidden_size) + "; pick a divisor or give head_dim explicitly");
    } else {
      m->head_dim = m->hidden_size / m->num_heads;
    }
  }
  PIPER_RETURN_IF_ERROR(r.get_bool("qk_norm", &m->qk_norm, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("qk_norm_full", &m->qk_norm_full, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("attention_bias", &m->attention_bias, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("attention_sinks", &m->attention_sinks, false));
  PIPER_RETURN_IF_ERROR(r.get_int("sliding_window", &m->sliding_window, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("full_attention_every", &m->full_attention_every, false, 1));
  return ok_status();
}

}  // namespace

Result<ModelSpec> model_from_json(const Json& json, const std::string& what) {
  if (!json.is_object()) return invalid_argument(what + ": a model must be a JSON object, got " + json.type_name());
  ModelSpec m;
  JsonReader r(json, "model");
  Status s = [&]() -> Status {
    PIPER_RETURN_IF_ERROR(r.get_string("name", &m.name, true));
    PIPER_RETURN_IF_ERROR(r.get_string("source", &m.source, false));
    PIPER_RETURN_IF_ERROR(with_reason(r.get_int("num_layers", &m.num_layers, true, 1, kMaxLayers), kWhyLayers));
    PIPER_RETURN_IF_ERROR(with_reason(r.get_int("hidden_size", &m.hidden_size, true, 1, kMaxHiddenSize), kWhyHidden));
    PIPER_RETURN_IF_ERROR(read_attention(r, &m));
    std::string mlp;
    PIPER_RETURN_IF_ERROR(r.get_enum("mlp", &mlp, {"swiglu", "gelu"}, true));
    m.mlp = mlp == "gelu" ? MlpType::kGelu : MlpType::kSwiGLU;
    PIPER_RETURN_IF_ERROR(r.get_bool("mlp_bias", &m.mlp_bias, false));
    if (const Json* moe = r.find("moe")) {
      if (!moe->is_object()) return invalid_argument("model.moe: expected an object, got " + moe->dump());
      PIPER_RETURN_IF_ERROR(read_moe(*moe, &m.moe));
    }
    // The dense MLP width is required exactly when some layer is dense.
    bool needs_dense = !m.is_moe() || m.moe.first_k_dense_layers > 0 || m.moe.layer_freq > 1;
    PIPER_RETURN_IF_ERROR(with_reason(
        r.get_int("intermediate_size", &m.intermediate_size, needs_dense, 0, kMaxIntermediate), kWhyIntermediate));
    PIPER_RETURN_IF_ERROR(with_reason(r.get_int("vocab_size", &m.vocab_size, true, 1, kMaxVocab), kWhyVocab));
    PIPER_RETURN_IF_ERROR(r.get_bool("tie_embeddings", &m.tie_embeddings, true));
    std::string norm = "rmsnorm";
    PIPER_RETURN_IF_ERROR(r.get_enum("norm", &norm, {"rmsnorm", "layernorm"}, false));
    m.norm = norm == "layernorm" ? NormType::kLayerNorm : NormType::kRMSNorm;
    PIPER_RETURN_IF_ERROR(r.get_bool("norm_bias", &m.norm_bias, false));
    PIPER_RETURN_IF_ERROR(r.get_bool("learned_positions", &m.learned_positions, false));
    PIPER_RETURN_IF_ERROR(
        with_reason(r.get_int("max_seq_len", &m.max_seq_len, m.learned_positions, 1, kMaxSeqLen), kWhySeqLen));
    PIPER_RETURN_IF_ERROR(
        with_reason(r.get_double("rope_theta", &m.rope_theta, false, 1e-9, kMaxRopeTheta), kWhyRopeTheta));
    PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
    return m.validate();
  }();
  if (!s.ok()) return s.with_context(what);
  return m;
}

OrderedJson to_json(const ModelSpec& m) {
  OrderedJson j;
  j["name"] = m.name;
  if (!m.source.empty()) j["source"] = m.source;
  j["num_layers"] = m.num_layers;
  j["hidden_size"] = m.hidden_size;
  j["attention"] = to_string(m.attention);
  j["num_heads"] = m.num_heads;
  j["num_kv_heads"] = m.num_kv_heads;
  j["head_dim"] = m.head_dim;
  if (m.attention == AttentionType::kMLA) {
    j["mla"] = {{"q_lora_rank", m.mla.q_lora_rank},
                {"kv_lora_rank", m.mla.kv_lora_rank},
                {"qk_nope_head_dim", m.mla.qk_nope_head_dim},
                {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                {"v_head_dim", m.mla.v_head_dim}};
  }
  j["qk_norm"] = m.qk_norm;
  j["qk_norm_full"] = m.qk_norm_full;
  j["attention_bias"] = m.attention_bias;
  j["attention_sinks"] = m.attention_sinks;
  j["sliding_window"] = m.sliding_window;
  j["full_attention_every"] = m.full_attention_every;
  j["mlp"] = to_string(m.mlp);
  j["intermediate_size"] = m.intermediate_size;
  j["mlp_bias"] = m.mlp_bias;
  if (m.is_moe()) {
    const MoeSpec& e = m.moe;
    OrderedJson moe;
    moe["num_experts"] = e.num_experts;
    moe["top_k"] = e.top_k;
    moe["expert_intermediate_size"] = e.expert_intermediate_size;
    moe["num_shared_experts"] = e.num_shared_experts;
    moe["shared_expert_intermediate_size"] = e.shared_expert_intermediate_size;
    moe["first_k_dense_layers"] = e.first_k_dense_layers;
    moe["layer_freq"] = e.layer_freq;
    moe["router"] = to_string(e.router);
    moe["norm_topk_prob"] = e.norm_topk_prob;
    moe["num_groups"] = e.num_groups;
    moe["topk_groups"] = e.topk_groups;
    moe["routed_scaling_factor"] = e.routed_scaling_factor;
    moe["expert_bias"] = e.expert_bias;
    moe["router_bias"] = e.router_bias;
    j["moe"] = moe;
  }
  j["vocab_size"] = m.vocab_size;
  j["tie_embeddings"] = m.tie_embeddings;
  j["norm"] = to_string(m.norm);
  j["norm_bias"] = m.norm_bias;
  j["learned_positions"] = m.learned_positions;
  j["max_seq_len"] = m.max_seq_len;
  j["rope_theta"] = m.rope_theta;
  return j;
}

}  // namespace piper
