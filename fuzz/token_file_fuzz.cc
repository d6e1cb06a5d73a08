// A training data file (`train --data FILE`): append_bytes, the body of append_file, as a text file (byte
// tokenizer) or a .u16 token file by the first byte, against a vocabulary size from the next two bytes. Every
// loaded token lies in the vocabulary, and a text file decodes back to its bytes.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/runtime/data/data_source.h"
#include "piper/runtime/data/tokenizer.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const bool tokens = (data[0] & 1) != 0;
  const int64_t vocab_size = static_cast<int64_t>(data[1] | (data[2] << 8)) + ((data[0] & 2) ? 0 : 256);
  const std::string bytes = fuzz::as_text(data + 3, size - 3);
  const std::string path = tokens ? "data.u16" : "data.txt";
  Corpus corpus;
  if (!append_bytes(bytes, path, vocab_size, &corpus).ok()) return 0;
  for (uint16_t t : corpus.tokens) fuzz::require(t < vocab_size, "every token lies in the vocabulary");
  if (!tokens) {
    Result<std::string> text = ByteTokenizer::decode(corpus.tokens);
    fuzz::require(text.ok() && *text == bytes, "a text file decodes back to its bytes");
  } else {
    fuzz::require(corpus.tokens.size() * 2 == bytes.size(), "a token file holds size / 2 tokens");
  }
  return 0;
}
