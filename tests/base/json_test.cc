#include "piper/base/json.h"

#include <gtest/gtest.h>

namespace piper {
namespace {

TEST(JsonTest, MalformedReportsPosition) {
  auto r = parse_json("{\n  \"a\": 1,\n  \"b\": ]\n}", "test.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("test.json: malformed JSON at line 3"), std::string::npos)
      << r.status().message();
}

// A number no double holds is an error naming the number and its position, not an exception (issue 28: found
// by the fuzz targets in every JSON input, e.g. fuzz/corpus/cluster_json/crash-number-overflow).
TEST(JsonTest, NumberTooLargeForADoubleIsAnError) {
  auto r = parse_json("{\"dp\": 2,\n \"tp\": 1e400}", "s.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("s.json: the number 1e400 at line 2, column 8 (byte 17) does not fit a double"),
            std::string::npos)
      << r.status().message();
  r = parse_json("[-134E400000000]", "x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("-134E400000000 at line 1, column 2 (byte 1)"), std::string::npos)
      << r.status().message();
  EXPECT_TRUE(parse_json("[1e308, -1e-400]", "x").ok());  // the largest finite and an underflow to 0 are fine
}

// Integers written as floats or above INT64_MAX are range errors, never a wrapped or undefined conversion.
TEST(JsonTest, IntegerOutsideInt64IsOutOfRange) {
  Json j = Json::parse(R"({"big": 1e300, "huge": 18446744073709551615, "whole": 64.0, "neg": -9.3e18})");
  JsonReader reader(j, "m");
  int64_t v = 0;
  Status s = reader.get_int("big", &v, true);
  EXPECT_NE(s.message().find("m.big: 1e+300 is out of range"), std::string::npos) << s.message();
  s = reader.get_int("huge", &v, true);
  EXPECT_NE(s.message().find("m.huge: 18446744073709551615 is out of range"), std::string::npos) << s.message();
  s = reader.get_int("neg", &v, true);
  EXPECT_FALSE(s.ok());
  ASSERT_TRUE(reader.get_int("whole", &v, true).ok());
  EXPECT_EQ(v, 64);
}

TEST(JsonTest, ReaderFieldErrors) {
  Json j = Json::parse(R"({"n": -3, "s": 5, "e": "relu", "extra": 1, "f": 2.5})");
  JsonReader reader(j, "model");
  int n = 0;
  Status s = reader.get_int("n", &n, true, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.n: -3 is out of range"), std::string::npos) << s.message();
  std::string str;
  s = reader.get_string("s", &str, true);
  EXPECT_NE(s.message().find("model.s: expected a string"), std::string::npos) << s.message();
  std::string act = "gelu";
  s = reader.get_enum("e", &act, {"gelu", "swiglu"}, true);
  EXPECT_NE(s.message().find("pick one of {gelu, swiglu}"), std::string::npos) << s.message();
  s = reader.get_int("missing", &n, true);
  EXPECT_NE(s.message().find("model.missing: required field is missing"), std::string::npos);
  int f = 0;
  EXPECT_FALSE(reader.get_int("f", &f, true).ok());
  s = reader.check_no_unknown_keys();
  EXPECT_NE(s.message().find("model.extra"), std::string::npos) << s.message();
}

TEST(JsonTest, OptionalKeepsDefault) {
  Json j = Json::parse(R"({"a": 7})");
  JsonReader reader(j, "");
  int a = 1, b = 2;
  ASSERT_TRUE(reader.get_int("a", &a, false).ok());
  ASSERT_TRUE(reader.get_int("b", &b, false).ok());
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, 2);
  EXPECT_TRUE(reader.check_no_unknown_keys().ok());
}

TEST(JsonTest, MissingFile) {
  auto r = load_json_file("/nonexistent/piper.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/piper.json"), std::string::npos);
}

}  // namespace
}  // namespace piper
