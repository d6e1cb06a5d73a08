#include "piper/ir/directive.h"

#include <gtest/gtest.h>

namespace piper::ir {
namespace {

std::string error_of(const std::string& text) {
  auto j = parse_json(text, "d.json");
  if (!j.ok()) return j.status().message();
  auto d = directives_from_json(*j, "d.json");
  return d.ok() ? "" : d.status().message();
}

TEST(DirectiveTest, RoundTripsEveryKind) {
  std::string text = R"({"directives": [
    {"directive": "split", "microbatches": 4},
    {"directive": "place", "filter": {"layer": "0-3"}, "stage": 0},
    {"directive": "place", "filter": {"stage": 0}, "rank": 0},
    {"directive": "order", "rank": 0, "stream": "compute", "slots": ["0F0", ["0F1", "0BW0"], {"stage": 0, "pass": "B"}]},
    {"directive": "stream", "filter": {"pass": "W"}, "stream": "wgrad"},
    {"directive": "recompute", "filter": {"part": "attn"}},
    {"directive": "recompute", "filter": {"pass": "F"}, "modules": "layernorm+moe_act"}]})";
  auto d = directives_from_json(Json::parse(text), "t");
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_EQ(d->size(), 7u);
  EXPECT_EQ(std::get<RecomputeDirective>((*d)[6].body).modules, (std::vector<std::string>{"layernorm", "moe_act"}));
  const auto& order = std::get<OrderDirective>((*d)[3].body);
  ASSERT_EQ(order.slots.size(), 3u);
  EXPECT_EQ(order.slots[1].size(), 2u);
  EXPECT_EQ(order.slots[1][1].pass, Pass::kBW);
  EXPECT_EQ(order.slots[2][0].pass, Pass::kB);
  auto again = directives_from_json(directives_to_json(*d), "t2");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(directives_to_json(*again), directives_to_json(*d));
}

TEST(DirectiveTest, MalformedFilesNameTheDirective) {
  EXPECT_NE(error_of("[{\"directive\": \"split\"}").find("malformed JSON"), std::string::npos);
  std::string e = error_of(R"([{"directive": "split", "microbatches": 2}, {"directive": "plce", "filter": {}}])");
  EXPECT_NE(e.find("directive 1 (plce)"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'place'"), std::string::npos) << e;
  e = error_of(R"([{"directive": "place", "filter": {"stage": 0}}])");
  EXPECT_NE(e.find("directive 0 (place)"), std::string::npos) << e;
  EXPECT_NE(e.find("needs \"stage\""), std::string::npos) << e;
  e = error_of(R"([{"directive": "order", "rank": 0, "slots": ["0X1"]}])");
  EXPECT_NE(e.find("slots[0]"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown pass 'X'"), std::string::npos) << e;
  e = error_of(R"([{"directive": "order", "rank": 0, "slots": ["F"]}])");
  EXPECT_NE(e.find("not an action"), std::string::npos) << e;
  e = error_of(R"([{"directive": "order", "rank": 0, "slots": [{"stage": "3-1"}]}])");
  EXPECT_NE(e.find("is empty"), std::string::npos) << e;
  e = error_of(R"([{"directive": "split", "microbatches": 2, "micro": 1}])");
  EXPECT_NE(e.find("unknown field(s): micro"), std::string::npos) << e;
  e = error_of(R"([{"directive": "recompute", "filter": {"pass": "F"}, "modules": "core_attn"}])");
  EXPECT_NE(e.find("unknown module 'core_attn'"), std::string::npos) << e;
  e = error_of(R"({"stuff": []})");
  EXPECT_NE(e.find("expected a list of directives"), std::string::npos) << e;
}

TEST(DirectiveTest, FilterMatching) {
  auto f = TagFilter::from_json(Json::parse(R"({"layer": "2-4", "pass": "F", "part": "attn"})"), "f");
  ASSERT_TRUE(f.ok());
  Tags t{3, "attn", 0, Pass::kF, -1};
  EXPECT_TRUE(f->matches(t));
  t.layer = 5;
  EXPECT_FALSE(f->matches(t));
  t = Tags{3, "experts", 0, Pass::kF, -1};
  EXPECT_FALSE(f->matches(t));
  TagFilter mb_only;
  mb_only.mb = IntRange::single(0);
  EXPECT_FALSE(mb_only.matches(Tags{3, "attn", -1, Pass::kU, -1}));  // a node without an mb tag
}

}  // namespace
}  // namespace piper::ir

namespace piper::ir {
namespace {

// A split of 10^8 microbatches threw std::bad_alloc while cloning the graph.
TEST(DirectiveBoundsTest, SplitMicrobatchesHaveAnUpperBound) {
  const std::string e = error_of(R"([{"directive": "split", "microbatches": 100000000}])");
  EXPECT_NE(e.find("microbatches: 100000000 is out of range; allowed [1, 65536]"), std::string::npos) << e;
  EXPECT_EQ(error_of(R"([{"directive": "split", "microbatches": 65536}])"), "");
}

TEST(DirectiveBoundsTest, HugeIndicesAreRefusedNotWrapped) {
  std::string e = error_of(R"([{"directive": "place", "filter": {"layer": 4294967296}, "stage": 0}])");
  EXPECT_NE(e.find("4294967296 is out of range; allowed 0..16777216"), std::string::npos) << e;
  e = error_of(R"([{"directive": "place", "filter": {"layer": "0-4294967296"}, "stage": 0}])");
  EXPECT_NE(e.find("is out of range; allowed 0..16777216"), std::string::npos) << e;
  // std::stoi threw std::out_of_range on these.
  e = error_of(R"([{"directive": "order", "rank": 0, "slots": ["99999999999F0"]}])");
  EXPECT_NE(e.find("'99999999999F0' names a stage or microbatch above 9999999"), std::string::npos) << e;
  e = error_of(R"([{"directive": "order", "rank": 0, "slots": ["0F99999999999"]}])");
  EXPECT_NE(e.find("above 9999999"), std::string::npos) << e;
  e = error_of(R"([{"directive": "place", "filter": {}, "rank": 4294967296}])");
  EXPECT_NE(e.find("rank: 4294967296 is out of range"), std::string::npos) << e;
}

}  // namespace
}  // namespace piper::ir
