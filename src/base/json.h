// JSON helpers over nlohmann::json that turn every malformed input into a Status naming the problem.
//
// parse_json reports the byte offset, line and column of a syntax error. JsonReader reads fields of one
// object with the path in every message ("model.num_experts: expected a positive integer, got -3") and can
// report keys that were present but never read (typos such as "num_expert").
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "piper/base/status.h"

namespace piper {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Parses text; `what` names the source in errors (a path, "--strategy", ...).
Result<Json> parse_json(const std::string& text, const std::string& what);
// Reads and parses a file.
Result<Json> load_json_file(const std::string& path);

// Reads fields of one JSON object. `path` prefixes every message ("model", "cluster.node").
class JsonReader {
 public:
  JsonReader(const Json& object, std::string path);

  // A missing required field is an error naming the field; optional fields keep *out unchanged when absent.
  Status get_int(const std::string& key, int64_t* out, bool required, int64_t min_value = INT64_MIN,
                 int64_t max_value = INT64_MAX);
  Status get_int(const std::string& key, int* out, bool required, int min_value = INT32_MIN, int max_value = INT32_MAX);
  Status get_double(const std::string& key, double* out, bool required, double min_value = -1e308,
                    double max_value = 1e308);
  Status get_bool(const std::string& key, bool* out, bool required);
  Status get_string(const std::string& key, std::string* out, bool required);
  // One of `allowed`; the message lists them.
  Status get_enum(const std::string& key, std::string* out, const std::vector<std::string>& allowed, bool required);
  bool has(const std::string& key) const;
  const Json* find(const std::string& key) const;  // nullptr when absent or null; marks the key as read
  std::string field_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  // Keys present in the object that no get_*/find call asked for.
  std::vector<std::string> unread_keys() const;
  // Error listing unread keys (likely typos), or OK.
  Status check_no_unknown_keys() const;

 private:
  const Json& object_;
  std::string path_;
  mutable std::set<std::string> read_;
};

// Reads a whole file into a string; NotFound with the path when it cannot be opened.
Result<std::string> read_text_file(const std::string& path);
// Writes a file (truncating); errors name the path and errno text.
Status write_text_file(const std::string& path, const std::string& text);

}  // namespace piper
