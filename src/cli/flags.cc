#include "piper/cli/flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "piper/base/files.h"
#include "piper/base/strings.h"

namespace piper::cli {
namespace {

std::string format_real(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

std::string describe(const IntRange& r) {
  return "[" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]" +
         (r.meaning.empty() ? "" : " (" + r.meaning + ")");
}

std::string describe(const RealRange& r) {
  return (r.lo_open ? "(" : "[") + format_real(r.lo) + ", " + format_real(r.hi) + "]" +
         (r.meaning.empty() ? "" : " (" + r.meaning + ")");
}

}  // namespace

std::string check_int_text(const std::string& text, const IntRange& range) {
  Result<int64_t> v = parse_int(trim(text), "value");
  if (!v.ok()) return "'" + elide(text) + "' is not an integer; give an integer in " + describe(range);
  if (*v < range.lo || *v > range.hi) {
    return std::to_string(*v) + " is outside " + describe(range) + "; give a value in that range";
  }
  return "";
}

std::string check_real_text(const std::string& text, const RealRange& range) {
  Result<double> v = parse_double(trim(text), "value");
  if (!v.ok()) return "'" + elide(text) + "' is not a number; give a number in " + describe(range);
  if (!std::isfinite(*v)) return elide(text) + " is not finite; give a number in " + describe(range);
  const bool low = range.lo_open ? *v <= range.lo : *v < range.lo;
  if (low || *v > range.hi) return elide(text) + " is outside " + describe(range) + "; give a value in that range";
  return "";
}

CLI::Validator int_range(const IntRange& range) {
  return CLI::Validator([range](std::string& text) { return check_int_text(text, range); }, describe(range), "");
}

CLI::Validator real_range(const RealRange& range) {
  return CLI::Validator([range](std::string& text) { return check_real_text(text, range); }, describe(range), "");
}

Status check_seq_len(const ModelSpec& model, int64_t seq_len) {
  if (seq_len > model.max_seq_len) {
    return invalid_argument("--seq " + std::to_string(seq_len) + " exceeds the model's max_seq_len " +
                            std::to_string(model.max_seq_len) + " (" + model.name +
                            "); give --seq <= " + std::to_string(model.max_seq_len));
  }
  return ok_status();
}

Result<int64_t> resolve_seq_len(const ModelSpec& model, int64_t given) {
  if (given == 0) return std::min<int64_t>(4096, model.max_seq_len);
  PIPER_RETURN_IF_ERROR(check_seq_len(model, given));
  return given;
}

}  // namespace piper::cli
