// A checkpoint's index.json (`train --resume DIR`): checkpoint_format::parse_index, the parser CheckpointReader::open
// calls on the index's text. Only the index is read (its rank files are opened on first restore, not here); every
// piece of an index that loads lies inside its tensor.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/runtime/checkpoint/checkpoint_format.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto index = checkpoint_format::parse_index(fuzz::as_text(data, size), "step-00000001/index.json", "step-00000001");
  if (!index.ok()) return 0;
  for (const auto& [name, t] : index->tensors) {
    for (const auto& p : t.pieces) {
      fuzz::require(p.offset.size() == t.shape.size() && p.extent.size() == t.shape.size() && p.begin <= p.end,
                    "a loaded piece has the tensor's rank and a [begin, end) range", name);
    }
  }
  return 0;
}
