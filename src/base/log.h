// Leveled logging to stderr: PIPER_LOG(INFO) << "x=" << x;
// Lines look like "[I rank 3 +12.345s] message". The level comes from PIPER_LOG_LEVEL (debug|info|warn|error,
// default info) or set_log_level(). Thread-safe: each line is written with one fwrite.
#pragma once

#include <sstream>
#include <string>

namespace piper {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Parses "debug", "info", "warn", "error", "off"; returns false on anything else.
bool parse_log_level(const std::string& text, LogLevel* level);

class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  template <typename T>
  LogLine& operator<<(const T& value) {
    os_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream os_;
};

}  // namespace piper

#define PIPER_LOG_LEVEL_DEBUG ::piper::LogLevel::kDebug
#define PIPER_LOG_LEVEL_INFO ::piper::LogLevel::kInfo
#define PIPER_LOG_LEVEL_WARN ::piper::LogLevel::kWarn
#define PIPER_LOG_LEVEL_ERROR ::piper::LogLevel::kError

#define PIPER_LOG(level)                                         \
  if (PIPER_LOG_LEVEL_##level < ::piper::log_level()) {          \
  } else                                                         \
    ::piper::LogLine(PIPER_LOG_LEVEL_##level)
