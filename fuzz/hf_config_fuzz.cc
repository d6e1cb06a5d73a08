// A Hugging Face config.json (`--model DIR/config.json`): parse_json + model_from_hf_config, whether or not
// is_hf_config recognises it. A config that loads must give a model that round-trips through Piper's schema.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/base/json.h"
#include "piper/spec/hf_config.h"
#include "piper/spec/model_json.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<Json> j = parse_json(fuzz::as_text(data, size), "config.json");
  if (!j.ok()) return 0;
  (void)is_hf_config(*j);
  Result<ModelSpec> m = model_from_hf_config(*j, "fuzz", "config.json");
  if (!m.ok()) return 0;
  const OrderedJson written = to_json(*m);
  Result<ModelSpec> again = model_from_json(Json::parse(written.dump()), "written model");
  fuzz::require(again.ok(), "the model loads back from to_json()",
                written.dump() + "\n" + (again.ok() ? "" : again.status().message()));
  return 0;
}
