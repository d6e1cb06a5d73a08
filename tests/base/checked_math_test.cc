#include "piper/base/checked_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace piper {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(CheckedMathTest, CheckedMulDetectsOverflow) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_FALSE(checked_mul(int64_t{1} << 32, int64_t{1} << 31).has_value());  // 2^63
  EXPECT_FALSE(checked_mul(kMin, -1).has_value());
  EXPECT_EQ(checked_mul(-(int64_t{1} << 31), int64_t{1} << 32), kMin);  // -2^63 fits
  EXPECT_EQ(checked_mul(0, kMax), 0);
}

TEST(CheckedMathTest, CheckedAddDetectsOverflow) {
  EXPECT_EQ(checked_add(kMax - 1, 1), kMax);
  EXPECT_FALSE(checked_add(kMax, 1).has_value());
  EXPECT_FALSE(checked_add(kMin, -1).has_value());
}

TEST(CheckedMathTest, SaturatingOpsClampBySign) {
  EXPECT_EQ(sat_mul(int64_t{1} << 40, int64_t{1} << 40), kMax);
  EXPECT_EQ(sat_mul(-(int64_t{1} << 40), int64_t{1} << 40), kMin);
  EXPECT_EQ(sat_mul(-(int64_t{1} << 40), -(int64_t{1} << 40)), kMax);
  EXPECT_EQ(sat_mul(3, 7), 21);
  EXPECT_EQ(sat_add(kMax, kMax), kMax);
  EXPECT_EQ(sat_add(kMin, -5), kMin);
  EXPECT_EQ(sat_add(kMax, -1), kMax - 1);
}

TEST(CheckedMathTest, CheckedLlroundRefusesWhatInt64CannotHold) {
  EXPECT_EQ(checked_llround(2.5), 3);
  EXPECT_EQ(checked_llround(-1e18), int64_t{-1000000000000000000});
  EXPECT_FALSE(checked_llround(9.3e18).has_value());
  EXPECT_FALSE(checked_llround(9223372036854775808.0).has_value());  // 2^63
  EXPECT_FALSE(checked_llround(std::nan("")).has_value());
  EXPECT_FALSE(checked_llround(std::numeric_limits<double>::infinity()).has_value());
  EXPECT_FALSE(checked_llround(-std::numeric_limits<double>::infinity()).has_value());
}

}  // namespace
}  // namespace piper
