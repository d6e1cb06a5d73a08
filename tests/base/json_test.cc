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
