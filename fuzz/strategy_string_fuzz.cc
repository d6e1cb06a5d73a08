// The compact strategy string (`--strategy dp=2,pp=4,...`): Strategy::parse, validate and validate_for against
// tiny-moe; a strategy that parses must print (to_string) into one that parses back equal.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/spec/model_loader.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ModelSpec model = *load_model("tiny-moe");
  const std::string text = fuzz::as_text(data, size);
  // Strategy::parse reads a file when the text names one: keep the target off the file system.
  if (text.find('/') != std::string::npos || text.find(".json") != std::string::npos) return 0;
  if (text.find('{') != std::string::npos) return 0;  // JSON: strategy_json_fuzz
  Result<Strategy> s = Strategy::parse(text);
  if (!s.ok() || !s->validate().ok()) return 0;
  // A valid strategy prints into one that parses back equal (the compact form drops nothing that counts).
  Result<Strategy> again = Strategy::parse(s->to_string());
  fuzz::require(again.ok(), "to_string() parses back", s->to_string() + "\n" + again.status().message());
  fuzz::require(*again == *s, "to_string() parses back equal", text + " -> " + s->to_string());
  TrainSpec train;
  train.seq_len = 64;
  train.global_batch = s->global_batch();
  (void)s->validate_for(model, train, s->world_size());
  return 0;
}
