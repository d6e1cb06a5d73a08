// End-to-end: the piper binary's `compile` command.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "piper/base/json.h"
#include "piper/compile/plan_io.h"

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

const char* kStrategy = "--strategy dp=4,pp=2,ep=4,zero=3,schedule=1f1b,microbatches=4";

TEST(CliCompileTest, JsonStatsPerTemplate) {
  int rc = 0;
  std::string out = run(std::string("compile --model tiny-moe --seq 64 --json ") + kStrategy, &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = piper::Json::parse(out);
  EXPECT_EQ(j["world_size"], 8);
  EXPECT_EQ(j["microbatches"], 4);
  ASSERT_EQ(j["templates"].size(), 2u);
  for (const auto& t : j["templates"]) {
    EXPECT_EQ(t["num_ranks"], 4);
    // 1F1B over 4 microbatches: every chunk's F and BW per microbatch, plus one update per chunk.
    EXPECT_GT(t["compute"].get<int>(), 8);
    EXPECT_GT(t["stream_instructions"]["compute"].get<int>(), 0);
    EXPECT_GT(t["collective"].get<int>(), 0);  // ZeRO-3 all-gathers, reduce-scatters, expert all-to-alls
    EXPECT_GT(t["static_bytes"].get<int64_t>(), 0);
    EXPECT_GT(t["peak_bytes"].get<int64_t>(), t["static_bytes"].get<int64_t>());
  }
  // Activations go forward from rank 0 to rank 1 (and gradients back), one p2p pair per microbatch and direction.
  EXPECT_EQ(j["templates"][0]["send"], 4);
  EXPECT_EQ(j["templates"][0]["recv"], 4);
  EXPECT_EQ(j["templates"][1]["send"], 4);
}

TEST(CliCompileTest, DirectiveFileCompilesToTheSameStats) {
  int rc = 0;
  std::string file = std::string(PIPER_BINARY_DIR) + "/cli_compile_test_directives.json";
  std::string a =
      run(std::string("compile --model tiny-moe --seq 64 --json --emit-directives ") + file + " " + kStrategy, &rc);
  ASSERT_EQ(rc, 0) << a;
  std::string b = run("compile --model tiny-moe --seq 64 --json --mesh pp=2,dp=4,ep=4 --directives " + file, &rc);
  ASSERT_EQ(rc, 0) << b;
  auto ja = piper::Json::parse(a), jb = piper::Json::parse(b);
  EXPECT_EQ(ja["templates"], jb["templates"]);
  EXPECT_EQ(ja["instructions"], jb["instructions"]);
}

// --emit-plan writes the compiled plan; it loads back (compile/plan_io.h) with the instructions the command counts.
// A compile that fails writes no file.
TEST(CliCompileTest, EmitPlanWritesALoadablePlan) {
  int rc = 0;
  const std::string file = std::string(PIPER_BINARY_DIR) + "/cli_compile_test_plan.json";
  std::filesystem::remove(file);
  std::string a = run("compile --model tiny-moe --seq 64 --json --emit-plan " + file + " " + kStrategy, &rc);
  ASSERT_EQ(rc, 0) << a;
  auto plan = piper::compile::load_plan_file(file);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_EQ(plan->world_size, 8);
  size_t instructions = 0;
  for (const auto& p : plan->templates) instructions += p.num_instructions();
  EXPECT_EQ(piper::Json::parse(a)["instructions"].get<size_t>(), instructions);
  std::filesystem::remove(file);
  std::string b = run("compile --model tiny-moe --seq 64 --emit-plan " + file + " --strategy dp=4,ep=3", &rc);
  EXPECT_NE(rc, 0) << b;
  EXPECT_FALSE(std::filesystem::exists(file));
}

// A 2-rank directive file compiled with --mesh pp=4 said "verified deadlock-free" with two empty ranks.
TEST(CliCompileTest, DirectiveFileForAnotherMeshIsRefused) {
  int rc = 0;
  std::string file = std::string(PIPER_BINARY_DIR) + "/cli_compile_test_directives_pp2.json";
  std::string a = run(
      "compile --model tiny-moe --seq 64 --emit-directives " + file + " --strategy pp=2,schedule=1f1b,microbatches=4",
      &rc);
  ASSERT_EQ(rc, 0) << a;
  std::string b = run("compile --model tiny-moe --seq 64 --mesh pp=4 --directives " + file, &rc);
  EXPECT_NE(rc, 0) << b;
  EXPECT_EQ(b.find("deadlock-free"), std::string::npos) << b;
  EXPECT_NE(b.find("written for pp=2) but the mesh has pp=4, vpp=1: pipeline rank(s) 2, 3 would have no work"),
            std::string::npos)
      << b;
  std::string c = run("compile --model tiny-moe --seq 64 --mesh pp=2 --directives " + file, &rc);
  EXPECT_EQ(rc, 0) << c;
}

// microbatches=16777216 passed the parser and threw std::bad_alloc in compile.
TEST(CliCompileTest, OversizedStrategyIsRefusedWithTheBound) {
  int rc = 0;
  std::string out = run("compile --model tiny-moe --seq 64 --strategy microbatches=16777216", &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("microbatches=16777216 is out of range; allowed 1..65536"), std::string::npos) << out;
}

TEST(CliCompileTest, TextOutputAndGlobalBatch) {
  int rc = 0;
  std::string out = run("compile --model tiny-moe --seq 64 --strategy dp=2,pp=2,schedule=gpipe --global-batch 8", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("4 microbatches"), std::string::npos) << out;  // 8 sequences / (dp=2 * mbs=1)
  EXPECT_NE(out.find("verified deadlock-free"), std::string::npos) << out;
  EXPECT_NE(out.find("instructions per stream"), std::string::npos) << out;
}

TEST(CliCompileTest, BadInputsExitNonZeroWithAHint) {
  int rc = 0;
  std::string out = run("compile --model tiny-moe", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("exactly one of --strategy"), std::string::npos) << out;
  out = run("compile --model tiny-moe --strategy dp=2,pp=2 --global-batch 7", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("not a multiple of dp*mbs"), std::string::npos) << out;
  std::string file = std::string(PIPER_BINARY_DIR) + "/cli_compile_test_bad.json";
  FILE* f = fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs(
      R"([{"directive": "split", "microbatches": 2}, {"directive": "place", "filter": {"layer": "0-3"}, "stage": 9}])",
      f);
  fclose(f);
  out = run("compile --model tiny-moe --mesh pp=2 --directives " + file, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("directive 1 (place)"), std::string::npos) << out;
  out = run("compile --model tiny-moe --directives " + file, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--mesh"), std::string::npos) << out;
}

// `compile --emit-directives F` wrote F although compilation failed.
TEST(CliCompileTest, FailedCompileWritesNoDirectiveFile) {
  const std::string file = std::string(PIPER_BINARY_DIR) + "/cli_compile_test_failed.json";
  std::remove(file.c_str());
  int rc = 0;
  std::string out = run("compile --model tiny-moe --seq 64 --strategy dp=1 --capacity-gib 0.000001 --emit-directives " +
                            file, &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_EQ(std::fopen(file.c_str(), "r"), nullptr) << file << " was written although compilation failed:\n" << out;
  out = run("compile --model tiny-moe --seq 64 --strategy dp=1 --emit-directives " + file, &rc);
  ASSERT_EQ(rc, 0) << out;
  FILE* f = std::fopen(file.c_str(), "r");
  ASSERT_NE(f, nullptr) << out;
  std::fclose(f);
  std::remove(file.c_str());
}

}  // namespace
