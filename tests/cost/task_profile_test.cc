// Task profiles in a calibration file (Calibration::task_profiles, cost/task_profile.h): what the file must hold,
// and how the measured / priced ratios scale the closed form's and the simulator's task prices.
#include "piper/cost/task_profile.h"

#include <gtest/gtest.h>

#include <cmath>

#include "piper/cost/estimate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/counting.h"
#include "piper/spec/model_loader.h"

namespace piper::cost {
namespace {

Json point(int threads, double tokens, const std::string& task, double measured, double priced) {
  return Json{{"threads", threads}, {"tokens", tokens},        {"task", task},
              {"calls", 4},         {"measured_s", measured}, {"priced_s", priced}};
}

Json profile(const ModelSpec& m, int64_t seq, Json points) {
  return Json{{"model", m.name}, {"parameters", count_params(m).total()}, {"seq", seq}, {"points", std::move(points)}};
}

ModelSpec tiny() { return load_model("tiny-moe").value(); }

Calibration with_profile(Json points, int threads = 1, int64_t seq = 128) {
  Json file{{"task_profiles", Json::array({profile(tiny(), seq, std::move(points))})}};
  Result<Calibration> c = Calibration::from_json(file, "cal.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  Calibration out = c.ok() ? *c : Calibration{};
  out.rank_threads = threads;
  return out;
}

TEST(TaskProfileTest, ScalesEachTaskByItsMeasuredOverPricedInterpolatedInLogTokens) {
  const Calibration c = with_profile(Json::array({point(1, 128, "attn.F", 3, 2), point(1, 512, "attn.F", 2, 1),
                                                  point(1, 128, "experts.BW", 1.2, 1), point(1, 128, "update", 5, 1),
                                                  point(2, 128, "attn.F", 9, 1)}));
  const ModelSpec m = tiny();
  const TaskProfileTable table = TaskProfileTable::find(c, m, 128);
  ASSERT_TRUE(table.applies());
  const TaskScales at128 = table.at(128);
  EXPECT_DOUBLE_EQ(at128.of(Part::kAttention, 0), 1.5);
  EXPECT_DOUBLE_EQ(at128.of(Part::kAttentionCore, 0), 1.5);  // the attention chunk's pieces take its scale
  EXPECT_DOUBLE_EQ(at128.of(Part::kNorms, 0), 1.5);
  EXPECT_DOUBLE_EQ(at128.of(Part::kAttention, 1), 1.0);  // no attn.B, attn.BW: unmeasured keeps its price
  EXPECT_DOUBLE_EQ(at128.of(Part::kExperts, 1), 1.2);    // B and W take the fused BW's
  EXPECT_DOUBLE_EQ(at128.of(Part::kExperts, 2), 1.2);
  EXPECT_DOUBLE_EQ(at128.update, 5);
  // Halfway in log tokens between 128 and 512; held at the ends outside them.
  EXPECT_NEAR(table.at(256).of(Part::kAttention, 0), 1.75, 1e-12);
  EXPECT_DOUBLE_EQ(table.at(64).of(Part::kAttention, 0), 1.5);
  EXPECT_DOUBLE_EQ(table.at(4096).of(Part::kAttention, 0), 2.0);
  EXPECT_DOUBLE_EQ(TaskProfileTable{}.at(128).of(Part::kAttention, 0), 1.0);  // none: the price
}

TEST(TaskProfileTest, AppliesOnlyToItsModelSeqAndThreadCount) {
  const Json points = Json::array({point(1, 128, "attn.F", 3, 1)});
  const ModelSpec m = tiny();
  EXPECT_TRUE(TaskProfileTable::find(with_profile(points), m, 128).applies());
  EXPECT_FALSE(TaskProfileTable::find(with_profile(points, 2), m, 128).applies());  // no points at 2 threads
  EXPECT_FALSE(TaskProfileTable::find(with_profile(points, 0), m, 128).applies());  // thread count unknown
  EXPECT_FALSE(TaskProfileTable::find(with_profile(points), m, 256).applies());     // another seq
  ModelSpec edited = m;
  edited.hidden_size = 256;  // same name, another model: its parameter count differs
  EXPECT_FALSE(TaskProfileTable::find(with_profile(points), edited, 128).applies());
  EXPECT_NE(task_profile_note(with_profile(points), edited, 128).find("another parameter count"), std::string::npos);
  EXPECT_NE(task_profile_note(with_profile(points), m, 256).find("piper calibrate --model tiny-moe --seq 256"),
            std::string::npos);
  EXPECT_NE(task_profile_note(with_profile(points, 0), m, 128).find("runs priced per thread count"),
            std::string::npos);
  EXPECT_NE(task_profile_note(with_profile(points, 2), m, 128).find("no points at 2 thread"), std::string::npos);
  EXPECT_NE(task_profile_note(with_profile(points), m, 128).find("scaled by the measured task profile"),
            std::string::npos);
  EXPECT_EQ(task_profile_note(Calibration{}, m, 128), "");
}

TEST(TaskProfileTest, RefusesMalformedProfiles) {
  const ModelSpec m = tiny();
  auto refused = [&](Json points, const std::string& needle) {
    Json file{{"task_profiles", Json::array({profile(m, 128, std::move(points))})}};
    Result<Calibration> c = Calibration::from_json(file, "cal.json");
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
  };
  refused(Json::array({point(1, 128, "attention.F", 1, 1)}), "is not a task key");
  refused(Json::array({point(1, 128, "attn.U", 1, 1)}), "is not a task key");
  refused(Json::array({point(1, 128, "attn.F", 1, 1), point(1, 128, "attn.F", 2, 1)}), "a second point");
  refused(Json::array({point(1, 128, "attn.F", 0, 1)}), "measured_s");
  refused(Json::array({point(1, 128, "attn.F", 21, 1)}), "a disturbed measurement");
  refused(Json::array({point(1, 128, "attn.F", 1, 21)}), "a disturbed measurement");
  refused(Json::array(), "non-empty array");
  Json two{{"task_profiles", Json::array({profile(m, 128, Json::array({point(1, 128, "attn.F", 1, 1)})),
                                          profile(m, 128, Json::array({point(1, 128, "attn.F", 1, 1)}))})}};
  EXPECT_FALSE(Calibration::from_json(two, "cal.json").ok());
}

// A profile's own core sharing (measured with the model's steps) replaces the calibration's GEMM figure for a run of
// that model only, reaches the static share that prices its tasks, and is named in the report's note; a list out of
// order is refused.
TEST(TaskProfileTest, TheModelsOwnSharingReplacesTheGemmsForItsRuns) {
  const ModelSpec m = tiny();
  Json entry = profile(m, 128, Json::array({point(1, 128, "attn.F", 1, 1)}));
  entry["sharing"] = Json::array({Json{{"ranks", 2}, {"efficiency", 0.95}}, Json{{"ranks", 3}, {"efficiency", 0.8}}});
  Json file{{"task_profiles", Json::array({entry})},
            {"core_sharing", Json::array({Json{{"ranks", 2}, {"efficiency", 1.0}}})}};
  Result<Calibration> c = Calibration::from_json(file, "cal.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->task_profiles[0].sharing, (std::vector<double>{0.95, 0.8}));
  Calibration other = *c;
  ModelSpec edited = m;
  edited.hidden_size = 256;
  EXPECT_FALSE(apply_model_sharing(&other, edited, 128));  // another model: the GEMM's stays
  EXPECT_FALSE(apply_model_sharing(&other, m, 256));       // another seq
  EXPECT_EQ(other.core_sharing, std::vector<double>{1.0});
  Calibration own = *c;
  own.rank_threads = 1;
  ASSERT_TRUE(apply_model_sharing(&own, m, 128));
  EXPECT_EQ(own.core_sharing, (std::vector<double>{0.95, 0.8}));
  EXPECT_DOUBLE_EQ(own.sharing_efficiency(4), 0.8);  // the last entry beyond
  EXPECT_NE(task_profile_note(own, m, 128).find("core sharing of its own steps 0.95, 0.80 at 2..3 ranks"),
            std::string::npos)
      << task_profile_note(own, m, 128);
  // 4 ranks on 2 cores: each task is priced at its share of the cores times the sharing, so the model's own 0.8
  // prices the closed form's compute 1 / 0.8 of the GEMM's 1.0 (every other figure alike).
  ClusterSpec cluster = load_cluster("local-cpu", 1).value();
  cluster.node.devices_per_node = 4;
  cluster.node.shared_cores = 2;
  TrainSpec train;
  train.global_batch = 16;
  train.seq_len = 128;
  train.micro_batch_size = 1;
  auto compute = [&](const Calibration& cal) {
    CostModel cm = CostModel::create(m, cluster, train, cal).value();
    return cm.estimate(Strategy::parse("dp=4,microbatches=4").value()).value().time.compute_s;
  };
  // The calibration with the GEMM's figure against the same after apply_model_sharing with the model's own.
  Calibration gemm = *c, mine = *c;
  gemm.core_sharing = {1.0, 1.0, 1.0};
  mine.core_sharing = gemm.core_sharing;
  mine.task_profiles[0].sharing = {1.0, 1.0, 0.8};
  ASSERT_TRUE(apply_model_sharing(&mine, m, 128));
  EXPECT_NEAR(compute(mine) / compute(gemm), 1 / 0.8, 1e-9);
  entry["sharing"] = Json::array({Json{{"ranks", 3}, {"efficiency", 0.9}}});
  EXPECT_FALSE(Calibration::from_json(Json{{"task_profiles", Json::array({entry})}}, "cal.json").ok());
}

// The closed form prices a profiled task at its scale: every F, B and W of the model at 2x makes the compute 2x
// (tiny-moe has no shared experts: their absent part costs nothing, so needs no point).
TEST(TaskProfileTest, ClosedFormComputeFollowsTheScales) {
  const ModelSpec m = tiny();
  Json points = Json::array();
  for (const char* key : {"embed.F", "embed.BW", "attn.F", "attn.BW", "router.F", "router.BW", "experts.F",
                          "experts.BW", "mlp.F", "mlp.BW", "head.F", "head.BW"}) {
    points.push_back(point(1, 256, key, 2, 1));
  }
  points.push_back(point(1, 256, "update", 3, 1));
  const Calibration scaled = with_profile(points);
  Calibration plain;
  plain.rank_threads = 1;
  auto cluster = load_cluster("local-cpu", 1);
  ASSERT_TRUE(cluster.ok());
  TrainSpec t;
  t.seq_len = 128;
  t.micro_batch_size = 2;
  const Strategy s = Strategy::parse("dp=2,microbatches=2,mbs=2").value();
  const Estimate a = CostModel::create(m, *cluster, t, plain).value().estimate(s).value();
  const Estimate b = CostModel::create(m, *cluster, t, scaled).value().estimate(s).value();
  EXPECT_NEAR(b.time.compute_s / a.time.compute_s, 2.0, 1e-9);
  EXPECT_NEAR(b.time.optimizer_s / a.time.optimizer_s, 3.0, 1e-9);
}

// A model without shared experts has no such part: nothing to compute, nothing to read or write.
TEST(TaskProfileTest, AbsentSharedExpertsCostNothing) {
  const ModelSpec m = tiny();
  ASSERT_EQ(m.moe.num_shared_experts, 0);
  PartShape shape;
  shape.tokens = 256;
  const PartCost c = part_cost(make_part_table(m, 128), Part::kSharedExperts, shape);
  for (const TaskCost* k : {&c.f, &c.b, &c.w}) {
    EXPECT_EQ(k->flops, 0);
    EXPECT_EQ(k->bytes, 0);
    EXPECT_EQ(k->pointwise_bytes, 0);
  }
}

}  // namespace
}  // namespace piper::cost
