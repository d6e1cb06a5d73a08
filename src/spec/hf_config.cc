#include "piper/spec/hf_config.h"

#include <cctype>
#include <functional>
#include <map>

#include "piper/base/strings.h"
#include "piper/spec/limits.h"

namespace piper {
namespace {

// An out-of-range read of a bounded key says why the bound exists (spec/limits.h).
Status with_reason(Status s, const char* why) {
  if (s.ok() || s.message().find("is out of range") == std::string::npos) return s;
  return Status(s.code(), s.message() + " (" + why + ")");
}

using Reader = std::function<Status(JsonReader&, ModelSpec*)>;

// SwiGLU is the gated SiLU MLP of every MoE family here; anything else would be silently miscounted.
Status require_silu(JsonReader& r, const char* key) {
  std::string act = "silu";
  PIPER_RETURN_IF_ERROR(r.get_enum(key, &act, {"silu", "swish"}, false));
  return ok_status();
}

// Fields shared by the llama family (llama, mixtral, qwen3_moe, deepseek, gpt_oss, olmoe).
Status read_llama_common(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("num_hidden_layers", &m->num_layers, true, 1, kMaxLayers), kWhyLayers));
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("hidden_size", &m->hidden_size, true, 1, kMaxHiddenSize), kWhyHidden));
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("num_attention_heads", &m->num_heads, true, 1, kMaxHeads), kWhyHeads));
  m->num_kv_heads = m->num_heads;  // transformers' default when num_key_value_heads is absent
  PIPER_RETURN_IF_ERROR(
      with_reason(r.get_int("num_key_value_heads", &m->num_kv_heads, false, 1, kMaxHeads), kWhyHeads));
  if (r.has("head_dim")) {
    PIPER_RETURN_IF_ERROR(with_reason(r.get_int("head_dim", &m->head_dim, true, 1, kMaxHeadDim), kWhyHeadDim));
  } else if (m->hidden_size % m->num_heads != 0) {
    return invalid_argument("num_attention_heads: " + std::to_string(m->num_heads) + " does not divide hidden_size=" +
                            std::to_string(m->hidden_size) + "; pick a divisor or give head_dim");
  } else {
    m->head_dim = m->hidden_size / m->num_heads;
  }
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("vocab_size", &m->vocab_size, true, 1, kMaxVocab), kWhyVocab));
  PIPER_RETURN_IF_ERROR(
      with_reason(r.get_int("max_position_embeddings", &m->max_seq_len, true, 1, kMaxSeqLen), kWhySeqLen));
  PIPER_RETURN_IF_ERROR(
      with_reason(r.get_double("rope_theta", &m->rope_theta, false, 1e-9, kMaxRopeTheta), kWhyRopeTheta));
  PIPER_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &m->tie_embeddings, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("attention_bias", &m->attention_bias, false));
  PIPER_RETURN_IF_ERROR(require_silu(r, "hidden_act"));
  m->mlp = MlpType::kSwiGLU;
  m->norm = NormType::kRMSNorm;
  return ok_status();
}

Status read_llama(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(read_llama_common(r, m));
  PIPER_RETURN_IF_ERROR(r.get_bool("mlp_bias", &m->mlp_bias, false));
  return r.get_int("intermediate_size", &m->intermediate_size, true, 1);
}

