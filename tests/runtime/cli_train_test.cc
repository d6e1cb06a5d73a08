// End-to-end: the piper binary's `train` command (tiny-moe, a few short steps on the default corpus).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "piper/base/json.h"

namespace {

// stdout only when json (warnings go to stderr), else both.
std::string run(const std::string& args, int* rc, bool json) {
  std::string cmd = std::string(PIPER_BIN_PATH) + " " + args + (json ? " 2>/dev/null" : " 2>&1");
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  *rc = pclose(f);
  return out;
}

const std::string kSmall = "train --model tiny-moe --ranks 1 --seq 32 --global-batch 4 ";

TEST(CliTrainTest, JsonSummarySaveAndResume) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("piper_cli_train_" + std::to_string(::getpid()))).string();
  int rc = 0;
  std::string out = run(kSmall + "--steps 2 --json --save " + dir, &rc, true);
  ASSERT_EQ(rc, 0) << out;
  auto j = piper::Json::parse(out);
  ASSERT_EQ(j["steps"].size(), 2u);
  EXPECT_GT(j["loss_first"].get<double>(), 4.5);  // about ln(256) at initialisation
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["achieved_flops"].get<double>(), 0);
  EXPECT_GT(j["peak_memory_bytes"].get<int64_t>(), 0);
  EXPECT_GT(j["predicted_peak_memory_bytes"].get<double>(), 0);
  EXPECT_EQ(j["peak_memory"]["parameters"].get<int64_t>() * 2, j["peak_memory"]["optimizer"].get<int64_t>());
  // Resuming continues the step count and the data; a third uninterrupted step gives the same loss.
  std::string resumed = run(kSmall + "--steps 1 --json --resume " + dir, &rc, true);
  ASSERT_EQ(rc, 0) << resumed;
  std::string straight = run(kSmall + "--steps 3 --json", &rc, true);
  ASSERT_EQ(rc, 0) << straight;
  auto jr = piper::Json::parse(resumed), js = piper::Json::parse(straight);
  EXPECT_EQ(jr["steps"][0]["step"], 3);
  EXPECT_EQ(jr["steps"][0]["loss"].get<double>(), js["steps"][2]["loss"].get<double>());
  std::filesystem::remove_all(dir);
}

TEST(CliTrainTest, TextProgressLinesAndSummary) {
  int rc = 0;
  std::string out = run(kSmall + "--steps 2", &rc, false);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("step     2  loss"), std::string::npos) << out;
  EXPECT_NE(out.find("tok/s"), std::string::npos) << out;
  EXPECT_NE(out.find("predicted_peak_memory_bytes"), std::string::npos) << out;
}

TEST(CliTrainTest, ClearErrors) {
  int rc = 0;
  std::string out = run("train --model tiny-moe --seq 32 --global-batch 4 --steps 1 --ranks 2", &rc, false);
  EXPECT_NE(rc, 0);
  // Two ranks but a one-rank strategy: refused once, before mpirun starts ranks that would each print it.
  EXPECT_NE(out.find("runs on 1 rank(s) (dp*tp*pp); give --ranks 1 or set dp=2"), std::string::npos) << out;
  // Token slices that do not split: refused once, before mpirun (not once per rank, nor at the first step).
  out = run("train --model tiny-moe --seq 31 --global-batch 1 --steps 1 --ranks 2 --strategy tp=2,sp=1", &rc, false);
  EXPECT_NE(rc, 0);
  EXPECT_EQ(out.find("mpirun"), std::string::npos) << out;
  EXPECT_NE(out.find("make mbs*seq a multiple of tp (e.g. seq 32)"), std::string::npos) << out;
  out = run(kSmall + "--steps 1 --data /nonexistent/corpus.txt", &rc, false);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("/nonexistent/corpus.txt"), std::string::npos) << out;
  out = run(kSmall + "--steps 1 --resume /nonexistent/ckpt", &rc, false);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("/nonexistent/ckpt"), std::string::npos) << out;
  out = run("train --model tiny-moe --steps 1 --strategy schedule=1f1b,microbatches=3,mbs=2 --global-batch 4", &rc,
            false);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--global-batch 4"), std::string::npos) << out;
}

// A real --ranks 16 with a strategy for one rank printed 16 copies of the error; now one line, before mpirun.
TEST(CliTrainTest, RanksThatDoNotMatchTheStrategyAreRefusedOnce) {
  int rc = 0;
  std::string out =
      run("train --model tiny-moe --seq 32 --global-batch 4 --steps 1 --ranks 16 --strategy dp=1,microbatches=4", &rc,
          false);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
  const std::string needle = "--ranks 16 but strategy";
  ASSERT_NE(out.find(needle), std::string::npos) << out;
  EXPECT_EQ(out.find(needle, out.find(needle) + 1), std::string::npos) << "printed more than once:\n" << out;
  EXPECT_EQ(out.find("mpirun"), std::string::npos) << out;
}

