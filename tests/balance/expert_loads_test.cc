// Measured expert loads (balance/expert_loads.h): the file train --record-expert-loads writes and estimate/simulate
// --expert-loads read, and the imbalance they price.
#include "piper/balance/expert_loads.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace piper::balance {
namespace {

ExpertLoads two_layers() {
  ExpertLoads l;
  l.model = "tiny-moe";
  l.num_experts = 4;
  EXPECT_TRUE(l.add_step({{1, {6, 2, 0, 0}}, {3, {2, 2, 2, 2}}}).ok());
  EXPECT_TRUE(l.add_step({{1, {6, 2, 0, 0}}, {3, {2, 2, 2, 2}}}).ok());
  return l;
}

TEST(ExpertLoadsTest, StepsAddUpPerLogicalExpert) {
  const ExpertLoads l = two_layers();
  EXPECT_EQ(l.steps, 2);
  ASSERT_EQ(l.layers.size(), 2u);
  EXPECT_EQ(l.layers[0].layer, 1);
  EXPECT_EQ(l.layers[0].tokens, (std::vector<int64_t>{12, 4, 0, 0}));
  ExpertLoads copy = l;
  EXPECT_FALSE(copy.add_step({{1, {1, 1, 1, 1}}}).ok());             // a layer missing
  EXPECT_FALSE(copy.add_step({{1, {1, 1, 1}}, {3, {1, 1, 1, 1}}}).ok());  // an expert missing
}

TEST(ExpertLoadsTest, ContiguousImbalanceIsTheMeanOverLayersOfBusiestOverMean) {
  const ExpertLoads l = two_layers();
  // ep=2: layer 1 ranks {16, 0} -> 2.0; layer 3 ranks {8, 8} -> 1.0; mean 1.5.
  EXPECT_DOUBLE_EQ(contiguous_imbalance(l, 2).value(), 1.5);
  // ep=4: layer 1 {12, 4, 0, 0} -> 12 / 4 = 3; layer 3 -> 1; mean 2.
  EXPECT_DOUBLE_EQ(contiguous_imbalance(l, 4).value(), 2.0);
  EXPECT_DOUBLE_EQ(contiguous_imbalance(l, 1).value(), 1.0);
  auto bad = contiguous_imbalance(l, 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ep=3 does not divide"), std::string::npos) << bad.status().message();
}

TEST(ExpertLoadsTest, RankLoadsAreEachRanksShareOverTheMeanRank) {
  ExpertLoads l = two_layers();
  ASSERT_TRUE(l.add_step({{1, {0, 0, 0, 0}}, {3, {0, 0, 0, 0}}}).ok());
  // ep=2: layer 1 ranks {16, 0} over the mean 8 -> {2, 0}; layer 3 {8, 8} -> {1, 1}.
  const RankLoads r2 = contiguous_rank_loads(l, 2).value();
  EXPECT_EQ(r2.layers, (std::vector<int>{1, 3}));
  EXPECT_DOUBLE_EQ(r2.of(1, 0), 2.0);
  EXPECT_DOUBLE_EQ(r2.of(1, 1), 0.0);
  EXPECT_DOUBLE_EQ(r2.of(3, 1), 1.0);
  EXPECT_DOUBLE_EQ(r2.busiest(1), 2.0);
  EXPECT_DOUBLE_EQ(r2.of(2, 1), 1.0);  // not a MoE layer of the file: balanced
  EXPECT_DOUBLE_EQ(r2.busiest(0), 1.0);
  // ep=4: layer 1 {12, 4, 0, 0} over 4 -> {3, 1, 0, 0}; the factors of a layer average 1.
  const RankLoads r4 = contiguous_rank_loads(l, 4).value();
  EXPECT_EQ(r4.factor[0], (std::vector<double>{3, 1, 0, 0}));
  EXPECT_EQ(r4.factor[1], (std::vector<double>{1, 1, 1, 1}));
  // A layer that routed nothing is priced as balanced.
  ExpertLoads empty_layer;
  empty_layer.model = "m";
  empty_layer.num_experts = 2;
  ASSERT_TRUE(empty_layer.add_step({{1, {0, 0}}, {2, {3, 1}}}).ok());
  const RankLoads e = contiguous_rank_loads(empty_layer, 2).value();
  EXPECT_EQ(e.factor[0], (std::vector<double>{1, 1}));
  EXPECT_EQ(e.factor[1], (std::vector<double>{1.5, 0.5}));
  EXPECT_DOUBLE_EQ(contiguous_imbalance(empty_layer, 2).value(), 1.5);  // the empty layer does not count
  EXPECT_FALSE(contiguous_rank_loads(l, 3).ok());
  EXPECT_FALSE(contiguous_rank_loads(l, 0).ok());
}

TEST(ExpertLoadsTest, WrittenFileReadsBackTheSame) {
  const ExpertLoads l = two_layers();
  const std::string path = ::testing::TempDir() + "/piper_expert_loads_test.json";
  ASSERT_TRUE(save_expert_loads(path, l).ok());
  auto back = load_expert_loads(path);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->to_json(), l.to_json());
  std::remove(path.c_str());
}

std::string error_of(const std::string& text) {
  auto r = parse_expert_loads(text, "f.json");
  return r.ok() ? "" : r.status().message();
}

TEST(ExpertLoadsTest, BadFilesAreNamed) {
  const std::string head = R"({"format": "piper-expert-loads", "version": 1, "model": "m", "num_experts": 2, )";
  EXPECT_NE(error_of(R"({"format": "x", "version": 1})").find("format is 'x'"), std::string::npos);
  EXPECT_NE(error_of(head + R"("steps": 1, "layers": [{"layer": 0, "tokens": [1]}]})").find("num_experts (2)"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("steps": 1, "layers": [{"layer": 0, "tokens": [1, -1]}]})").find("tokens[1]"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("steps": 1, "layers": [{"layer": 2, "tokens": [1, 1]}, {"layer": 1, "tokens": [1, 1]}]})")
                .find("increasing layer order"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("steps": 1, "layers": [{"layer": 0, "tokens": [0, 0]}]})").find("every token count is 0"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("steps": 0, "layers": [{"layer": 0, "tokens": [1, 1]}]})").find("steps"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("steps": 1, "layers": []})").find("layers must be"), std::string::npos);
  EXPECT_NE(error_of(head + R"("steps": 1, "stepz": 1, "layers": [{"layer": 0, "tokens": [1, 1]}]})").find("stepz"),
            std::string::npos);
  // Every message says where such a file comes from.
  EXPECT_NE(error_of("[]").find("--record-expert-loads"), std::string::npos);
}

}  // namespace
}  // namespace piper::balance
