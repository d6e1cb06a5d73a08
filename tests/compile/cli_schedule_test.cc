// End-to-end: the piper binary's `schedule` command.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

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

TEST(CliScheduleTest, JsonOutput) {
  int rc = 0;
  std::string out = run("schedule --schedule 1f1b --pp 4 --microbatches 8 --json", &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = piper::Json::parse(out);
  EXPECT_DOUBLE_EQ(j["makespan"].get<double>(), 33);
  EXPECT_NEAR(j["bubble_fraction"].get<double>(), 9.0 / 33.0, 1e-12);
  ASSERT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["ranks"][3]["actions"][1], "BW0");
  EXPECT_EQ(j["ranks"][0]["peak_inflight_microbatches"], 4);
}

TEST(CliScheduleTest, DirectiveFileRoundTrip) {
  int rc = 0;
  std::string file = std::string(PIPER_BINARY_DIR) + "/cli_schedule_test_dv.json";
  std::string a = run("schedule --schedule dualpipev --pp 2 --microbatches 4 --json --emit-directives " + file, &rc);
  ASSERT_EQ(rc, 0) << a;
  std::string b = run("schedule --directives " + file + " --pp 2 --vpp 2 --microbatches 4 --json", &rc);
  ASSERT_EQ(rc, 0) << b;
  auto ja = piper::Json::parse(a), jb = piper::Json::parse(b);
  EXPECT_EQ(ja["ranks"], jb["ranks"]);
  EXPECT_EQ(ja["makespan"], jb["makespan"]);
}

TEST(CliScheduleTest, BadInputsExitNonZeroWithAHint) {
  int rc = 0;
  std::string out = run("schedule --schedule dualpipev --pp 4 --microbatches 4", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("microbatches >= 2*pp"), std::string::npos) << out;
  out = run("schedule --schedule 1f1b --pp 2 --microbatches 4 --costs 1,1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("expected three numbers"), std::string::npos) << out;
}

// Each case of issue 28 for `schedule`: a one-line refusal naming the value and the range.
TEST(CliScheduleTest, OutOfRangeFlagsAreRefusedWithTheRange) {
  struct Case {
    std::string args, needle;
  };
  const std::vector<Case> cases = {
      {"--schedule 1f1b --pp 2 --microbatches 4 --costs nan,1,1", "--costs 'nan,1,1': each cost must be a finite number"},
      {"--schedule 1f1b --pp 2 --microbatches 4 --costs 1,inf,1", "each cost must be a finite number in [0, 1000000]"},
      {"--schedule interleaved --pp 2 --microbatches 4 --vpp 0", "--vpp: 0 is outside [1, 64] (stages per rank)"},
      {"--schedule interleaved --pp 2 --microbatches 4 --vpp -2", "--vpp: -2 is outside [1, 64]"},
      {"--schedule interleaved --pp 2 --microbatches 4 --vpp 1", "schedule interleaved needs --vpp >= 2"},
      {"--schedule 1f1b --pp 100000 --microbatches 100000", "--pp: 100000 is outside [1, 256] (pipeline ranks)"},
      {"--schedule 1f1b --pp 2 --microbatches 2147483647", "--microbatches: 2147483647 is outside [1, 65536]"},
      {"--schedule 1f1b --pp 256 --microbatches 65536", "pipeline cells; at most 262144"},
      {"--schedule 1f1b --pp 0 --microbatches 4", "--pp: 0 is outside [1, 256]"},
  };
  for (const Case& c : cases) {
    int rc = 0;
    std::string out = run("schedule " + c.args, &rc);
    EXPECT_EQ(WEXITSTATUS(rc), 2) << c.args << "\n" << out;
    EXPECT_NE(out.find(c.needle), std::string::npos) << c.args << "\n" << out;
    EXPECT_EQ(out.find("null"), std::string::npos) << out;
  }
}

TEST(CliScheduleTest, FailedScheduleWritesNoOutputFile) {
  const std::string file = std::string(PIPER_BINARY_DIR) + "/cli_schedule_test_failed.json";
  const std::string svg = std::string(PIPER_BINARY_DIR) + "/cli_schedule_test_failed.svg";
  std::remove(file.c_str());
  std::remove(svg.c_str());
  int rc = 0;
  std::string out = run("schedule --schedule dualpipev --pp 4 --microbatches 4 --emit-directives " + file +
                            " --svg " + svg, &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_EQ(std::fopen(file.c_str(), "r"), nullptr) << file << " was written although the schedule failed";
  EXPECT_EQ(std::fopen(svg.c_str(), "r"), nullptr);
}

}  // namespace
