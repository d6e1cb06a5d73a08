// A plan file (`piper compile --emit-plan FILE`): parse_json + compile::plan_from_json (load_plan_file's body); a
// plan that loads must write back to the same JSON (Plan::to_json) and load again to the same Plan.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/base/json.h"
#include "piper/compile/plan_io.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<Json> j = parse_json(fuzz::as_text(data, size), "plan.json");
  if (!j.ok()) return 0;
  Result<compile::Plan> plan = compile::plan_from_json(*j, "plan.json");
  if (!plan.ok()) return 0;
  const Json written = plan->to_json();
  Result<compile::Plan> again = compile::plan_from_json(written, "written plan");
  fuzz::require(again.ok(), "Plan::to_json() loads back",
                written.dump() + "\n" + (again.ok() ? "" : again.status().message()));
  fuzz::require(*again == *plan, "Plan::to_json() loads back the same plan", written.dump());
  return 0;
}
