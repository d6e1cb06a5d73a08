// A training setup file (`--train FILE`): parse_json + train_from_json (load_train); a setup that loads must
// round-trip through to_json.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/base/json.h"
#include "piper/spec/train_json.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<Json> j = parse_json(fuzz::as_text(data, size), "train.json");
  if (!j.ok()) return 0;
  Result<TrainSpec> t = train_from_json(*j, "train.json");
  if (!t.ok()) return 0;
  const std::string written = to_json(*t).dump();
  Result<TrainSpec> again = train_from_json(Json::parse(written), "written train");
  fuzz::require(again.ok(), "to_json() loads back", written + "\n" + (again.ok() ? "" : again.status().message()));
  fuzz::require(to_json(*again).dump() == written, "to_json() loads back the same", written);
  return 0;
}
