// End-to-end: the piper binary's `simulate` command.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "piper/base/json.h"

namespace {

std::string run(const std::string& args, int* rc) {
  std::string cmd = std::string(PIPER_BIN_PATH) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  *rc = pclose(f);
  return out;
}

TEST(CliSimulateTest, JsonHasTheDocumentedKeys) {
  int rc = 0;
  const std::string trace = std::string(PIPER_BINARY_DIR) + "/cli_simulate_test_trace.json";
  std::string out = run("simulate --model tiny-moe --cluster dgx-h100 --nodes 1 --seq 128 --strategy "
                        "dp=4,ep=4,pp=2,zero=1,microbatches=4 --json --trace " + trace, &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = piper::Json::parse(out);
  for (const char* key : {"step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "exposed_comm_fraction"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_GT(j[key].get<double>(), 0.0) << key;
  }
  ASSERT_EQ(j["peak_memory_bytes"]["per_rank"].size(), 2u);
  EXPECT_EQ(j["peak_memory_bytes"]["max"], std::max(j["peak_memory_bytes"]["per_rank"][0].get<int64_t>(),
                                                    j["peak_memory_bytes"]["per_rank"][1].get<int64_t>()));
  EXPECT_NEAR(j["tokens_per_s"].get<double>() * j["step_time_s"].get<double>(), 16.0 * 128, 1e-6);
  FILE* f = std::fopen(trace.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
}

// --expert-zipf: the step under Zipf-skewed expert loads, contiguous vs after the migration planner's moves.
// Skewed loads slow the step; migration lowers the imbalance and wins back time net of its own cost.
TEST(CliSimulateTest, ExpertZipfComparesStepTimeWithAndWithoutMigration) {
  int rc = 0;
  std::string out =
      run("simulate --model deepseek-moe-16b --cluster dgx-h100 --nodes 1 --seq 4096 --strategy "
          "dp=8,ep=8,zero=1,microbatches=4,mbs=1 --expert-zipf 1.0 --json",
          &rc);
  ASSERT_EQ(rc, 0) << out;
  const piper::Json b = piper::Json::parse(out)["expert_balance"];
  EXPECT_EQ(b["ep"], 8);
  EXPECT_EQ(b["window_steps"], 10);
  EXPECT_GT(b["imbalance_contiguous"].get<double>(), 2.0);
  EXPECT_LT(b["imbalance_migrated"].get<double>(), b["imbalance_contiguous"].get<double>());
  EXPECT_GT(b["experts_moved_per_layer"].get<int>(), 0);
  EXPECT_GT(b["migration_cost_s"].get<double>(), 0.0);
  const double balanced = b["step_time_balanced_s"].get<double>();
  const double without = b["step_time_without_migration_s"].get<double>();
  const double with = b["step_time_with_migration_s"].get<double>();
  EXPECT_GT(without, balanced);
  EXPECT_LT(with, without);
  EXPECT_GE(with, balanced);
  out =
      run("simulate --model tiny-moe --cluster dgx-h100 --nodes 1 --strategy dp=8,microbatches=1 --expert-zipf 1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("ep=1"), std::string::npos) << out;
}

TEST(CliSimulateTest, BadInputsExitNonZeroWithAHint) {
  int rc = 0;
  std::string out = run("simulate --model tiny-moe --cluster dgx-h100 --nodes 1 --strategy dp=4,pp=4", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("microbatches"), std::string::npos) << out;
  out = run("simulate --model tiny-moe --cluster dgx-h100 --nodes 2 --strategy dp=8,microbatches=1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("16"), std::string::npos) << out;
}

}  // namespace

namespace {

double json_step(const std::string& out) { return piper::Json::parse(out)["step_time_s"].get<double>(); }

// --comm-calibration (written by `piper bench comm --calibration-out`) replaces the preset's link figures in
// estimate, simulate and plan alike: a 1000x slower intra-node link makes the DP all-reduce dominate.
TEST(CliSimulateTest, CommCalibrationFileSlowsTheLinks) {
  const std::string cal = std::string(PIPER_BINARY_DIR) + "/cli_simulate_test_comm_cal.json";
  FILE* f = std::fopen(cal.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(R"({"source": "test", "node": {"intra": {"latency_s": 1e-3, "bw_bytes_per_s": 3e6}}})", f);
  std::fclose(f);
  const std::string scenario =
      "--model tiny-moe --cluster local-cpu --nodes 1 --seq 128 --strategy dp=2,zero=1,microbatches=1,mbs=4 --json";
  for (const char* cmd : {"simulate", "estimate"}) {
    int rc = 0;
    std::string base = run(std::string(cmd) + " " + scenario, &rc);
    ASSERT_EQ(rc, 0) << base;
    std::string slow = run(std::string(cmd) + " " + scenario + " --comm-calibration " + cal, &rc);
    ASSERT_EQ(rc, 0) << slow;
    EXPECT_GT(json_step(slow), 10 * json_step(base)) << cmd;
  }
  int rc = 0;
  std::string plan = run("plan --model tiny-moe --cluster local-cpu --nodes 1 --global-batch 8 --seq 128 --top 1 "
                         "--simulate-top 1 --local-search 0 --json --comm-calibration " + cal, &rc);
  ASSERT_EQ(rc, 0) << plan;
  auto j = piper::Json::parse(plan);
  EXPECT_EQ(j["simulated"].get<int64_t>(), 1);
  EXPECT_TRUE(j["plans"][0]["simulated"].get<bool>());
  std::string bad = run("simulate " + scenario + " --comm-calibration /nonexistent/comm.json", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(bad.find("/nonexistent/comm.json"), std::string::npos) << bad;
}

// A cluster file whose node shares its cores among CPU ranks (node.shared_cores: 4 ranks of one core on 2 cores,
// as `piper train --ranks 4` on the build machine): `--full` shares the cores among the ranks computing at each
// moment, so a pipeline, whose ranks wait in bubbles, runs faster than at the static share that representative
// ranks and the closed form price; data parallelism, whose ranks compute together, gains nothing and pays the
// copies of its transfers' bytes on the shared cores (5.5 % when written) and, since session 35, the copies that
// stage its collectives (12 % in all).
TEST(CliSimulateTest, SharedCoresSpeedUpAPipelineWhenEveryRankIsSimulated) {
  const std::string path = std::string(PIPER_BINARY_DIR) + "/cli_simulate_test_shared_cores.json";
  int rc = 0;
  piper::Json c = piper::Json::parse(run("info --cluster local-cpu --json", &rc))["cluster"];
  ASSERT_EQ(rc, 0);
  for (const char* derived : {"domain", "num_nodes", "world_size"}) c.erase(derived);  // info's, not the file's
  c["name"] = "cpu-shared";
  c["node"]["devices_per_node"] = 4;
  c["node"]["shared_cores"] = 2;
  c["node"]["device_cores"] = 1;
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(c.dump().c_str(), f);
  std::fclose(f);
  const std::string scenario = "simulate --model tiny-moe --cluster " + path + " --nodes 1 --seq 128 --json";
  auto step = [&](const std::string& strategy, bool full) {
    std::string out = run(scenario + " --strategy " + strategy + (full ? " --full" : ""), &rc);
    EXPECT_EQ(rc, 0) << out;
    auto j = piper::Json::parse(out);
    EXPECT_EQ(j["representative"].get<bool>(), !full);
    return j["step_time_s"].get<double>();
  };
  const std::string pipeline = "pp=4,schedule=1f1b,microbatches=8,mbs=2";
  EXPECT_LT(step(pipeline, true), 0.85 * step(pipeline, false));
  const std::string data_parallel = "dp=4,zero=1,microbatches=1,mbs=4";
  EXPECT_GT(step(data_parallel, true), step(data_parallel, false));
  EXPECT_LT(step(data_parallel, true), 1.2 * step(data_parallel, false));
}

}  // namespace

namespace {

// DualPipeV's F&B pairs are interleaved by default (lower.h); --no-interleave-overlap runs each pair F then B,
// which leaves the EP all-to-alls exposed (docs/simulator.md,
// PlanExecTest.DualPipeVHidesExpertAllToAllWhere1F1BExposesIt).
TEST(CliSimulateTest, InterleaveOverlapIsTheDefaultAndCanBeTurnedOff) {
  const std::string base =
      "simulate --model deepseek-v3 --cluster h800 --nodes 4 --seq 4096 --strategy "
      "dp=16,ep=16,pp=2,schedule=dualpipev,microbatches=4 --json";
  int rc = 0;
  const std::string by_default = run(base, &rc);
  ASSERT_EQ(rc, 0) << by_default;
  const std::string on = run(base + " --interleave-overlap", &rc);
  ASSERT_EQ(rc, 0) << on;
  const std::string off = run(base + " --no-interleave-overlap", &rc);
  ASSERT_EQ(rc, 0) << off;
  const auto d = piper::Json::parse(by_default), y = piper::Json::parse(on), n = piper::Json::parse(off);
  EXPECT_EQ(d["step_time_s"].get<double>(), y["step_time_s"].get<double>());
  EXPECT_LT(d["step_time_s"].get<double>(), 0.97 * n["step_time_s"].get<double>());
  EXPECT_LT(d["exposed_comm_fraction"].get<double>(), n["exposed_comm_fraction"].get<double>());
}

}  // namespace
