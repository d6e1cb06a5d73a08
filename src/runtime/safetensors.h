// The safetensors file format for named fp32 tensors (https://github.com/huggingface/safetensors):
//   8 bytes: N, the header length, little-endian uint64
//   N bytes: a JSON object {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"key": "value"}} padded with spaces to a multiple of 8 bytes
//   the data: raw little-endian values; offsets are relative to the start of the data and cover it exactly.
// Reading validates everything and never trusts a length: a short, truncated or inconsistent file is a
// DataLoss error that names the file and what is wrong. Only F32 is supported (others: Unimplemented).
// Writing goes to "<path>.tmp" and renames, so a crash never leaves a half-written file under the real name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "piper/base/status.h"
#include "piper/tensor/tensor.h"

namespace piper {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order (sorted by data offset)
  std::map<std::string, std::string> metadata;
  uint64_t data_hash = 0;  // fnv1a64 of the data section
};

// FNV-1a, 64 bit, over bytes (used as the checkpoint's corruption check).
uint64_t fnv1a64(const void* data, size_t bytes, uint64_t hash = 0xcbf29ce484222325ull);

// Names must be unique and non-empty and must not be "__metadata__". Returns the data section's fnv1a64.
Result<uint64_t> write_safetensors(const std::string& path,
                                   const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                                   const std::map<std::string, std::string>& metadata);
// Tensors are allocated in `category`.
Result<SafetensorsFile> read_safetensors(const std::string& path, MemCategory category);
// The same on a file's bytes already in memory; `path` names the source in messages.
Result<SafetensorsFile> parse_safetensors(const std::string& bytes, const std::string& path, MemCategory category);

}  // namespace piper
