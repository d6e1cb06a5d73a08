// Overflow-checked integer arithmetic for sizes computed from user-given values (bytes, FLOPs, element counts).
//
// Products of model, cluster and strategy sizes (hidden_size * vocab_size * layers, microbatches * stages, ...)
// can exceed int64 for hostile inputs; a wrapped product turns into a negative FLOP count or a "fits: yes".
// Loaders bound every key (docs/reliability.md, "Input ranges: model, cluster, strategy and directive files")
// and form the products that could still overflow with these helpers:
//   checked_mul / checked_add   nullopt on overflow, for a boundary check that names the value and the limit;
//   sat_mul / sat_add           clamp to INT64_MAX (or INT64_MIN), for counts that a later check compares with a
//                               limit (a saturated count is always over the limit, never a wrapped small one);
//   checked_llround             a finite double that fits int64, rounded; nullopt otherwise (NaN, inf, 1e30).
// All functions are pure and constexpr where the builtins allow it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

namespace piper {

inline constexpr std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline constexpr std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline constexpr int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) != (b < 0) ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
}

inline constexpr int64_t sat_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return a < 0 ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
}

// llround(x) when x is finite and the result fits int64 (|x| < 2^63); nullopt otherwise.
inline std::optional<int64_t> checked_llround(double x) {
  constexpr double kLimit = 9223372036854775808.0;  // 2^63, exactly representable
  if (!std::isfinite(x) || !(x > -kLimit && x < kLimit)) return std::nullopt;
  const double r = std::round(x);
  if (!(r > -kLimit && r < kLimit)) return std::nullopt;
  return static_cast<int64_t>(r);
}

}  // namespace piper
