// A checkpoint's rank file (safetensors: 8-byte header length, JSON header, data): parse_safetensors, the body
// of read_safetensors. A file that loads must hold tensors whose sizes add up to its data section.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/runtime/checkpoint/safetensors.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = fuzz::as_text(data, size);
  Result<SafetensorsFile> f = parse_safetensors(bytes, "rank-00000.safetensors", MemCategory::kParameters);
  if (!f.ok()) return 0;
  uint64_t data_bytes = 0;
  for (const auto& [name, t] : f->tensors) data_bytes += static_cast<uint64_t>(t.nbytes());
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(data[i]) << (8 * i);
  fuzz::require(8 + header_len + data_bytes == size, "the tensors cover the data section exactly",
                std::to_string(data_bytes) + " tensor bytes in a file of " + std::to_string(size));
  return 0;
}
