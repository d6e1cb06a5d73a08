// Presets compiled into the binary: every configs/models/*.json and configs/clusters/*.json becomes a string in
// a generated source (cmake/embed_presets.cmake), so presets work from any directory and need no install step.
// A preset's name is its file name without ".json" ("deepseek-v3"). Thread-safe (read-only data).
#pragma once

#include <string>
#include <vector>

#include "piper/base/status.h"

namespace piper {

namespace detail {
struct EmbeddedPreset {
  const char* name;
  const char* json_text;
};
extern const EmbeddedPreset kModelPresets[];
extern const int kModelPresets_count;
extern const EmbeddedPreset kClusterPresets[];
extern const int kClusterPresets_count;
}  // namespace detail

// Sorted preset names.
std::vector<std::string> model_preset_names();
std::vector<std::string> cluster_preset_names();

// The JSON text of a preset; NotFound listing every preset (and the closest name as "did you mean") otherwise.
Result<std::string> model_preset_text(const std::string& name);
Result<std::string> cluster_preset_text(const std::string& name);

}  // namespace piper