Status read_mixtral(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(read_llama_common(r, m));
  m->rope_theta = 1e6;  // MixtralConfig default
  PIPER_RETURN_IF_ERROR(
      with_reason(r.get_double("rope_theta", &m->rope_theta, false, 1e-9, kMaxRopeTheta), kWhyRopeTheta));
  PIPER_RETURN_IF_ERROR(r.get_int("num_local_experts", &m->moe.num_experts, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", &m->moe.top_k, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("intermediate_size", &m->moe.expert_intermediate_size, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("sliding_window", &m->sliding_window, false, 0));
  m->moe.router = RouterType::kSoftmax;
  m->moe.norm_topk_prob = true;  // softmax over the top-k logits, i.e. renormalised
  return ok_status();
}

Status read_qwen3_moe(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(read_llama_common(r, m));
  PIPER_RETURN_IF_ERROR(r.get_int("num_experts", &m->moe.num_experts, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", &m->moe.top_k, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("moe_intermediate_size", &m->moe.expert_intermediate_size, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", &m->moe.norm_topk_prob, true));
  int step = 1;
  PIPER_RETURN_IF_ERROR(r.get_int("decoder_sparse_step", &step, false, 1));
  // Qwen: layer l is MoE when (l + 1) % step == 0, i.e. layers step-1, 2*step-1, ...
  m->moe.first_k_dense_layers = step - 1;
  m->moe.layer_freq = step;
  if (const Json* only = r.find("mlp_only_layers"); only != nullptr && !only->empty()) {
    return unimplemented("mlp_only_layers: a non-empty list " + only->dump() + " is not supported; use []");
  }
  PIPER_RETURN_IF_ERROR(r.get_int("intermediate_size", &m->intermediate_size, step > 1, 0));
  if (step == 1) m->intermediate_size = 0;  // unused: every layer is MoE
  bool sliding = false;
  PIPER_RETURN_IF_ERROR(r.get_bool("use_sliding_window", &sliding, false));
  if (sliding) return unimplemented("use_sliding_window: true is not supported for qwen3_moe; use false");
  m->qk_norm = true;  // per-head RMSNorm on Q and K
  m->moe.router = RouterType::kSoftmax;
  return ok_status();
}

// DeepSeek MoE fields, shared by deepseek (DeepSeekMoE, MHA) and deepseek_v2/v3 (MLA).
Status read_deepseek_moe(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(r.get_int("intermediate_size", &m->intermediate_size, true, 1));
  MoeSpec& e = m->moe;
  PIPER_RETURN_IF_ERROR(r.get_int("n_routed_experts", &e.num_experts, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", &e.top_k, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("n_shared_experts", &e.num_shared_experts, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("moe_intermediate_size", &e.expert_intermediate_size, true, 1));
  e.shared_expert_intermediate_size = e.num_shared_experts > 0 ? e.expert_intermediate_size : 0;
  int first_k = 0;
  int freq = 1;
  PIPER_RETURN_IF_ERROR(r.get_int("first_k_dense_replace", &first_k, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("moe_layer_freq", &freq, false, 1));
  // DeepSeek: layer l is MoE when l >= first_k_dense_replace and l % moe_layer_freq == 0.
  e.first_k_dense_layers = (first_k + freq - 1) / freq * freq;
  e.layer_freq = freq;
  std::string scoring = "softmax";
  PIPER_RETURN_IF_ERROR(r.get_enum("scoring_func", &scoring, {"softmax", "sigmoid"}, false));
  e.router = scoring == "sigmoid" ? RouterType::kSigmoid : RouterType::kSoftmax;
  e.norm_topk_prob = false;  // the DeepSeek config classes' default when absent
  PIPER_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", &e.norm_topk_prob, false));
  PIPER_RETURN_IF_ERROR(r.get_int("n_group", &e.num_groups, false, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("topk_group", &e.topk_groups, false, 1));
  PIPER_RETURN_IF_ERROR(r.get_double("routed_scaling_factor", &e.routed_scaling_factor, false, 1e-9));
  std::string method = "greedy";
  PIPER_RETURN_IF_ERROR(r.get_enum("topk_method", &method, {"greedy", "group_limited_greedy", "noaux_tc"}, false));
  e.router_bias = method == "noaux_tc";  // e_score_correction_bias: one float per expert
  if (method == "greedy") {
    e.num_groups = 1;  // groups may be listed in the config but do not limit routing
    e.topk_groups = 1;
  }
  return ok_status();
}

Status read_deepseek(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(read_llama_common(r, m));
  return read_deepseek_moe(r, m);
}

Status read_deepseek_mla(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(read_llama_common(r, m));
  m->attention = AttentionType::kMLA;
  PIPER_RETURN_IF_ERROR(r.get_int("q_lora_rank", &m->mla.q_lora_rank, false, 0));  // null = no Q compression
  PIPER_RETURN_IF_ERROR(r.get_int("kv_lora_rank", &m->mla.kv_lora_rank, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("qk_nope_head_dim", &m->mla.qk_nope_head_dim, true, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("qk_rope_head_dim", &m->mla.qk_rope_head_dim, true, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("v_head_dim", &m->mla.v_head_dim, true, 1));
  m->head_dim = m->mla.qk_nope_head_dim + m->mla.qk_rope_head_dim;
  m->num_kv_heads = m->num_heads;
  return read_deepseek_moe(r, m);
}

Status read_gpt_oss(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(read_llama_common(r, m));
  PIPER_RETURN_IF_ERROR(r.get_int("num_local_experts", &m->moe.num_experts, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", &m->moe.top_k, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("intermediate_size", &m->moe.expert_intermediate_size, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("sliding_window", &m->sliding_window, false, 0));
  m->attention_sinks = true;
  m->moe.expert_bias = true;
  m->moe.router_bias = true;
  m->moe.router = RouterType::kSoftmax;
  m->moe.norm_topk_prob = true;  // softmax over the top-k logits
  const Json* types = r.find("layer_types");
  if (m->sliding_window > 0) {
    // layer_types alternates sliding/full; anything else cannot be expressed as full_attention_every.
    m->full_attention_every = 2;
    if (types != nullptr) {
      for (size_t l = 0; l < types->size(); ++l) {
        std::string want = m->uses_sliding_window(static_cast<int>(l)) ? "sliding_attention" : "full_attention";
        if (!(*types)[l].is_string() || (*types)[l].get<std::string>() != want) {
          return unimplemented("layer_types[" + std::to_string(l) + "]: expected '" + want +
                               "' (only the alternating sliding/full pattern is supported)");
        }
      }
    }
  }
  return ok_status();
}

Status read_olmoe(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(read_llama_common(r, m));
  PIPER_RETURN_IF_ERROR(r.get_int("num_experts", &m->moe.num_experts, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", &m->moe.top_k, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_int("intermediate_size", &m->moe.expert_intermediate_size, true, 1));
  m->moe.norm_topk_prob = false;  // OlmoeConfig default
  PIPER_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", &m->moe.norm_topk_prob, false));
  m->moe.router = RouterType::kSoftmax;
  m->qk_norm = true;  // RMSNorm over the full Q and K projections
  m->qk_norm_full = true;
  return ok_status();
}

Status read_dbrx(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("n_layers", &m->num_layers, true, 1, kMaxLayers), kWhyLayers));
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("d_model", &m->hidden_size, true, 1, kMaxHiddenSize), kWhyHidden));
  PIPER_RETURN_IF_ERROR(r.get_int("n_heads", &m->num_heads, true, 1));
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("vocab_size", &m->vocab_size, true, 1, kMaxVocab), kWhyVocab));
  PIPER_RETURN_IF_ERROR(r.get_int("max_seq_len", &m->max_seq_len, true, 1));
  PIPER_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &m->tie_embeddings, false));
  if (m->hidden_size % m->num_heads != 0) {
    return invalid_argument("n_heads: " + std::to_string(m->num_heads) +
                            " does not divide d_model=" + std::to_string(m->hidden_size));
  }
  m->head_dim = m->hidden_size / m->num_heads;
  const Json* attn = r.find("attn_config");
  const Json* ffn = r.find("ffn_config");
  if (attn == nullptr || ffn == nullptr) return invalid_argument("attn_config and ffn_config: required objects");
  JsonReader a(*attn, "attn_config");
  PIPER_RETURN_IF_ERROR(a.get_int("kv_n_heads", &m->num_kv_heads, true, 1));
  PIPER_RETURN_IF_ERROR(
      with_reason(a.get_double("rope_theta", &m->rope_theta, false, 1e-9, kMaxRopeTheta), kWhyRopeTheta));
  JsonReader f(*ffn, "ffn_config");
  PIPER_RETURN_IF_ERROR(f.get_int("ffn_hidden_size", &m->moe.expert_intermediate_size, true, 1));
  PIPER_RETURN_IF_ERROR(f.get_int("moe_num_experts", &m->moe.num_experts, true, 1));
  PIPER_RETURN_IF_ERROR(f.get_int("moe_top_k", &m->moe.top_k, true, 1));
  double p_norm = 1;
  PIPER_RETURN_IF_ERROR(f.get_double("moe_normalize_expert_weights", &p_norm, false));
  m->moe.norm_topk_prob = p_norm > 0;  // DBRX divides the top-k weights by their p-norm (p = 1: sum to 1)
  m->moe.router = RouterType::kSoftmax;
  m->mlp = MlpType::kSwiGLU;
  m->norm = NormType::kLayerNorm;  // LayerNorm without bias
  return ok_status();
}

Status read_gpt2(JsonReader& r, ModelSpec* m) {
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("n_layer", &m->num_layers, true, 1, kMaxLayers), kWhyLayers));
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("n_embd", &m->hidden_size, true, 1, kMaxHiddenSize), kWhyHidden));
  PIPER_RETURN_IF_ERROR(r.get_int("n_head", &m->num_heads, true, 1));
  PIPER_RETURN_IF_ERROR(with_reason(r.get_int("vocab_size", &m->vocab_size, true, 1, kMaxVocab), kWhyVocab));
  PIPER_RETURN_IF_ERROR(r.get_int("n_positions", &m->max_seq_len, true, 1));
  if (m->hidden_size % m->num_heads != 0) {
    return invalid_argument("n_head: " + std::to_string(m->num_heads) +
                            " does not divide n_embd=" + std::to_string(m->hidden_size) + "; pick a divisor");
  }
  m->head_dim = m->hidden_size / m->num_heads;
  m->num_kv_heads = m->num_heads;
  m->intermediate_size = 4 * m->hidden_size;  // n_inner: null means 4 * n_embd
  PIPER_RETURN_IF_ERROR(r.get_int("n_inner", &m->intermediate_size, false, 1));
  std::string act = "gelu_new";
  PIPER_RETURN_IF_ERROR(
      r.get_enum("activation_function", &act, {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh"}, false));
  m->tie_embeddings = true;  // GPT2Config default
  PIPER_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &m->tie_embeddings, false));
  m->mlp = MlpType::kGelu;
  m->mlp_bias = true;
  m->attention_bias = true;
  m->norm = NormType::kLayerNorm;
  m->norm_bias = true;
  m->learned_positions = true;
  return ok_status();
}

const std::map<std::string, Reader>& readers() {
  static const std::map<std::string, Reader> r = {
      {"llama", read_llama},
      {"mixtral", read_mixtral},
      {"qwen3_moe", read_qwen3_moe},
      {"deepseek", read_deepseek},
      {"deepseek_v2", read_deepseek_mla},
      {"deepseek_v3", read_deepseek_mla},
      {"gpt_oss", read_gpt_oss},
      {"olmoe", read_olmoe},
      {"dbrx", read_dbrx},
      {"gpt2", read_gpt2},
  };
  return r;
}

// Internal ModelSpec fields (as validate() names them, "model.num_kv_heads") and the config.json key each comes
// from, per model_type: errors after reading name the file's key ("num_key_value_heads").
using KeyMap = std::vector<std::pair<std::string, std::string>>;

KeyMap llama_keys() {
  return {{"num_layers", "num_hidden_layers"},
          {"num_heads", "num_attention_heads"},
          {"num_kv_heads", "num_key_value_heads"},
          {"max_seq_len", "max_position_embeddings"},
          {"hidden_size", "hidden_size"},
          {"head_dim", "head_dim"},
          {"vocab_size", "vocab_size"},
          {"rope_theta", "rope_theta"},
          {"sliding_window", "sliding_window"},
          {"intermediate_size", "intermediate_size"}};
}

KeyMap file_keys(const std::string& type) {
  KeyMap k = llama_keys();
  auto more = [&k](KeyMap extra) { k.insert(k.end(), extra.begin(), extra.end()); };
  if (type == "mixtral" || type == "gpt_oss") {
    more({{"moe.num_experts", "num_local_experts"},
          {"moe.top_k", "num_experts_per_tok"},
          {"moe.expert_intermediate_size", "intermediate_size"}});
  } else if (type == "olmoe") {
    more({{"moe.num_experts", "num_experts"},
          {"moe.top_k", "num_experts_per_tok"},
          {"moe.expert_intermediate_size", "intermediate_size"}});
  } else if (type == "qwen3_moe") {
    more({{"moe.num_experts", "num_experts"},
          {"moe.top_k", "num_experts_per_tok"},
          {"moe.expert_intermediate_size", "moe_intermediate_size"},
          {"moe.first_k_dense_layers", "decoder_sparse_step"},
          {"moe.layer_freq", "decoder_sparse_step"}});
  } else if (type.rfind("deepseek", 0) == 0) {
    more({{"moe.num_experts", "n_routed_experts"},
          {"moe.top_k", "num_experts_per_tok"},
          {"moe.num_shared_experts", "n_shared_experts"},
          {"moe.expert_intermediate_size", "moe_intermediate_size"},
          {"moe.shared_expert_intermediate_size", "moe_intermediate_size"},
          {"moe.first_k_dense_layers", "first_k_dense_replace"},
          {"moe.layer_freq", "moe_layer_freq"},
          {"moe.num_groups", "n_group"},
          {"moe.topk_groups", "topk_group"},
          {"moe.routed_scaling_factor", "routed_scaling_factor"},
          {"mla.q_lora_rank", "q_lora_rank"},
          {"mla.kv_lora_rank", "kv_lora_rank"},
          {"mla.qk_nope_head_dim", "qk_nope_head_dim"},
          {"mla.qk_rope_head_dim", "qk_rope_head_dim"},
          {"mla.v_head_dim", "v_head_dim"}});
  } else if (type == "dbrx") {
    k = {{"num_layers", "n_layers"},
         {"hidden_size", "d_model"},
         {"num_heads", "n_heads"},
         {"num_kv_heads", "attn_config.kv_n_heads"},
         {"max_seq_len", "max_seq_len"},
         {"vocab_size", "vocab_size"},
         {"rope_theta", "attn_config.rope_theta"},
         {"moe.num_experts", "ffn_config.moe_num_experts"},
         {"moe.top_k", "ffn_config.moe_top_k"},
         {"moe.expert_intermediate_size", "ffn_config.ffn_hidden_size"}};
  } else if (type == "gpt2") {
    k = {{"num_layers", "n_layer"},       {"hidden_size", "n_embd"},      {"num_heads", "n_head"},
         {"num_kv_heads", "n_head"},      {"max_seq_len", "n_positions"}, {"vocab_size", "vocab_size"},
         {"intermediate_size", "n_inner"}};
  }
  return k;
}

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; }

// Replaces whole-word occurrences of `from` in `text` with `to`: not preceded by a letter, digit or '_' ("1..top_k="
// is a word), nor followed by a name char when `from` ends in one.
std::string replace_word(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(from, pos);
    if (hit == std::string::npos) break;
    size_t end = hit + from.size();
    const bool after_name =
        hit > 0 && (std::isalnum(static_cast<unsigned char>(text[hit - 1])) || text[hit - 1] == '_');
    bool word = !after_name && (!is_name_char(from.back()) || end == text.size() || !is_name_char(text[end]));
    out += text.substr(pos, hit - pos) + (word ? to : from);
    pos = end;
  }
  return out + text.substr(pos);
}

