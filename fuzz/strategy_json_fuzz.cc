// A strategy as JSON (`--strategy '{"dp": 2, ...}'` or a .json file): parse_json + Strategy::from_json, then
// validate; a strategy that loads must round-trip through to_json and, when valid, through its compact string.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/base/json.h"
#include "piper/strategy/strategy.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<Json> j = parse_json(fuzz::as_text(data, size), "strategy.json");
  if (!j.ok()) return 0;
  Result<Strategy> s = Strategy::from_json(*j);
  if (!s.ok()) return 0;
  Result<Strategy> again = Strategy::from_json(s->to_json());
  fuzz::require(again.ok() && *again == *s, "to_json() loads back equal", s->to_json().dump());
  if (!s->validate().ok()) return 0;
  Result<Strategy> compact = Strategy::parse(s->to_string());
  fuzz::require(compact.ok() && *compact == *s, "to_string() parses back equal", s->to_string());
  return 0;
}
