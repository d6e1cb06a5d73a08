#include "piper/base/strings.h"

#include <gtest/gtest.h>

#include "piper/base/units.h"

namespace piper {
namespace {

TEST(StringsTest, SplitTrimJoin) {
  auto parts = split("a,,b", ',');
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1], "");
  EXPECT_EQ(trim("  x y \n"), "x y");
  EXPECT_EQ(join({"a", "b"}, "-"), "a-b");
}

TEST(StringsTest, StrictParse) {
  EXPECT_EQ(*parse_int("42", "n"), 42);
  EXPECT_FALSE(parse_int("4x", "n").ok());
  EXPECT_FALSE(parse_int("", "n").ok());
  EXPECT_DOUBLE_EQ(*parse_double("2.5e3", "x"), 2500.0);
  EXPECT_FALSE(parse_double("fast", "x").ok());
}

TEST(StringsTest, ClosestMatch) {
  EXPECT_EQ(closest_match("mixtral-8x7", {"mixtral-8x7b", "dbrx", "deepseek-v3"}), "mixtral-8x7b");
  EXPECT_EQ(closest_match("zzzzzzzz", {"dbrx"}), "");
}

TEST(UnitsTest, Format) {
  EXPECT_EQ(format_bytes(1.5 * kGiB), "1.50 GiB");
  EXPECT_EQ(format_count(37.55e9), "37.55 B");
  EXPECT_EQ(format_seconds(0.0123), "12.300 ms");
}

}  // namespace
}  // namespace piper
