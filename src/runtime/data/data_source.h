// Training corpora as one stream of token ids.
//
// Sources: plain-text files (byte tokenizer), pre-tokenized files of little-endian uint16 ids (extension .u16,
// .bin or .tokens), or a directory (every regular file in it, sorted by name, text unless the extension says
// tokens). The default corpus is the text of Debian's `fortunes` package (/usr/share/games/fortunes, without the
// .dat index files and the .u8 links), installed by scripts/setup.sh.
// Errors: a missing path is NotFound naming it; a token id >= vocab_size is OutOfRange naming the file, the
// offset and the id; a token file with an odd byte count is DataLoss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/status.h"

namespace piper {

inline constexpr const char* kDefaultCorpusDir = "/usr/share/games/fortunes";

struct Corpus {
  std::vector<uint16_t> tokens;
  std::vector<std::string> files;  // what was read, in order
};

// True for the token-file extensions (.u16, .bin, .tokens).
bool is_token_file(const std::string& path);
// Reads one file (text or tokens by extension) and appends to corpus.
Status append_file(const std::string& path, int64_t vocab_size, Corpus* corpus);
// The same on a file's bytes already in memory: `path` (its extension) says text or tokens and names it.
Status append_bytes(const std::string& bytes, const std::string& path, int64_t vocab_size, Corpus* corpus);
// A file or a directory; an empty path means the default corpus.
Result<Corpus> load_corpus(const std::string& path, int64_t vocab_size);
// Writes tokens as little-endian uint16 (for tests and for pre-tokenizing).
Status write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace piper
