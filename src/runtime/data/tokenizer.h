// Byte-level tokenizer: token id = byte value, vocabulary 256. Lossless for any byte string (UTF-8 or not).
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/status.h"

namespace piper {

class ByteTokenizer {
 public:
  static constexpr int kVocabSize = 256;
  static std::vector<uint16_t> encode(const std::string& text);
  // OutOfRange naming the position and the id when an id is >= 256.
  static Result<std::string> decode(const std::vector<uint16_t>& ids);
};

}  // namespace piper
