#include "piper/runtime/data/tokenizer.h"

namespace piper {

std::vector<uint16_t> ByteTokenizer::encode(const std::string& text) {
  std::vector<uint16_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

Result<std::string> ByteTokenizer::decode(const std::vector<uint16_t>& ids) {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= kVocabSize) {
      return out_of_range("byte tokenizer: token " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                          " is outside the vocabulary [0, 256)");
    }
    text[i] = static_cast<char>(ids[i]);
  }
  return text;
}

}  // namespace piper
