// A model file (`--model FILE`): load_model_from_text, which takes Piper's schema or, when the JSON looks like
// one, a Hugging Face config.json. A model that loads must write (to_json) into one that loads back the same.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/spec/model_json.h"
#include "piper/spec/model_loader.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<ModelSpec> m = load_model_from_text(fuzz::as_text(data, size), "fuzz", "model.json");
  if (!m.ok()) return 0;
  const std::string written = to_json(*m).dump();
  Result<ModelSpec> again = load_model_from_text(written, "fuzz", "written model");
  fuzz::require(again.ok(), "to_json() loads back", written + "\n" + (again.ok() ? "" : again.status().message()));
  fuzz::require(to_json(*again).dump() == written, "to_json() loads back the same", written);
  return 0;
}