// A multi-rank job whose ranks all refuse their input prints one JSON error object (the launcher's, naming the
// ranks and the first error), not one per rank followed by the launcher's: stdout stays one JSON document.
TEST(CliTrainTest, FailedMultiRankJobPrintsOneJsonErrorObject) {
  int rc = 0;
  const std::string out =
      run("train --model tiny-moe --ranks 2 --seq 16 --global-batch 4 --steps 1 --strategy dp=2 --json", &rc, true);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
  piper::Json j;
  ASSERT_NO_THROW(j = piper::Json::parse(out)) << out;
  const std::string message = j["error"]["message"];
  EXPECT_NE(message.find("the 2-rank job failed"), std::string::npos) << message;
  EXPECT_NE(message.find("differs from the strategy's dp*microbatches*mbs"), std::string::npos) << message;
}

// --lr inf gave null losses and --lr 1e30 NaN losses: refused at the flag (the trainer also stops at the first
// non-finite loss: trainer_test NonFiniteLossStopsTrainingAndNamesTheStep).
TEST(CliTrainTest, AbsurdLearningRatesAreRefusedAtTheFlag) {
  int rc = 0;
  for (const char* lr : {"inf", "nan", "1e30", "-0.1"}) {
    std::string out = run(kSmall + "--steps 1 --lr " + lr, &rc, false);
    EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
    EXPECT_NE(out.find("--lr: "), std::string::npos) << out;
    EXPECT_NE(out.find("(0, 1] (AdamW's peak learning rate)"), std::string::npos) << out;
    EXPECT_EQ(out.find("loss"), std::string::npos) << out;
  }
}

// --global-batch -4 trained with the default batch, and 0 meant "default".
TEST(CliTrainTest, GlobalBatchZeroOrNegativeIsRefused) {
  int rc = 0;
  for (const char* b : {"0", "-4"}) {
    std::string out = run("train --model tiny-moe --steps 1 --seq 32 --global-batch " + std::string(b), &rc, false);
    EXPECT_EQ(WEXITSTATUS(rc), 2) << out;
    EXPECT_NE(out.find("--global-batch: " + std::string(b) + " is outside [1, 16777216]"), std::string::npos) << out;
  }
}

}  // namespace

namespace {

// `piper train --directives F --mesh M` with F what `piper compile --target cpu-runtime --emit-directives` wrote
// for a strategy: the same losses as `--strategy`, bit for bit (the same plan); on 2 ranks through mpirun.
TEST(CliTrainTest, EmittedDirectivesTrainLikeTheirStrategy) {
  const std::string file = std::string(PIPER_BINARY_DIR) + "/cli_train_test_directives.json";
  const std::string strategy = "pp=2,schedule=zb-h1,microbatches=4,mbs=1";
  int rc = 0;
  std::string out = run("compile --model tiny-moe --seq 32 --target cpu-runtime --strategy " + strategy +
                            " --emit-directives " + file, &rc, false);
  ASSERT_EQ(rc, 0) << out;
  const std::string common = "train --model tiny-moe --ranks 2 --seq 32 --steps 3 --json ";
  std::string want = run(common + "--strategy " + strategy, &rc, true);
  ASSERT_EQ(rc, 0) << want;
  std::string got = run(common + "--directives " + file + " --mesh pp=2", &rc, true);
  ASSERT_EQ(rc, 0) << got;
  const piper::Json w = piper::Json::parse(want), g = piper::Json::parse(got);
  ASSERT_EQ(g["steps"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(g["steps"][i]["loss"].get<double>(), w["steps"][i]["loss"].get<double>());
  // A mesh of other ranks is refused by name.
  out = run("train --model tiny-moe --ranks 2 --seq 32 --steps 1 --directives " + file + " --mesh pp=2,dp=2", &rc,
            false);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("has pp*dp*tp = 4 ranks but the run has 2"), std::string::npos) << out;
  // The megatron target's file (the default's; the same list as the cpu-runtime one now): its ZeRO-1 parameters
  // gathered before the next forward ("param_gather": "before_forward") train as the strategy does, the same plan
  // and the same losses.
  const std::string megatron = std::string(PIPER_BINARY_DIR) + "/cli_train_test_megatron.json";
  out = run("compile --model tiny-moe --seq 32 --strategy dp=2,zero=1,microbatches=2,mbs=1 --emit-directives " +
                megatron,
            &rc, false);
  ASSERT_EQ(rc, 0) << out;
  std::ifstream in(megatron);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"param_gather\": \"before_forward\""), std::string::npos) << text;
  want = run(common + "--strategy dp=2,zero=1,microbatches=2,mbs=1", &rc, true);
  ASSERT_EQ(rc, 0) << want;
  got = run(common + "--directives " + megatron + " --mesh dp=2", &rc, true);
  ASSERT_EQ(rc, 0) << got;
  const piper::Json zw = piper::Json::parse(want), zg = piper::Json::parse(got);
  EXPECT_EQ(zg["plan_hash"].get<std::string>(), zw["plan_hash"].get<std::string>());
  ASSERT_EQ(zg["steps"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(zg["steps"][i]["loss"].get<double>(), zw["steps"][i]["loss"].get<double>());
}

}  // namespace
