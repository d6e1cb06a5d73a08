#include "piper/spec/model_loader.h"

#include <filesystem>

#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/spec/hf_config.h"
#include "piper/spec/model_json.h"
#include "piper/spec/presets.h"

namespace piper {
namespace {

// A Hugging Face checkpoint directory holds config.json: name the model after the directory.
std::string name_from_path(const std::string& path) {
  std::filesystem::path p(path);
  if (p.filename() == "config.json" && p.has_parent_path() && !p.parent_path().filename().empty()) {
    return p.parent_path().filename().string();
  }
  return p.stem().string();
}

}  // namespace

bool looks_like_path(const std::string& name_or_path) {
  return name_or_path.find('/') != std::string::npos || ends_with(name_or_path, ".json");
}

Result<ModelSpec> load_model_from_text(const std::string& text, const std::string& name, const std::string& what) {
  PIPER_ASSIGN_OR_RETURN(Json json, parse_json(text, what));
  if (is_hf_config(json)) return model_from_hf_config(json, name, what);
  return model_from_json(json, what);
}

Result<ModelSpec> load_model(const std::string& name_or_path) {
  if (looks_like_path(name_or_path)) {
    PIPER_ASSIGN_OR_RETURN(std::string text, read_text_file(name_or_path));
    return load_model_from_text(text, name_from_path(name_or_path), name_or_path);
  }
  PIPER_ASSIGN_OR_RETURN(std::string text, model_preset_text(name_or_path));
  return load_model_from_text(text, name_or_path, "preset " + name_or_path);
}

}  // namespace piper
