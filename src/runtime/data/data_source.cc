#include "piper/runtime/data/data_source.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "piper/base/files.h"
#include "piper/runtime/data/tokenizer.h"

namespace piper {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A FIFO or a device given as --data is refused (files.h), never blocked on.
Result<std::string> read_bytes(const std::string& path) { return read_regular_file(path, "data file"); }

}  // namespace

bool is_token_file(const std::string& path) {
  return ends_with(path, ".u16") || ends_with(path, ".bin") || ends_with(path, ".tokens");
}

Status append_file(const std::string& path, int64_t vocab_size, Corpus* corpus) {
  PIPER_ASSIGN_OR_RETURN(std::string bytes, read_bytes(path));
  return append_bytes(bytes, path, vocab_size, corpus);
}

Status append_bytes(const std::string& bytes, const std::string& path, int64_t vocab_size, Corpus* corpus) {
  if (!is_token_file(path)) {
    if (vocab_size < ByteTokenizer::kVocabSize) {
      return invalid_argument("text file '" + path +
                              "' needs the byte tokenizer's 256 ids but the model's vocab_size is " +
                              std::to_string(vocab_size) + "; pre-tokenize it into a .u16 file");
    }
    const std::vector<uint16_t> ids = ByteTokenizer::encode(bytes);
    corpus->tokens.insert(corpus->tokens.end(), ids.begin(), ids.end());
  } else {
    if (bytes.size() % 2 != 0) {
      return data_loss("token file '" + path + "' has " + std::to_string(bytes.size()) +
                       " bytes, not a whole number of uint16 tokens (truncated?)");
    }
    const size_t count = bytes.size() / 2;
    corpus->tokens.reserve(corpus->tokens.size() + count);
    for (size_t i = 0; i < count; ++i) {
      const uint16_t id = static_cast<uint16_t>(static_cast<unsigned char>(bytes[2 * i]) |
                                                (static_cast<unsigned char>(bytes[2 * i + 1]) << 8));
      if (id >= vocab_size) {
        return out_of_range("token file '" + path + "': token " + std::to_string(id) + " at index " +
                            std::to_string(i) + " is outside the model's vocabulary [0, " + std::to_string(vocab_size) +
                            ")");
      }
      corpus->tokens.push_back(id);
    }
  }
  corpus->files.push_back(path);
  return ok_status();
}

Result<Corpus> load_corpus(const std::string& path_in, int64_t vocab_size) {
  const bool is_default = path_in.empty();
  const std::string path = is_default ? kDefaultCorpusDir : path_in;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return not_found(is_default ? "default corpus '" + path +
                                      "' is missing; run scripts/setup.sh (installs the "
                                      "fortunes package) or pass --data FILE"
                                : "data file '" + path + "' does not exist; check the --data path");
  }
  Corpus corpus;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      // Regular files only: skips the fortunes .u8 symlinks (duplicates) and subdirectories.
      if (!entry.is_symlink() && entry.is_regular_file() && entry.path().extension() != ".dat") {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) return not_found("data directory '" + path + "' has no data files");
    for (const std::string& f : files) PIPER_RETURN_IF_ERROR(append_file(f, vocab_size, &corpus));
  } else {
    PIPER_RETURN_IF_ERROR(append_file(path, vocab_size, &corpus));
  }
  return corpus;
}

Status write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return not_found("cannot write token file '" + path + "': " + std::strerror(errno));
  for (uint16_t t : tokens) {
    const char b[2] = {static_cast<char>(t & 0xff), static_cast<char>(t >> 8)};
    out.write(b, 2);
  }
  if (!out) return internal_error("write to token file '" + path + "' failed");
  return ok_status();
}

}  // namespace piper
