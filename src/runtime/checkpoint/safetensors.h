// The safetensors file format for named fp32 tensors (https://github.com/huggingface/safetensors):
//   8 bytes: N, the header length, little-endian uint64
//   N bytes: a JSON object {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"key": "value"}} padded with spaces to a multiple of 8 bytes
//   the data: raw little-endian values; offsets are relative to the start of the data and cover it exactly.
// Reading validates everything and never trusts a length: a short, truncated or inconsistent file is a
// DataLoss error that names the file and what is wrong. Only F32 is supported (others: Unimplemented).
// Writing goes to "<path>.tmp" and renames, so a crash never leaves a half-written file under the real name.
// Checksums (fnv1a64): one per tensor over its header entry (name, dtype, shape, data_offsets) and its data, so
// that an edited shape is caught as surely as a flipped data bit, and one over the whole file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "piper/base/hash.h"
#include "piper/base/status.h"
#include "piper/tensor/tensor.h"

namespace piper {

// One tensor's header entry and the checksum that covers the entry and the tensor's data.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // "F32"
  Shape shape;                  // as the header says
  uint64_t begin = 0, end = 0;  // data_offsets, bytes from the start of the data section
  uint64_t checksum = 0;        // safetensors_entry_checksum of the above and the bytes [begin, end)
};

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order (sorted by data offset)
  std::vector<SafetensorsEntry> entries;                // tensors[i]'s header entry and checksum
  std::map<std::string, std::string> metadata;
  uint64_t file_hash = 0;  // fnv1a64 of the whole file
};

struct SafetensorsWritten {
  std::vector<SafetensorsEntry> entries;  // in the order given
  uint64_t bytes = 0;                     // the file's size
  uint64_t file_hash = 0;                 // fnv1a64 of the whole file
};


// The checksum of one tensor: fnv1a64 over its name, dtype, shape and data_offsets, then its data bytes.
uint64_t safetensors_entry_checksum(const std::string& name, const std::string& dtype, const Shape& shape,
                                    uint64_t begin, uint64_t end, const void* data);

// Names must be unique and non-empty and must not be "__metadata__". Returns each entry with its checksum.
Result<SafetensorsWritten> write_safetensors(const std::string& path,
                                             const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                                             const std::map<std::string, std::string>& metadata);
// Tensors are allocated in `category`.
Result<SafetensorsFile> read_safetensors(const std::string& path, MemCategory category);
// The same on a file's bytes already in memory; `path` names the source in messages.
Result<SafetensorsFile> parse_safetensors(const std::string& bytes, const std::string& path, MemCategory category);

}  // namespace piper
