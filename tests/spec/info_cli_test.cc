// `piper info` through the binary: exit codes, JSON output, and error messages for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "piper/base/json.h"

namespace piper {
namespace {

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

RunResult run_piper(const std::string& args) {
  std::string cmd = std::string(PIPER_BIN_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = std::string(PIPER_BINARY_DIR) + "/tests/spec/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(InfoCliTest, JsonHasTotalsFlopsAndParts) {
  RunResult r = run_piper("info --model mixtral-8x7b --seq 4096 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Json j = Json::parse(r.output);
  EXPECT_NEAR(j["params_total"].get<double>() / 46.7e9, 1.0, 0.01);   // Mistral AI: 46.7B
  EXPECT_NEAR(j["params_active"].get<double>() / 12.9e9, 1.0, 0.03);  // 12.9B
  EXPECT_GT(j["flops_per_token"].get<double>(), 6 * 12.0e9);
  ASSERT_TRUE(j["parts"].contains("routed_experts"));
  int64_t sum = 0;
  for (const auto& [name, part] : j["parts"].items()) sum += part["total"].get<int64_t>();
  EXPECT_EQ(sum, j["params_total"].get<int64_t>());
  EXPECT_EQ(j["seq_len"].get<int>(), 4096);
  EXPECT_EQ(j["model"]["moe"]["num_experts"].get<int>(), 8);
}

TEST(InfoCliTest, TableAndCluster) {
  RunResult r = run_piper("info --model tiny-moe --cluster h800 --nodes 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("routed_experts"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2.82 M"), std::string::npos) << r.output;  // 2,822,272 parameters
  EXPECT_NE(r.output.find("cluster h800: 2 node(s) x 8 devices = 16 devices"), std::string::npos) << r.output;
}

// Issue 32: the NVL72 domain spans trays; --domain-nodes says how many of each rack the job holds.
TEST(InfoCliTest, Nvl72ShowsItsNvlinkDomain) {
  RunResult r = run_piper("info --cluster gb200-nvl72 --nodes 4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("18 nodes x 4 = 72 devices per scale-up domain"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("this job: 4 node(s) = 16 ranks, all in one domain"), std::string::npos) << r.output;
  r = run_piper("info --cluster gb200-nvl72 --nodes 64 --domain-nodes 16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Json j = Json::parse(r.output);
  EXPECT_EQ(j["cluster"]["domain"]["devices"].get<int>(), 64);
  EXPECT_EQ(j["cluster"]["domain"]["num_domains"].get<int>(), 4);
  r = run_piper("info --cluster gb200-nvl72 --nodes 4 --domain-nodes 19");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--domain-nodes 19 is out of range; allowed 1..18"), std::string::npos) << r.output;
}

TEST(InfoCliTest, UnknownPresetListsPresets) {
  RunResult r = run_piper("info --model mixtral-8x8b");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown model preset 'mixtral-8x8b'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean 'mixtral-8x7b'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("deepseek-v3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tiny-moe"), std::string::npos) << r.output;
}

TEST(InfoCliTest, MalformedJsonGivesPosition) {
  std::string path =
      write_temp("bad_syntax.json", "{\n  \"name\": \"x\",\n  \"num_layers\": 4\n  \"hidden_size\": 8\n}\n");
  RunResult r = run_piper("info --model " + path);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("malformed JSON at line 4"), std::string::npos) << r.output;
}

TEST(InfoCliTest, ContradictoryFieldsNameTheField) {
  std::string good = R"({"name": "x", "num_layers": 2, "hidden_size": 64, "attention": "standard", "num_heads": 4,
    "num_kv_heads": 4, "mlp": "swiglu", "vocab_size": 256, "tie_embeddings": true,
    "moe": {"num_experts": 4, "top_k": TOPK, "expert_intermediate_size": 128, "router": "softmax", "norm_topk_prob": true}})";
  std::string text = good;
  text.replace(text.find("TOPK"), 4, "2");
  RunResult ok = run_piper("info --model " + write_temp("good.json", text));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  text = good;
  text.replace(text.find("TOPK"), 4, "6");
  RunResult r = run_piper("info --model " + write_temp("bad_topk.json", text));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.moe.top_k: 6 is out of range; allowed 1..num_experts=4"), std::string::npos)
      << r.output;
  text = good;
  text.replace(text.find("TOPK"), 4, "2");
  text.replace(text.find("\"num_heads\": 4"), 14, "\"num_heads\": 5");
  r = run_piper("info --model " + write_temp("bad_heads.json", text));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.num_heads: 5 does not divide hidden_size=64"), std::string::npos) << r.output;
}

// hidden_size 2^31 overflowed the counts: info printed negative FLOPs, estimate negative TiB and "fits: yes".
TEST(InfoCliTest, OversizedModelIsRefusedWithTheRange) {
  std::string text = R"({"name": "x", "num_layers": 2, "hidden_size": 2147483648, "attention": "standard",
    "num_heads": 4, "num_kv_heads": 4, "head_dim": 16, "mlp": "swiglu", "intermediate_size": 64, "vocab_size": 256,
    "tie_embeddings": true})";
  const std::string path = write_temp("huge_hidden.json", text);
  for (const std::string& cmd :
       {"info --model " + path, "estimate --model " + path + " --cluster dgx-h100 --nodes 1 --strategy dp=8"}) {
    RunResult r = run_piper(cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("model.hidden_size: 2147483648 is out of range; allowed [1, 1048576]"), std::string::npos)
        << cmd << ": " << r.output;
  }
}

TEST(InfoCliTest, BadNodeCountAndMissingArguments) {
  RunResult r = run_piper("info --cluster local-cpu --nodes 3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--nodes 3 is out of range; allowed 1..1"), std::string::npos) << r.output;
  r = run_piper("info");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("give --model"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace piper
