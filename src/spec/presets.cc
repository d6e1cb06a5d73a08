#include "piper/spec/presets.h"

#include "piper/base/strings.h"

namespace piper {
namespace {

std::vector<std::string> names_of(const detail::EmbeddedPreset* presets, int count) {
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.emplace_back(presets[i].name);
  return names;  // the generator sorts the files
}

Result<std::string> text_of(const detail::EmbeddedPreset* presets, int count, const std::string& name, const char* kind,
                            const char* flag) {
  for (int i = 0; i < count; ++i) {
    if (name == presets[i].name) return std::string(presets[i].json_text);
  }
  std::vector<std::string> names = names_of(presets, count);
  std::string hint = closest_match(name, names);
  std::string message = std::string("unknown ") + kind + " preset '" + name + "'";
  if (!hint.empty()) message += " (did you mean '" + hint + "'?)";
  message += "; presets: " + join(names, ", ") + "; or pass a JSON file path to " + flag;
  return not_found(message);
}

}  // namespace

std::vector<std::string> model_preset_names() { return names_of(detail::kModelPresets, detail::kModelPresets_count); }

std::vector<std::string> cluster_preset_names() {
  return names_of(detail::kClusterPresets, detail::kClusterPresets_count);
}

Result<std::string> model_preset_text(const std::string& name) {
  return text_of(detail::kModelPresets, detail::kModelPresets_count, name, "model", "--model");
}

Result<std::string> cluster_preset_text(const std::string& name) {
  return text_of(detail::kClusterPresets, detail::kClusterPresets_count, name, "cluster", "--cluster");
}

}  // namespace piper
