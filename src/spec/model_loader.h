// Loading a ModelSpec from a preset name, our JSON schema, or a Hugging Face config.json.
//
// load_model("deepseek-v3") reads the compiled-in preset (presets.h). Anything containing '/' or ending in
// ".json" is a file: a Hugging Face config (it has "model_type", see hf_config.h) or our schema
// (docs/model_schema.md). Every result is validated. Errors name the source, the field and the allowed values;
// an unknown preset lists the presets.
#pragma once

#include <string>

#include "piper/base/status.h"
#include "piper/spec/model_spec.h"

namespace piper {

bool looks_like_path(const std::string& name_or_path);

Result<ModelSpec> load_model(const std::string& name_or_path);

// Parses JSON text in either format; `name` names a Hugging Face model (its config has no name).
Result<ModelSpec> load_model_from_text(const std::string& text, const std::string& name, const std::string& what);

}  // namespace piper