// Names config.json's keys in a ModelSpec::validate() message: "model.num_kv_heads: ... num_heads=8" becomes
// "num_key_value_heads: ... num_attention_heads=8".
Status with_file_keys(const Status& s, const std::string& type) {
  if (s.ok()) return s;
  std::string text = s.message();
  for (const auto& [field, key] : file_keys(type)) {
    text = replace_word(text, "model." + field, key);
    const std::string last = field.substr(field.rfind('.') + 1);  // "moe.num_experts" is "num_experts=8" in text
    text = replace_word(text, last + "=", key.substr(key.rfind('.') + 1) + "=");
  }
  return Status(s.code(), text);
}

}  // namespace

bool is_hf_config(const Json& json) { return json.is_object() && json.contains("model_type"); }

Result<ModelSpec> model_from_hf_config(const Json& json, const std::string& name, const std::string& what) {
  JsonReader r(json, "");
  std::string type;
  std::vector<std::string> types;
  for (const auto& [k, v] : readers()) types.push_back(k);
  Status s = r.get_enum("model_type", &type, types, true);
  if (!s.ok()) return s.with_context(what + " (Hugging Face config.json)");
  ModelSpec m;
  m.name = name;
  s = readers().at(type)(r, &m);
  if (s.ok()) s = with_file_keys(m.validate(), type);
  if (!s.ok()) return s.with_context(what + " (Hugging Face config.json, model_type " + type + ")");
  return m;
}

}  // namespace piper
