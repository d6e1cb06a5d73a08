#include "piper/base/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "piper/base/check.h"

namespace piper {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("PIPER_LOG_LEVEL");
  LogLevel level = LogLevel::kInfo;
  if (env != nullptr) parse_log_level(env, &level);
  return level;
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{initial_level()};
  return level;
}

const auto g_start = std::chrono::steady_clock::now();

}  // namespace

void set_log_level(LogLevel level) { level_ref().store(level); }
LogLevel log_level() { return level_ref().load(); }

bool parse_log_level(const std::string& text, LogLevel* level) {
  if (text == "debug") *level = LogLevel::kDebug;
  else if (text == "info") *level = LogLevel::kInfo;
  else if (text == "warn") *level = LogLevel::kWarn;
  else if (text == "error") *level = LogLevel::kError;
  else if (text == "off") *level = LogLevel::kOff;
  else return false;
  return true;
}

LogLine::~LogLine() {
  static const char kTags[] = {'D', 'I', 'W', 'E', '-'};
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
  std::string prefix;
  char buf[64];
  int rank = process_rank();
  if (rank >= 0) {
    std::snprintf(buf, sizeof(buf), "[%c rank %d +%.3fs] ", kTags[static_cast<int>(level_)], rank, t);
  } else {
    std::snprintf(buf, sizeof(buf), "[%c +%.3fs] ", kTags[static_cast<int>(level_)], t);
  }
  std::string line = buf + os_.str() + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace piper
