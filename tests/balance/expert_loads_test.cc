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

// A step's own loads (what a simulation of that step prices time from) replace the run's mean factors; the peak
// (its busiest step) stays.
TEST(ExpertLoadsTest, OneStepsLoadsReplaceTheMeanFactors) {
  ExpertLoads l = two_layers();  // steps 1-2: layer 1 {6, 2, 0, 0}, layer 3 {2, 2, 2, 2}
  ASSERT_TRUE(l.add_step({{1, {0, 0, 4, 4}}, {3, {0, 0, 0, 8}}}).ok());
  const RankLoads r = contiguous_rank_loads(l, 2).value();  // per step, the mean rank has 4 rows in each layer
  ASSERT_EQ(r.step_factor.size(), 3u);
  EXPECT_EQ(r.factor[0], (std::vector<double>{16.0 / 12, 8.0 / 12}));  // the run: layer 1 {16, 8} over 12
  const RankLoads first = r.at_step(0), last = r.at_step(2);
  EXPECT_EQ(first.factor[0], (std::vector<double>{2, 0}));
  EXPECT_EQ(first.factor[1], (std::vector<double>{1, 1}));
  EXPECT_EQ(last.factor[0], (std::vector<double>{0, 2}));
  EXPECT_EQ(last.factor[1], (std::vector<double>{0, 2}));
  EXPECT_DOUBLE_EQ(last.of(3, 1), 2.0);
  EXPECT_EQ(last.peak, r.peak);
  EXPECT_EQ(last.step_factor, r.step_factor);
  EXPECT_EQ(last.peak_over({1, 3}, 1), r.peak_over({1, 3}, 1));
  RankLoads no_peak = r;  // built by hand, no busiest steps: the mean factors were its peak and stay so
  no_peak.peak.clear();
  EXPECT_EQ(no_peak.at_step(2).peak, r.factor);
}

