// A checkpoint's model identity (checkpoint.h): the ModelSpec fields that determine tensor shapes and their hash.
#include <cstdio>

#include "piper/base/json.h"
#include "piper/runtime/checkpoint/checkpoint.h"
#include "piper/runtime/checkpoint/checkpoint_format.h"
#include "piper/runtime/checkpoint/safetensors.h"

namespace piper {

std::map<std::string, std::string> model_architecture(const ModelSpec& m) {
  std::map<std::string, std::string> a;
  auto put = [&](const std::string& field, const Json& value) { a[field] = value.dump(); };
  put("num_layers", m.num_layers);
  put("hidden_size", m.hidden_size);
  put("num_heads", m.num_heads);
  put("num_kv_heads", m.num_kv_heads);
  put("head_dim", m.head_dim);
  put("attention", to_string(m.attention));
  if (m.attention == AttentionType::kMLA) {
    put("mla.q_lora_rank", m.mla.q_lora_rank);
    put("mla.kv_lora_rank", m.mla.kv_lora_rank);
    put("mla.qk_nope_head_dim", m.mla.qk_nope_head_dim);
    put("mla.qk_rope_head_dim", m.mla.qk_rope_head_dim);
    put("mla.v_head_dim", m.mla.v_head_dim);
  }
  put("qk_norm", m.qk_norm);
  put("qk_norm_full", m.qk_norm_full);
  put("attention_bias", m.attention_bias);
  put("attention_sinks", m.attention_sinks);
  put("mlp", to_string(m.mlp));
  put("intermediate_size", m.intermediate_size);
  put("mlp_bias", m.mlp_bias);
  put("moe.num_experts", m.moe.num_experts);
  if (m.is_moe()) {
    put("moe.num_shared_experts", m.moe.num_shared_experts);
    put("moe.expert_intermediate_size", m.moe.expert_intermediate_size);
    put("moe.shared_expert_intermediate_size", m.moe.shared_expert_intermediate_size);
    put("moe.first_k_dense_layers", m.moe.first_k_dense_layers);
    put("moe.layer_freq", m.moe.layer_freq);
    put("moe.expert_bias", m.moe.expert_bias);
    put("moe.router_bias", m.moe.router_bias);
  }
  put("vocab_size", m.vocab_size);
  put("tie_embeddings", m.tie_embeddings);
  put("norm", to_string(m.norm));
  put("norm_bias", m.norm_bias);
  put("learned_positions", m.learned_positions);
  if (m.learned_positions) put("max_seq_len", m.max_seq_len);  // the position table's rows
  return a;
}

std::string architecture_hash(const std::map<std::string, std::string>& arch) {
  std::string text;
  for (const auto& [field, value] : arch) text += field + "=" + value + "\n";
  return hex64(fnv1a64(text.data(), text.size()));
}

Status check_checkpoint_model(const std::string& dir, const CheckpointMeta& meta, const ModelSpec& model) {
  const std::map<std::string, std::string> mine = model_architecture(model);
  if (architecture_hash(mine) == architecture_hash(meta.model_arch)) return ok_status();
  std::string diff;
  int differing = 0;
  auto value = [](const std::map<std::string, std::string>& a, const std::string& k) {
    auto it = a.find(k);
    return it == a.end() ? std::string("(absent)") : it->second;
  };
  std::map<std::string, std::string> all = mine;
  all.insert(meta.model_arch.begin(), meta.model_arch.end());
  for (const auto& [field, unused] : all) {
    const std::string theirs = value(meta.model_arch, field), ours = value(mine, field);
    if (theirs == ours) continue;
    if (++differing <= 4) diff += (diff.empty() ? "" : ", ") + field + " " + theirs + " vs " + ours;
  }
  if (differing > 4) diff += " and " + std::to_string(differing - 4) + " more";
  return invalid_argument("checkpoint '" + dir + "' was written for another model: '" + meta.model +
                          "' (architecture " + architecture_hash(meta.model_arch) + ") but this run trains '" +
                          model.name + "' (architecture " + architecture_hash(mine) + "); they differ in " + diff +
                          " (checkpoint vs this run); resume with --model " + meta.model +
                          " (or that model's config file), or start without --resume");
}

std::string checkpoint_step_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

}  // namespace piper
