#include "piper/base/json.h"

#include "piper/base/files.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

namespace piper {
namespace {

// Line and column (1-based) of a byte offset.
std::pair<size_t, size_t> line_col(const std::string& text, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

std::string type_name(const Json& v) { return v.type_name(); }

// Where the parser stopped: a SAX handler that builds nothing and keeps the position of the error. Used only on
// the error path, for the exceptions that carry no position (out_of_range: a number too large for a double).
class ErrorLocator : public nlohmann::json_sax<Json> {
 public:
  size_t position = 0;  // bytes read when the parser stopped: the end of the offending token
  std::string token;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t pos, const std::string& last_token, const nlohmann::detail::exception&) override {
    position = pos;
    token = last_token;
    return false;
  }
};

// "[json.exception.parse_error.101] parse error at line 1, column 2: ..." -> the text after the first ": ".
std::string exception_detail(const std::string& msg) {
  auto pos = msg.find(": ");
  return pos == std::string::npos ? msg : msg.substr(pos + 2);
}

// "line L, column C (byte B)" of a byte offset.
std::string where(const std::string& text, size_t offset) {
  auto [line, col] = line_col(text, offset);
  return "line " + std::to_string(line) + ", column " + std::to_string(col) + " (byte " + std::to_string(offset) + ")";
}

}  // namespace

Result<Json> parse_json(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    return invalid_argument(what + ": malformed JSON at " + where(text, e.byte > 0 ? e.byte - 1 : 0) + ": " +
                            exception_detail(e.what()));
  } catch (const Json::exception& e) {
    // out_of_range 406 (a number such as 1e400 that no double holds) and any other error of the library: these
    // carry no position, so parse again to find it.
    ErrorLocator locator;
    Json::sax_parse(text, &locator);
    const size_t offset = locator.position >= locator.token.size() ? locator.position - locator.token.size() : 0;
    if (e.id == 406) {
      return invalid_argument(what + ": the number " + locator.token + " at " + where(text, offset) +
                              " does not fit a double (magnitude at most about 1.8e308); write a smaller value");
    }
    return invalid_argument(what + ": malformed JSON at " + where(text, offset) + ": " + exception_detail(e.what()));
  }
}

Result<std::string> read_text_file(const std::string& path) { return read_regular_file(path); }

Status write_text_file(const std::string& path, const std::string& text) { return write_file_atomic(path, text); }

Result<Json> load_json_file(const std::string& path) {
  PIPER_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_json(text, path);
}

JsonReader::JsonReader(const Json& object, std::string path) : object_(object), path_(std::move(path)) {}

bool JsonReader::has(const std::string& key) const {
  return object_.is_object() && object_.contains(key) && !object_.at(key).is_null();
}

const Json* JsonReader::find(const std::string& key) const {
  read_.insert(key);
  if (!has(key)) return nullptr;
  return &object_.at(key);
}

Status JsonReader::get_int(const std::string& key, int64_t* out, bool required, int64_t min_value,
                           int64_t max_value) {
  const Json* v = find(key);
  if (v == nullptr) {
    if (required) return invalid_argument(field_path(key) + ": required field is missing (an integer)");
    return ok_status();
  }
  std::string range = "[" + (min_value == INT64_MIN ? std::string("-inf") : std::to_string(min_value)) + ", " +
                      (max_value == INT64_MAX ? std::string("inf") : std::to_string(max_value)) + "]";
  auto out_of_range = [&](const std::string& value) {
    return invalid_argument(field_path(key) + ": " + value + " is out of range; allowed " + range);
  };
  int64_t value = 0;
  if (v->is_number_unsigned()) {
    // Above INT64_MAX (up to 2^64 - 1) it would wrap to a negative value.
    if (v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return out_of_range(v->dump());
    value = v->get<int64_t>();
  } else if (v->is_number_integer()) {
    value = v->get<int64_t>();
  } else if (v->is_number_float() && std::trunc(v->get<double>()) == v->get<double>()) {
    // A whole number written as a float (64.0, 1e3); casting one outside [-2^63, 2^63) is undefined.
    const double d = v->get<double>();
    if (!(d >= -9.2233720368547758e18 && d < 9.2233720368547758e18)) return out_of_range(v->dump());
    value = static_cast<int64_t>(d);
  } else {
    return invalid_argument(field_path(key) + ": expected an integer, got " + type_name(*v) + " " + v->dump());
  }
  if (value < min_value || value > max_value) return out_of_range(std::to_string(value));
  *out = value;
  return ok_status();
}

Status JsonReader::get_int(const std::string& key, int* out, bool required, int min_value, int max_value) {
  int64_t v = *out;
  PIPER_RETURN_IF_ERROR(get_int(key, &v, required, min_value, max_value));
  *out = static_cast<int>(v);
  return ok_status();
}

Status JsonReader::get_double(const std::string& key, double* out, bool required, double min_value,
                              double max_value) {
  const Json* v = find(key);
  if (v == nullptr) {
    if (required) return invalid_argument(field_path(key) + ": required field is missing (a number)");
    return ok_status();
  }
  if (!v->is_number()) {
    return invalid_argument(field_path(key) + ": expected a number, got " + type_name(*v) + " " + v->dump());
  }
  double value = v->get<double>();
  if (!(value >= min_value && value <= max_value)) {
    std::ostringstream os;
    os << field_path(key) << ": " << value << " is out of range; allowed [" << min_value << ", " << max_value << "]";
    return invalid_argument(os.str());
  }
  *out = value;
  return ok_status();
}

Status JsonReader::get_bool(const std::string& key, bool* out, bool required) {
  const Json* v = find(key);
  if (v == nullptr) {
    if (required) return invalid_argument(field_path(key) + ": required field is missing (true or false)");
    return ok_status();
  }
  if (!v->is_boolean()) {
    return invalid_argument(field_path(key) + ": expected true or false, got " + type_name(*v) + " " + v->dump());
  }
  *out = v->get<bool>();
  return ok_status();
}

Status JsonReader::get_string(const std::string& key, std::string* out, bool required) {
  const Json* v = find(key);
  if (v == nullptr) {
    if (required) return invalid_argument(field_path(key) + ": required field is missing (a string)");
    return ok_status();
  }
  if (!v->is_string()) {
    return invalid_argument(field_path(key) + ": expected a string, got " + type_name(*v) + " " + v->dump());
  }
  *out = v->get<std::string>();
  return ok_status();
}

Status JsonReader::get_enum(const std::string& key, std::string* out, const std::vector<std::string>& allowed,
                            bool required) {
  std::string value = *out;
  PIPER_RETURN_IF_ERROR(get_string(key, &value, required));
  if (!has(key)) return ok_status();
  for (const auto& a : allowed) {
    if (a == value) {
      *out = value;
      return ok_status();
    }
  }
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  return invalid_argument(field_path(key) + ": '" + value + "' is not allowed; pick one of {" + list + "}");
}

std::vector<std::string> JsonReader::unread_keys() const {
  std::vector<std::string> keys;
  if (!object_.is_object()) return keys;
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (!read_.count(it.key())) keys.push_back(it.key());
  }
  return keys;
}

Status JsonReader::check_no_unknown_keys() const {
  auto keys = unread_keys();
  if (keys.empty()) return ok_status();
  std::string list;
  for (const auto& k : keys) list += (list.empty() ? "" : ", ") + field_path(k);
  return invalid_argument("unknown field(s): " + list + " (check the spelling against docs/)");
}

}  // namespace piper
