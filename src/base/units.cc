#include "piper/base/units.h"

#include <cmath>
#include <cstdio>

namespace piper {
namespace {
std::string fmt(const char* f, double v, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v, suffix);
  return buf;
}
}  // namespace

std::string format_bytes(double bytes) {
  double a = std::fabs(bytes);
  if (a >= kGiB * 1024) return fmt("%.2f %s", bytes / (kGiB * 1024), "TiB");
  if (a >= kGiB) return fmt("%.2f %s", bytes / kGiB, "GiB");
  if (a >= kMiB) return fmt("%.1f %s", bytes / kMiB, "MiB");
  if (a >= kKiB) return fmt("%.1f %s", bytes / kKiB, "KiB");
  return fmt("%.0f %s", bytes, "B");
}

std::string format_count(double count) {
  double a = std::fabs(count);
  if (a >= 1e12) return fmt("%.2f %s", count / 1e12, "T");
  if (a >= 1e9) return fmt("%.2f %s", count / 1e9, "B");
  if (a >= 1e6) return fmt("%.2f %s", count / 1e6, "M");
  if (a >= 1e3) return fmt("%.2f %s", count / 1e3, "K");
  return fmt("%.0f%s", count, "");
}

std::string format_si(double value, const std::string& unit) {
  static const struct {
    double scale;
    const char* prefix;
  } kPrefixes[] = {{1e18, "E"}, {1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "K"}, {1, ""}};
  double a = std::fabs(value);
  for (const auto& p : kPrefixes) {
    if (a >= p.scale || p.scale == 1) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.3g %s%s", value / p.scale, p.prefix, unit.c_str());
      return buf;
    }
  }
  return std::to_string(value) + " " + unit;
}

std::string format_seconds(double seconds) {
  double a = std::fabs(seconds);
  if (a >= 1.0) return fmt("%.3f %s", seconds, "s");
  if (a >= 1e-3) return fmt("%.3f %s", seconds * 1e3, "ms");
  return fmt("%.1f %s", seconds * 1e6, "us");
}

}  // namespace piper
