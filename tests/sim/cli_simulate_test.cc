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
  std::string out = run("simulate --model tiny-moe --cluster dgx-h100 --nodes 1 --seq 256 --strategy "
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
  EXPECT_NEAR(j["tokens_per_s"].get<double>() * j["step_time_s"].get<double>(), 16.0 * 256, 1e-6);
  FILE* f = std::fopen(trace.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
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
