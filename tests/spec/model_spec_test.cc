#include "piper/spec/model_spec.h"

#include <gtest/gtest.h>

#include "piper/spec/model_json.h"
#include "piper/spec/model_loader.h"
#include "piper/spec/presets.h"

namespace piper {
namespace {

std::string error_of(const std::string& text) {
  auto r = load_model_from_text(text, "t", "test.json");
  EXPECT_FALSE(r.ok()) << text;
  return r.ok() ? "" : r.status().message();
}

// A valid small MoE model in our schema; tests break one field at a time.
Json tiny() {
  return Json::parse(R"({"name": "t", "num_layers": 4, "hidden_size": 128, "attention": "standard", "num_heads": 4,
    "num_kv_heads": 2, "mlp": "swiglu", "intermediate_size": 512, "vocab_size": 256, "tie_embeddings": false,
    "moe": {"num_experts": 8, "top_k": 2, "expert_intermediate_size": 256, "first_k_dense_layers": 1,
            "router": "softmax", "norm_topk_prob": true}})");
}

TEST(ModelSpecTest, EveryPresetLoadsValidatesAndRoundTrips) {
  auto names = model_preset_names();
  ASSERT_GE(names.size(), 12u);
  for (const auto& name : names) {
    auto m = load_model(name);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().message();
    EXPECT_EQ(m->name, name);
    auto again = model_from_json(Json::parse(to_json(*m).dump()), "round trip");
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(to_json(*again).dump(), to_json(*m).dump()) << name;
  }
}

TEST(ModelSpecTest, MoeLayerPattern) {
  auto m = load_model("deepseek-v3");
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(m->is_moe_layer(0));
  EXPECT_FALSE(m->is_moe_layer(2));
  EXPECT_TRUE(m->is_moe_layer(3));
  EXPECT_TRUE(m->is_moe_layer(60));
  EXPECT_FALSE(m->is_moe_layer(61));
  EXPECT_EQ(m->num_moe_layers(), 58);  // 61 layers, first 3 dense
  EXPECT_EQ(m->num_dense_layers(), 3);
  EXPECT_EQ(m->qk_head_dim(), 192);
  EXPECT_EQ(m->v_head_dim(), 128);
  ModelSpec freq = *m;
  freq.moe.first_k_dense_layers = 1;
  freq.moe.layer_freq = 2;
  EXPECT_TRUE(freq.is_moe_layer(1));
  EXPECT_FALSE(freq.is_moe_layer(2));
  EXPECT_TRUE(freq.is_moe_layer(3));
}

TEST(ModelSpecTest, SlidingWindowLayers) {
  auto m = load_model("gpt-oss-20b");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->uses_sliding_window(0));
  EXPECT_FALSE(m->uses_sliding_window(1));
  EXPECT_TRUE(m->uses_sliding_window(22));
  EXPECT_FALSE(m->uses_sliding_window(23));
}

TEST(ModelSpecTest, TinyIsValid) {
  auto r = load_model_from_text(tiny().dump(), "t", "test.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->head_dim, 32);  // derived: 128 / 4
}

TEST(ModelSpecTest, BadInputNamesFieldAndAllowedValues) {
  Json j = tiny();
  j["moe"]["top_k"] = 9;
  EXPECT_NE(error_of(j.dump()).find("model.moe.top_k: 9 is out of range; allowed 1..num_experts=8"), std::string::npos);

  j = tiny();
  j["num_heads"] = 3;  // head_dim derived: 3 does not divide 128
  EXPECT_NE(error_of(j.dump()).find("model.num_heads: 3 does not divide hidden_size=128"), std::string::npos);

  j = tiny();
  j["num_kv_heads"] = 3;
  EXPECT_NE(error_of(j.dump()).find("model.num_kv_heads: 3 must divide num_heads=4"), std::string::npos);

  j = tiny();
  j["hidden_size"] = -128;
  EXPECT_NE(error_of(j.dump()).find("model.hidden_size: -128 is out of range"), std::string::npos);

  j = tiny();
  j["attention"] = "flash";
  EXPECT_NE(error_of(j.dump()).find("model.attention: 'flash' is not allowed; pick one of {standard, mla}"),
            std::string::npos);

  j = tiny();
  j.erase("vocab_size");
  EXPECT_NE(error_of(j.dump()).find("model.vocab_size: required field is missing"), std::string::npos);

  j = tiny();
  j.erase("intermediate_size");  // layer 0 is dense
  EXPECT_NE(error_of(j.dump()).find("model.intermediate_size: required field is missing"), std::string::npos);

  j = tiny();
  j["moe"]["num_expert"] = 8;
  EXPECT_NE(error_of(j.dump()).find("unknown field(s): model.moe.num_expert"), std::string::npos);

  j = tiny();
  j["moe"]["first_k_dense_layers"] = 4;
  EXPECT_NE(error_of(j.dump()).find("model.moe.first_k_dense_layers: 4 is out of range; allowed 0..3"),
            std::string::npos);

  j = tiny();
  j["moe"].erase("router");
  EXPECT_NE(error_of(j.dump()).find("model.moe.router: required field is missing"), std::string::npos);

  j = tiny();
  j["attention"] = "mla";
  EXPECT_NE(error_of(j.dump()).find("model.mla: required object is missing"), std::string::npos);

  EXPECT_NE(error_of("{\"name\": \"t\",\n \"num_layers\": 4,,}").find("test.json: malformed JSON at line 2"),
            std::string::npos);
}

TEST(ModelSpecTest, UnknownPresetListsPresetsAndSuggests) {
  auto r = load_model("deepseek-v4");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find("unknown model preset 'deepseek-v4'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'deepseek-v3'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tiny-moe"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mixtral-8x7b"), std::string::npos) << msg;
}

TEST(ModelSpecTest, MissingFileIsNotFound) {
  auto r = load_model("/nonexistent/model.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/model.json"), std::string::npos);
}

}  // namespace
}  // namespace piper
