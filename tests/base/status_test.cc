#include "piper/base/status.h"

#include <gtest/gtest.h>

#include "piper/base/check.h"

namespace piper {
namespace {

Result<int> half(int x) {
  if (x % 2 != 0) return invalid_argument("x=" + std::to_string(x) + " is odd; pass an even number");
  return x / 2;
}

Result<int> quarter(int x) {
  PIPER_ASSIGN_OR_RETURN(int h, half(x));
  PIPER_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

Status check_positive(int x) {
  if (x <= 0) return out_of_range("x must be positive");
  return ok_status();
}

Status check_both(int a, int b) {
  PIPER_RETURN_IF_ERROR(check_positive(a));
  PIPER_RETURN_IF_ERROR(check_positive(b));
  return ok_status();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(ok_status().ok());
  Status s = invalid_argument("bad");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "INVALID_ARGUMENT: bad");
  EXPECT_EQ(s.with_context("model").message(), "model: bad");
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(*quarter(8), 2);
  auto r = quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x=3 is odd"), std::string::npos);
}

TEST(StatusTest, ReturnIfError) {
  EXPECT_TRUE(check_both(1, 2).ok());
  EXPECT_EQ(check_both(1, -2).code(), StatusCode::kOutOfRange);
}

TEST(StatusDeathTest, CheckAbortsWithLocation) {
  EXPECT_DEATH(PIPER_CHECK(1 + 1 == 3, "math is broken: ", 42), "CHECK failed at .*status_test.cc.*math is broken: 42");
  Result<int> r = invalid_argument("nope");
  EXPECT_DEATH((void)r.value(), "nope");
}

}  // namespace
}  // namespace piper