// Each ep rank's busiest step (the most rows summed over the layers) is kept per recorded ep; its peak factor is
// that step's rows over the mean rank's rows per step, and the memory load is the largest rank's mean over layers.
TEST(ExpertLoadsTest, BusiestStepsAreEachRanksMostLoadedStep) {
  ExpertLoads l = two_layers();  // steps 1-2: layer 1 {6, 2, 0, 0}, layer 3 {2, 2, 2, 2}
  ASSERT_TRUE(l.add_step({{1, {0, 0, 4, 4}}, {3, {0, 0, 0, 8}}}).ok());
  ASSERT_EQ(l.busiest.size(), 2u);  // ep 2 and 4 (the divisors of 4 from 2)
  EXPECT_EQ(l.busiest[0].ep, 2);
  EXPECT_EQ(l.busiest[1].ep, 4);
  // ep=2: rank 0 had 8 + 4 = 12 rows in steps 1 and 2 (the first kept), 0 in step 3; rank 1 4, 4, 16.
  EXPECT_EQ(l.busiest[0].ranks[0].step, 1);
  EXPECT_EQ(l.busiest[0].ranks[0].tokens, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(l.busiest[0].ranks[1].step, 3);
  EXPECT_EQ(l.busiest[0].ranks[1].tokens, (std::vector<int64_t>{8, 8}));
  // ep=4: rank 3 had 0 + 2, then 4 + 8 in step 3.
  EXPECT_EQ(l.busiest[1].ranks[3].step, 3);
  EXPECT_EQ(l.busiest[1].ranks[3].tokens, (std::vector<int64_t>{4, 8}));
  // Layer 1 routed 24 rows in 3 steps: the mean ep-2 rank 4 a step. Rank 1's mean factor (8 / 12) is 2/3, its
  // busiest step's 8 / 4 = 2; layer 3 (24 rows): rank 1 mean 16 / 12, peak 8 / 4.
  const RankLoads r2 = contiguous_rank_loads(l, 2).value();
  EXPECT_DOUBLE_EQ(r2.of(1, 1), 8.0 / 12.0);
  EXPECT_DOUBLE_EQ(r2.peak_of(1, 1), 2.0);
  EXPECT_DOUBLE_EQ(r2.peak_of(3, 1), 2.0);
  EXPECT_DOUBLE_EQ(r2.peak_of(1, 0), 2.0);  // 8 rows of layer 1 in step 1
  EXPECT_DOUBLE_EQ(r2.peak_of(3, 0), 1.0);
  EXPECT_DOUBLE_EQ(r2.peak_of(2, 0), 1.0);  // not a MoE layer of the file
  // Memory: rank 0 (2 + 1) / 2 = 1.5, rank 1 (2 + 2) / 2 = 2; time: the mean over layers of the busiest mean factor.
  EXPECT_DOUBLE_EQ(contiguous_memory_load(l, 2).value(), 2.0);
  EXPECT_DOUBLE_EQ(contiguous_memory_load(l, 1).value(), 1.0);
  EXPECT_DOUBLE_EQ(contiguous_imbalance(l, 2).value(), (16.0 / 12.0 + 16.0 / 12.0) / 2);
  // Every step is kept too (step_tokens), from which a pipeline rank's own busiest step is found: ep=2, layer 1
  // alone, rank 0 had 8, 8, 0 rows (step 1: 8 / 4 = 2); layer 3 alone, rank 0 4, 4, 0 (1.0) and rank 1 4, 4, 8
  // (2.0); both layers, rank 1's busiest is step 3 (16 rows). A layer the file does not list: 1.
  ASSERT_EQ(l.step_tokens.size(), 3u);
  EXPECT_EQ(l.step_tokens[2][1], (std::vector<int64_t>{0, 0, 0, 8}));
  EXPECT_EQ(r2.peak_over({1}, 0), (std::vector<double>{2.0}));
  EXPECT_EQ(r2.peak_over({3}, 0), (std::vector<double>{1.0}));
  EXPECT_EQ(r2.peak_over({3}, 1), (std::vector<double>{2.0}));
  EXPECT_EQ(r2.peak_over({1, 3}, 1), (std::vector<double>{2.0, 2.0}));
  EXPECT_EQ(r2.peak_over({1, 2}, 0), (std::vector<double>{2.0, 1.0}));
  // Without step_tokens (a long run's file) a rank's busiest step over every layer stands for any subset: rank 0's
  // is step 1, whose layer-3 rows give 1.0 too, and layer 1's 2.0.
  RankLoads whole = r2;
  whole.step_factor.clear();
  EXPECT_EQ(whole.peak_over({1, 3}, 0), (std::vector<double>{2.0, 1.0}));
  // The file keeps them.
  auto back = parse_expert_loads(l.to_json().dump(), "f.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->to_json(), l.to_json());
  EXPECT_DOUBLE_EQ(contiguous_memory_load(*back, 2).value(), 2.0);
}

// A version-1 file (no busiest steps) prices memory from the mean loads: each rank's mean factor, the largest
// rank's mean over layers.
TEST(ExpertLoadsTest, VersionOneFilesPriceMemoryFromTheMean) {
  const std::string v1 = R"({"format": "piper-expert-loads", "version": 1, "model": "m", "num_experts": 4, "steps": 2,
      "layers": [{"layer": 1, "tokens": [12, 4, 0, 0]}, {"layer": 3, "tokens": [4, 4, 4, 4]}]})";
  auto l = parse_expert_loads(v1, "v1.json");
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_TRUE(l->busiest.empty());
  const RankLoads r2 = contiguous_rank_loads(*l, 2).value();
  EXPECT_EQ(r2.peak, r2.factor);
  // ep=2: rank 0 {2, 1} -> 1.5, rank 1 {0, 1} -> 0.5; time 1.5 too (layer 1's 2, layer 3's 1).
  EXPECT_DOUBLE_EQ(contiguous_memory_load(*l, 2).value(), 1.5);
  // Written again it is a version-2 file with no busiest steps, which reads back the same.
  const Json j = l->to_json();
  EXPECT_EQ(j["version"], 2);
  EXPECT_TRUE(j["busiest_steps"].empty());
  EXPECT_EQ(parse_expert_loads(j.dump(), "again").value().to_json(), j);
}

