// Hugging Face config.json -> ModelSpec, for model_type llama, mixtral, qwen3_moe, deepseek (DeepSeekMoE), deepseek_v2,
// deepseek_v3, gpt_oss, olmoe, dbrx and gpt2 (GPT-2/GPT-3-style dense models).
//
// Fields that change the architecture are required (missing -> error naming the field); fields that only
// matter for inference (dropout, caching, initialisation) are ignored. Defaults are the ones the
// transformers config class applies when the key is absent, and are listed in docs/model_schema.md.
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/spec/model_spec.h"

namespace piper {

// True when `json` looks like a Hugging Face config (has "model_type").
bool is_hf_config(const Json& json);

// `name` becomes ModelSpec::name; `what` names the source in messages.
Result<ModelSpec> model_from_hf_config(const Json& json, const std::string& name, const std::string& what);

}  // namespace piper
