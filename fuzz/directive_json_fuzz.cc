// A directive file (`compile --directives FILE`, written by `compile --emit-directives`): parse_json +
// directives_from_json (load_directives_file); a list that loads must round-trip through directives_to_json.
// The action filters inside ("0F3", "7BW2") go through parse_action_filter.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/base/json.h"
#include "piper/ir/directive.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<Json> j = parse_json(fuzz::as_text(data, size), "directives.json");
  if (!j.ok()) return 0;
  Result<std::vector<ir::Directive>> d = ir::directives_from_json(*j, "directives.json");
  if (!d.ok()) return 0;
  const Json written = ir::directives_to_json(*d);
  Result<std::vector<ir::Directive>> again = ir::directives_from_json(written, "written directives");
  fuzz::require(again.ok(), "directives_to_json() loads back",
                written.dump() + "\n" + (again.ok() ? "" : again.status().message()));
  fuzz::require(ir::directives_to_json(*again) == written, "directives_to_json() loads back the same", written.dump());
  return 0;
}
