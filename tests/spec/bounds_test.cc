// Ranges of model, cluster and training keys (spec/limits.h) and overflow-safe counting: every out-of-range value
// is refused by the loader with a message that names the key, the value and the allowed range.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "piper/base/check.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/counting.h"
#include "piper/spec/hf_config.h"
#include "piper/spec/limits.h"
#include "piper/spec/model_json.h"
#include "piper/spec/model_loader.h"
#include "piper/spec/presets.h"
#include "piper/spec/train_json.h"

namespace piper {
namespace {

Json preset_json(const std::string& name) {
  auto m = load_model(name);
  PIPER_CHECK(m.ok());
  return Json::parse(to_json(*m).dump());
}

// The error of loading `json` as a model (empty when it loads).
std::string model_error(const Json& json) {
  auto m = model_from_json(json, "t");
  return m.ok() ? "" : m.status().message();
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

TEST(SpecBoundsTest, HiddenSize2Pow31IsRefusedNotWrapped) {
  Json j = preset_json("tiny-moe");
  j["hidden_size"] = int64_t{1} << 31;
  const std::string e = model_error(j);
  expect_has(e, "model.hidden_size");
  expect_has(e, "2147483648");
  expect_has(e, std::to_string(kMaxHiddenSize));
}

TEST(SpecBoundsTest, MillionLayersIsRefusedWithTheBound) {
  Json j = preset_json("tiny-moe");
  j["num_layers"] = 1000000;
  const std::string e = model_error(j);
  expect_has(e, "model.num_layers: 1000000 is out of range; allowed [1, 4096] (the deepest published model has 128)");
}

TEST(SpecBoundsTest, EveryModelSizeKeyHasAnUpperBound) {
  struct Case {
    const char* key;
    int64_t value;
  };
  for (const Case& c : {Case{"vocab_size", int64_t{1} << 30}, Case{"intermediate_size", int64_t{1} << 40},
                        Case{"num_heads", int64_t{1} << 20}, Case{"head_dim", int64_t{1} << 20},
                        Case{"max_seq_len", int64_t{1} << 40}, Case{"sliding_window", int64_t{1} << 40}}) {
    Json j = preset_json("tiny-moe");
    j[c.key] = c.value;
    const std::string e = model_error(j);
    expect_has(e, c.key);
    expect_has(e, std::to_string(c.value));
  }
  Json j = preset_json("tiny-moe");
  j["moe"]["num_experts"] = 1 << 20;
  expect_has(model_error(j), "model.moe.num_experts");
  j = preset_json("tiny-moe");
  j["moe"]["expert_intermediate_size"] = int64_t{1} << 40;
  expect_has(model_error(j), "expert_intermediate_size");
  j = preset_json("tiny-moe");
  j["rope_theta"] = 1e300;
  expect_has(model_error(j), "rope_theta");
}

// Each size within its bound, the product beyond int64: refused by the checked count, not wrapped negative.
TEST(SpecBoundsTest, ParameterCountBeyondTheBoundIsRefused) {
  Json j = preset_json("tiny-moe");
  j["num_layers"] = 4096;
  j["hidden_size"] = 1 << 20;
  j["num_heads"] = 1024;
  j["num_kv_heads"] = 1024;
  j["head_dim"] = 1024;
  j["intermediate_size"] = 1 << 22;
  j["moe"]["num_experts"] = 1 << 16;
  j["moe"]["top_k"] = 1;
  j["moe"]["expert_intermediate_size"] = 1 << 22;
  const std::string e = model_error(j);
  expect_has(e, "parameters exceed the bound of 1e15");
  expect_has(e, "more than 9.2e18");  // the saturated count: 2^66 and up, never a wrapped negative
}

TEST(SpecBoundsTest, CountingSaturatesInsteadOfWrapping) {
  ModelSpec m = *load_model("tiny-moe");
  m.hidden_size = int64_t{1} << 40;  // not validated: count_params must still not wrap
  m.vocab_size = int64_t{1} << 40;
  const ParamCounts c = count_params(m);
  EXPECT_EQ(c.embedding.total, INT64_MAX);
  EXPECT_EQ(c.total(), INT64_MAX);
  EXPECT_GT(c.active(), 0);
}

// Every preset (deepseek-v3, gpt-1t, ...) stays inside every bound.
TEST(SpecBoundsTest, EveryPresetIsInsideTheBounds) {
  for (const std::string& name : model_preset_names()) {
    auto m = load_model(name);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().message();
    EXPECT_LE(count_params(*m).total(), kMaxParams) << name;
  }
  for (const std::string& name : cluster_preset_names()) {
    auto c = load_cluster(name, 1);
    EXPECT_TRUE(c.ok()) << name << ": " << c.status().message();
  }
}

Json mixtral_config() {
  auto j = load_json_file(std::string(PIPER_SOURCE_DIR) + "/tests/data/hf/mixtral-8x7b/config.json");
  PIPER_CHECK(j.ok());
  return *j;
}

// Errors after reading an HF config name the file's keys, not ModelSpec's fields.
TEST(SpecBoundsTest, HfConfigErrorsNameTheFilesKeys) {
  Json j = mixtral_config();
  j["num_key_value_heads"] = 3;
  auto m = model_from_hf_config(j, "mixtral", "config.json");
  ASSERT_FALSE(m.ok());
  const std::string e = m.status().message();
  expect_has(e, "num_key_value_heads: 3 must divide num_attention_heads=32");
  EXPECT_EQ(e.find("num_kv_heads"), std::string::npos) << e;
  EXPECT_EQ(e.find("model."), std::string::npos) << e;

  j = mixtral_config();
  j["hidden_size"] = int64_t{1} << 31;
  m = model_from_hf_config(j, "mixtral", "config.json");
  ASSERT_FALSE(m.ok());
  expect_has(m.status().message(),
             "hidden_size: 2147483648 is out of range; allowed [1, 1048576] (the widest published is 18432)");

  j = mixtral_config();
  j["num_local_experts"] = 1;  // top_k 2 > 1 expert: validate()'s message, in the file's words
  m = model_from_hf_config(j, "mixtral", "config.json");
  ASSERT_FALSE(m.ok());
  expect_has(m.status().message(), "num_experts_per_tok: 2 is out of range; allowed 1..num_local_experts=1");
  EXPECT_EQ(m.status().message().find("model.moe"), std::string::npos) << m.status().message();
}

Json cluster_json() {
  auto text = cluster_preset_text("dgx-h100");
  PIPER_CHECK(text.ok());
  return Json::parse(*text);
}

std::string cluster_error(const Json& j, int nodes = 1) {
  auto c = cluster_from_json(j, nodes, "t");
  return c.ok() ? "" : c.status().message();
}

TEST(SpecBoundsTest, ClusterNumbersAreFiniteAndBounded) {
  Json j = cluster_json();
  j["device"]["memory_bw_bytes_per_s"] = 1e300;
  expect_has(cluster_error(j), "cluster.device.memory_bw_bytes_per_s: 1e+300 is out of range; allowed (0, 1e+15]");
  j = cluster_json();
  j["device"]["peak_flops_bf16"] = 1e30;
  expect_has(cluster_error(j), "peak_flops_bf16");
  j = cluster_json();
  j["device"]["memory_bytes"] = int64_t{1} << 60;
  expect_has(cluster_error(j), "memory_bytes");
  j = cluster_json();
  j["node"]["intra"]["latency_s"] = 5;
  expect_has(cluster_error(j), "cluster.node.intra.latency_s: 5 is out of range; allowed [0, 1]");
  j = cluster_json();
  j["node"]["intra"]["bw_bytes_per_s"] = 0;
  expect_has(cluster_error(j), "cluster.node.intra.bw_bytes_per_s: 0 is out of range");
  j = cluster_json();
  j["device"]["gemm_efficiency"] = 1.5;
  expect_has(cluster_error(j), "gemm_efficiency");
  j = cluster_json();
  j["fabric"]["inter_group_taper"] = 1e9;
  expect_has(cluster_error(j), "inter_group_taper");
  j = cluster_json();
  j["node"]["devices_per_node"] = 5000;
  expect_has(cluster_error(j), "devices_per_node: 5000 is out of range");
}

TEST(SpecBoundsTest, NearDeviceIndexIsCheckedBeforeNarrowing) {
  Json j = cluster_json();
  j["node"]["nics"][0]["near_devices"] = Json::array({int64_t{1} << 32});  // wrapped to device 0 before
  expect_has(cluster_error(j), "device 4294967296 is out of range; allowed 0..7");
}

TEST(SpecBoundsTest, WorldSizeIsBounded) {
  expect_has(cluster_error(cluster_json(), 200000), "--nodes 200000 x 8 devices = 1600000 ranks is out of range");
  EXPECT_EQ(cluster_error(cluster_json(), 1024), "");  // 8,192 GPUs (deepseek-v3's scale)
}

std::string train_error(const Json& j) {
  auto t = train_from_json(j, "t");
  return t.ok() ? "" : t.status().message();
}

TEST(SpecBoundsTest, TrainKeysAreBounded) {
  expect_has(train_error(Json{{"global_batch", 8}, {"seq_len", int64_t{1} << 30}}),
             "train.seq_len: 1073741824 is out of range; allowed 1..16777216");
  expect_has(train_error(Json{{"global_batch", 1 << 16}, {"micro_batch_size", 1 << 16}, {"seq_len", 1 << 20}}),
             "micro_batch_size*seq_len = 68719476736 tokens per microbatch is out of range");
  expect_has(train_error(Json{{"global_batch", int64_t{1} << 40}}), "train.global_batch: 1099511627776");
  // The file's bounds are the flags' bounds (--global-batch, --lr): one constant each in limits.h.
  expect_has(train_error(Json{{"global_batch", (1 << 24) + 1}}),
             "train.global_batch: 16777217 is out of range; allowed 1..16777216");
  EXPECT_EQ(train_error(Json{{"global_batch", 1 << 24}}), "");
  expect_has(train_error(Json{{"global_batch", 8}, {"optimizer", {{"lr", 1e30}}}}),
             "train.optimizer.lr: 1e+30 is out of range; allowed (0, 1]");
  expect_has(train_error(Json{{"global_batch", 8}, {"optimizer", {{"lr", 2.0}}}}),
             "train.optimizer.lr: 2 is out of range; allowed (0, 1]");
  EXPECT_EQ(train_error(Json{{"global_batch", 8}, {"optimizer", {{"lr", 1.0}}}}), "");
  TrainSpec t;
  t.global_batch = 8;
  t.optimizer.lr = std::numeric_limits<double>::infinity();
  expect_has(t.validate().message(), "train.optimizer.lr: inf is out of range");
  t.optimizer.lr = std::numeric_limits<double>::quiet_NaN();
  expect_has(t.validate().message(), "train.optimizer.lr: nan is out of range");
}

}  // namespace
}  // namespace piper