// A run too long to keep every step (steps x layers x experts above kMaxStepTokens) drops step_tokens and keeps
// its busiest steps.
TEST(ExpertLoadsTest, ALongRunDropsItsStepsKeepsItsBusiest) {
  ExpertLoads l;
  l.model = "m";
  l.num_experts = 1 << 16;
  std::vector<int64_t> tokens(static_cast<size_t>(l.num_experts), 0);
  const int64_t fit = kMaxStepTokens / l.num_experts;  // 16 steps of one layer
  for (int64_t s = 0; s <= fit; ++s) {
    tokens[static_cast<size_t>(s)] = 5;
    ASSERT_TRUE(l.add_step({{0, tokens}}).ok());
    EXPECT_EQ(l.step_tokens.size(), s < fit ? static_cast<size_t>(s + 1) : 0u) << s;
  }
  EXPECT_TRUE(l.step_tokens_dropped);
  ASSERT_TRUE(l.add_step({{0, tokens}}).ok());
  EXPECT_TRUE(l.step_tokens.empty());
  EXPECT_EQ(l.busiest.back().ep, kMaxRecordedEp);
  auto back = parse_expert_loads(l.to_json().dump(), "long.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->step_tokens.empty());
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
  EXPECT_NE(error_of(head + R"("steps": 1, "layers": [{"layer": 0, "tokens": [1125899906842624, 1]}]})")
                .find("more than 2^50 routings"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("steps": 1, "stepz": 1, "layers": [{"layer": 0, "tokens": [1, 1]}]})").find("stepz"),
            std::string::npos);
  // Busiest steps: version 2 only, and each entry checked against the file.
  const std::string v2 = R"({"format": "piper-expert-loads", "version": 2, "model": "m", "num_experts": 2, )"
                         R"("steps": 2, "layers": [{"layer": 0, "tokens": [6, 2]}], "busiest_steps": )";
  auto busiest = [&](const std::string& b) { return error_of(v2 + b + "}"); };
  EXPECT_EQ(busiest(R"([{"ep": 2, "ranks": [{"step": 1, "tokens": [4]}, {"step": 2, "tokens": [1]}]}])"), "");
  EXPECT_NE(error_of(head + R"("steps": 1, "layers": [{"layer": 0, "tokens": [1, 1]}], "busiest_steps": []})")
                .find("needs version 2"),
            std::string::npos);
  EXPECT_NE(error_of(v2.substr(0, v2.size() - 19) + "}").find("version 2 lists busiest_steps"), std::string::npos);
  EXPECT_NE(busiest(R"([{"ep": 3, "ranks": []}])").find("ep"), std::string::npos);
  EXPECT_NE(busiest(R"([{"ep": 2, "ranks": [{"step": 1, "tokens": [4]}]}])").find("ranks must be an array of ep (2)"),
            std::string::npos);
  EXPECT_NE(busiest(R"([{"ep": 2, "ranks": [{"step": 3, "tokens": [4]}, {"step": 2, "tokens": [1]}]}])")
                .find("ranks[0].step"),
            std::string::npos);
  EXPECT_NE(busiest(R"([{"ep": 2, "ranks": [{"step": 1, "tokens": [4, 1]}, {"step": 2, "tokens": [1]}]}])")
                .find("each of the 1 layers"),
            std::string::npos);
  EXPECT_NE(busiest(R"([{"ep": 2, "ranks": [{"step": 1, "tokens": [9]}, {"step": 2, "tokens": [1]}]}])")
                .find("at most the layer's rows"),
            std::string::npos);
  // Rank 0 routed 6 rows in 2 steps: a busiest step of 2 is below its mean step (3).
  EXPECT_NE(busiest(R"([{"ep": 2, "ranks": [{"step": 1, "tokens": [2]}, {"step": 2, "tokens": [1]}]}])")
                .find("not its busiest step"),
            std::string::npos);
  // Step tokens: one entry per step, one row per layer, summing to the layers' tokens exactly.
  const std::string steps = R"([{"ep": 2, "ranks": [{"step": 1, "tokens": [4]}, {"step": 2, "tokens": [2]}]}], )";
  auto with_steps = [&](const std::string& t) { return busiest(steps + R"("step_tokens": )" + t); };
  EXPECT_EQ(with_steps("[[[4, 0]], [[2, 2]]]"), "");
  EXPECT_NE(with_steps("[[[4, 0]]]").find("array of steps (2)"), std::string::npos);
  EXPECT_NE(with_steps("[[[4, 0]], [[2, 1]]]").find("do not sum"), std::string::npos);
  EXPECT_NE(with_steps("[[[4, 0]], [[3, 2]]]").find("the steps summing to layers[0].tokens[0]"), std::string::npos);
  EXPECT_NE(with_steps("[[[4, 0]], [[2, 2], [0, 0]]]").find("the 1 layers' counts"), std::string::npos);
  EXPECT_NE(with_steps("[[[2, 2]], [[4, 0]]]").find("ep 2 rank 0 names step 1, but step_tokens give step 2"),
            std::string::npos);
  EXPECT_NE(error_of(head + R"("steps": 1, "layers": [{"layer": 0, "tokens": [1, 1]}], "step_tokens": [[[1, 1]]]})")
                .find("step_tokens needs version 2"),
            std::string::npos);
  // Every message says where such a file comes from.
  EXPECT_NE(error_of("[]").find("--record-expert-loads"), std::string::npos);
}

}  // namespace
}  // namespace piper::balance
