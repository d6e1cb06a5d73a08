// Our own model JSON schema (docs/model_schema.md) <-> ModelSpec.
//
// The schema mirrors ModelSpec field for field, so validation messages ("model.moe.top_k: ...") name the JSON
// field to fix. Unknown keys are errors (typos such as "num_expert"); required fields are never defaulted.
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/spec/model_spec.h"

namespace piper {

// Parses and validates one model object. `what` names the source in messages (a path or a preset name).
Result<ModelSpec> model_from_json(const Json& json, const std::string& what);

// Every field, in a fixed order (round-trips through model_from_json). "mla" only for MLA attention and "moe"
// only for MoE models.
OrderedJson to_json(const ModelSpec& model);

}  // namespace piper
