// End-to-end: what every command does with hostile inputs (docs/reliability.md, "Input ranges: command-line
// flags and outputs"): non-regular files, numeric flags out of range, long values, --json errors, no partial
// output files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "piper/base/json.h"

namespace {
namespace fs = std::filesystem;

// `timeout` guards the hangs this file tests for: a regression fails instead of blocking CTest.
std::string run(const std::string& args, int* rc, bool with_stderr = true) {
  std::string cmd = "timeout 60 " + std::string(PIPER_BIN_PATH) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  const int status = pclose(f);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

fs::path temp_dir() {
  const fs::path dir = fs::temp_directory_path() / ("piper_cli_inputs_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

std::string fifo() {
  static const std::string path = [] {
    const std::string p = (temp_dir() / "input.json").string();
    fs::remove(p);
    EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
    return p;
  }();
  return path;
}

const std::string kScenario = "--model tiny-moe --cluster local-cpu --nodes 1 ";

void expect_error(const std::string& args, const std::string& needle) {
  SCOPED_TRACE(args);
  int rc = 0;
  const std::string out = run(args, &rc);
  EXPECT_EQ(rc, 2) << out;
  // One error line (a [W ...] environment warning of train's may precede it), and it holds the message.
  const size_t at = out.find("piper: error: ");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_EQ(out.find("piper: error: ", at + 1), std::string::npos) << "more than one error:\n" << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  EXPECT_NE(line.find(needle), std::string::npos) << out;
  EXPECT_EQ(out.find('\n', at), out.size() - 1) << "not one line:\n" << out;
}

// Every flag that names an input file: a FIFO was read (and blocked on) before.
TEST(CliInputsTest, FifoAsAnyInputFileIsRefusedAtOnce) {
  const std::string f = fifo();
  const std::string fix = "is not a regular file (a FIFO); give a regular file";
  expect_error("estimate " + kScenario + "--strategy " + f, fix);
  expect_error("estimate --model " + f + " --cluster local-cpu --nodes 1 --strategy dp=1", fix);
  expect_error("estimate --model tiny-moe --cluster " + f + " --nodes 1 --strategy dp=1", fix);
  expect_error("estimate " + kScenario + "--strategy dp=1 --calibration " + f, fix);
  expect_error("simulate " + kScenario + "--strategy dp=1 --comm-calibration " + f, fix);
  expect_error("schedule --directives " + f + " --pp 2 --microbatches 4", fix);
  expect_error("compile --model tiny-moe --directives " + f + " --mesh pp=2", fix);
  expect_error("info --model " + f, fix);
  expect_error("train --model tiny-moe --steps 1 --seq 16 --global-batch 2 --data " + f, fix);
}

TEST(CliInputsTest, DirectoryAsAJsonFileIsNamedAsADirectory) {
  const fs::path dir = temp_dir() / "model.json";
  fs::create_directories(dir);
  // Was "malformed JSON at line 1".
  expect_error("info --model " + dir.string(), "is a directory; give a file");
  expect_error("estimate " + kScenario + "--strategy " + dir.string(), "is a directory; give a file");
}

struct FlagCase {
  std::string args;
  std::string needle;
};

// Each numeric flag refuses what is outside its range, at the flag, with the range (docs/reliability.md).
TEST(CliInputsTest, NumericFlagsOutsideTheirRangeAreRefused) {
  const std::string est = "estimate " + kScenario + "--strategy dp=1 ";
  const std::string train = "train --model tiny-moe --steps 1 --seq 16 --global-batch 2 ";
  const std::vector<FlagCase> cases = {
      {est + "--seq 0", "--seq: 0 is outside [1, 1048576] (tokens per sequence)"},
      {est + "--seq -5", "--seq: -5 is outside [1, 1048576]"},
      {est + "--seq 1000000", "--seq 1000000 exceeds the model's max_seq_len 128 (tiny-moe); give --seq <= 128"},
      {est + "--global-batch 0", "--global-batch: 0 is outside [1, 16777216] (sequences per step)"},
      {est + "--nodes 0", "--nodes: 0 is outside [1, 65536]"},
      {est + "--seq 12x", "--seq: '12x' is not an integer; give an integer in [1, 1048576]"},
      {"simulate " + kScenario + "--strategy dp=1 --seq 1000000", "exceeds the model's max_seq_len 128"},
      {"simulate " + kScenario + "--strategy dp=1 --expert-zipf nan", "--expert-zipf: nan is not finite"},
      {"simulate " + kScenario + "--strategy dp=1 --migrate-window 0", "--migrate-window: 0 is outside [1, 1000000]"},
      {"plan " + kScenario + "--global-batch 8 --seq 1000000", "exceeds the model's max_seq_len 128"},
      {"plan " + kScenario + "--global-batch 8 --threads -1", "--threads: -1 is outside [1, 1024] (search threads)"},
      {"plan " + kScenario + "--global-batch 8 --simulate-top -1", "--simulate-top: -1 is outside [0, 1000]"},
      {"plan " + kScenario + "--global-batch 8 --top 0", "--top: 0 is outside [1, 1000]"},
      {"plan " + kScenario + "--global-batch 8 --memory-fraction nan", "--memory-fraction: nan is not finite"},
      {"plan " + kScenario + "--global-batch 8 --sim-budget-s -1", "--sim-budget-s: -1 is outside [0, 86400]"},
      {"plan " + kScenario + "--global-batch 8 --local-search -2", "--local-search: -2 is outside [0, 1000]"},
      {"plan " + kScenario + "--global-batch 8 --verify-attempts 0", "--verify-attempts: 0 is outside [1, 1000]"},
      {"plan --model tiny-moe --global-batch 8 --local-ranks 65", "--local-ranks: 65 is outside [1, 64]"},
      {"compile --model tiny-moe --strategy dp=1 --seq 1000000", "exceeds the model's max_seq_len 128"},
      {"compile --model tiny-moe --strategy dp=1 --seq 0", "--seq: 0 is outside [1, 1048576]"},
      {"compile --model tiny-moe --strategy dp=1 --microbatches 0", "--microbatches: 0 is outside [1, 4096]"},
      {"compile --model tiny-moe --strategy dp=1 --global-batch 0", "--global-batch: 0 is outside [1, 16777216]"},
      {"compile --model tiny-moe --strategy dp=1 --capacity-gib -1", "--capacity-gib: -1 is outside (0, 1.04858e+06]"},
      {"compile --model tiny-moe --strategy dp=1 --capacity-gib nan", "--capacity-gib: nan is not finite"},
      {"compile --model tiny-moe --mesh pp=100000 --directives x.json",
       "--mesh pp=100000: degrees must be in [1, 4096]"},
      {"info --model tiny-moe --seq 0", "--seq: 0 is outside [1, 1048576]"},
      {"info --model tiny-moe --seq 4096", "exceeds the model's max_seq_len 128"},
      {train + "--global-batch -4", "--global-batch: -4 is outside [1, 16777216]"},
      {train + "--lr inf", "--lr: inf is not finite; give a number in (0, 1] (AdamW's peak learning rate)"},
      {train + "--lr 1e30", "--lr: 1e30 is outside (0, 1]"},
      {train + "--lr 0", "--lr: 0 is outside (0, 1]"},
      {train + "--warmup -1", "--warmup: -1 is outside [0, 1000000000]"},
      {train + "--seed -1", "--seed: -1 is outside [0, 9223372036854775807]"},
      {train + "--steps 0", "--steps: 0 is outside [1, 1000000000]"},
      {train + "--threads -1", "--threads: -1 is outside [1, 1024]"},
      {train + "--ranks 1000", "--ranks: 1000 is outside [1, 64] (MPI ranks; mpirun starts them on this machine"},
      {train + "--ranks 0", "--ranks: 0 is outside [1, 64]"},
      {train + "--ranks-per-node 0", "--ranks-per-node: 0 is outside [1, 64]"},
      {train + "--save-every 0", "--save-every: 0 is outside [1, 1000000000]"},
      {train + "--migrate-threshold 0.5", "--migrate-threshold: 0.5 is outside [1, 1e+06]"},
      {train + "--migrate-horizon -1", "--migrate-horizon: -1 is outside [0, 1000000]"},
      {train + "--router-skew nan", "--router-skew: nan is not finite"},
      {"bench comm --iterations 0", "--iterations: 0 is outside [1, 1000000]"},
      {"bench comm --ranks 1000", "--ranks: 1000 is outside [1, 64]"},
      {"bench comm --sizes 4GiB", "--sizes: '4GiB' is more than 1GiB per pair"},
      {"bench comm --top-k 0", "--top-k: 0 is outside [1, 64]"},
  };
  for (const FlagCase& c : cases) expect_error(c.args, c.needle);
}

TEST(CliInputsTest, LongValuesAreElidedInMessages) {
  const std::string huge(100000, 'x');
  int rc = 0;
  std::string out = run("estimate " + kScenario + "--strategy dp=" + huge, &rc);
  EXPECT_EQ(rc, 2) << out.substr(0, 300);
  EXPECT_LT(out.size(), 600u) << out.substr(0, 300);
  EXPECT_NE(out.find("bytes)"), std::string::npos) << out;
  out = run("estimate " + kScenario + "--strategy dp=1 --seq " + huge, &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_LT(out.size(), 600u) << out.substr(0, 300);
  EXPECT_NE(out.find("... (100000 bytes)"), std::string::npos) << out;
}

// --json: one JSON document on stdout whatever happens; on failure the error object with the exit code.
TEST(CliInputsTest, JsonFailuresPrintOneErrorObject) {
  int rc = 0;
  std::string out =
      run("estimate --model no-such-model --cluster local-cpu --nodes 1 --strategy dp=1 --json", &rc, false);
  EXPECT_EQ(rc, 2);
  piper::Json j = piper::Json::parse(out);
  EXPECT_EQ(j["error"]["code"], "not_found");
  EXPECT_EQ(j["error"]["exit_code"], 2);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("no-such-model"), std::string::npos) << out;
  // A flag refused while parsing.
  out = run("estimate " + kScenario + "--strategy dp=1 --seq 0 --json", &rc, false);
  EXPECT_EQ(rc, 2);
  j = piper::Json::parse(out);
  EXPECT_EQ(j["error"]["code"], "invalid_argument");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("--seq: 0 is outside"), std::string::npos) << out;
  // A command that has a result to show and then fails (nothing fits): one object, the result under details.
  out = run("plan --model deepseek-v3 --cluster local-cpu --nodes 1 --global-batch 8 --no-verify --json", &rc, false);
  EXPECT_EQ(rc, 1) << out;
  j = piper::Json::parse(out);  // throws on two concatenated documents
  EXPECT_EQ(j["error"]["code"], "resource_exhausted");
  EXPECT_TRUE(j["error"]["details"]["fits_nowhere"].get<bool>()) << out;
}

TEST(CliInputsTest, SimulateInvalidOrderIsNamedAsInvalid) {
  // Was: "priced by the closed form only (piper estimate)", and estimate refused it too.
  int rc = 0;
  std::string out = run("simulate " + kScenario + "--strategy dp=1,order=foo", &rc);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("order=foo must list each of tp, ep, dp, pp once"), std::string::npos) << out;
  EXPECT_EQ(out.find("piper estimate"), std::string::npos) << out;
}

}  // namespace
