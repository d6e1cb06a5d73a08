// Units and human-readable formatting. Quantities in Piper are SI base units in double or int64:
// bytes, seconds, FLOPs, FLOP/s, bytes/s. Names carry the unit (bytes_per_rank, step_time_s, bw_bytes_per_s).
#pragma once

#include <cstdint>
#include <string>

namespace piper {

inline constexpr double kKiB = 1024.0;
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kKB = 1e3;
inline constexpr double kMB = 1e6;
inline constexpr double kGB = 1e9;
inline constexpr double kTB = 1e12;
inline constexpr double kGiga = 1e9;
inline constexpr double kTera = 1e12;

// "1.50 GiB", "812.0 MiB", "96 B".
std::string format_bytes(double bytes);
// "37.55 B" (billions, as model sizes are quoted), "125.3 M", "8.1 K".
std::string format_count(double count);
// "989.0 TFLOP/s" style with the given suffix: format_si(9.89e14, "FLOP/s").
std::string format_si(double value, const std::string& unit);
// "1.234 s", "12.3 ms", "45.6 us".
std::string format_seconds(double seconds);

}  // namespace piper
