// A checkpoint's index.json (`train --resume DIR`): CheckpointReader::from_index_text, the body of
// CheckpointReader::open. Only the index is read (its rank files are opened on first restore, not here); every
// piece of an index that loads lies inside its tensor.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/runtime/checkpoint.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = CheckpointReader::from_index_text(fuzz::as_text(data, size), "/nonexistent/step-00000001",
                                             "step-00000001/index.json");
  if (!r.ok()) return 0;
  for (const auto& [name, t] : (*r)->tensors()) {
    for (const auto& p : t.pieces) {
      fuzz::require(p.offset.size() == t.shape.size() && p.extent.size() == t.shape.size() && p.begin <= p.end,
                    "a loaded piece has the tensor's rank and a [begin, end) range", name);
    }
  }
  return 0;
}
