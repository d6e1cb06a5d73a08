#include "piper/spec/hf_config.h"

#include <gtest/gtest.h>

#include "piper/spec/counting.h"
#include "piper/spec/model_json.h"
#include "piper/spec/model_loader.h"

namespace piper {
namespace {

std::string fixture(const std::string& model) {
  return std::string(PIPER_SOURCE_DIR) + "/tests/data/hf/" + model + "/config.json";
}

// The architecture without the documentation fields.
std::string arch(const ModelSpec& m) {
  OrderedJson j = to_json(m);
  j.erase("name");
  j.erase("source");
  return j.dump(1);
}

// tests/data/hf/<model>/config.json are copies of the public Hugging Face configs (values as listed in
// ../shared/reference/hardware_and_models.md section 3); loading one must give exactly the preset.
TEST(HfConfigTest, HfConfigAndPresetGiveIdenticalSpecs) {
  for (const char* name :
       {"deepseek-v3", "deepseek-v2-lite", "deepseek-moe-16b", "mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b",
        "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b", "olmoe-1b-7b", "dbrx", "gpt-1.7b"}) {
    auto hf = load_model(fixture(name));
    ASSERT_TRUE(hf.ok()) << name << ": " << hf.status().message();
    EXPECT_EQ(hf->name, name);  // named after the checkpoint directory
    auto preset = load_model(name);
    ASSERT_TRUE(preset.ok()) << preset.status().message();
    EXPECT_EQ(arch(*hf), arch(*preset)) << name;
  }
}

// GPT-2 small (openai-community/gpt2) has 124,439,808 parameters (124M as published; the exact count is what
// transformers' GPT2LMHeadModel reports without the tied LM head): wte 50257*768 + wpe 1024*768 + 12 layers *
// (LN 2*1536 + attn 768*2304+2304 + proj 768*768+768 + fc 768*3072+3072 + proj 3072*768+768) + final LN 1536.
TEST(HfConfigTest, Gpt2SmallExactCount) {
  auto m = load_model(fixture("gpt2"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->mlp, MlpType::kGelu);
  EXPECT_EQ(m->intermediate_size, 3072);  // n_inner null -> 4 * n_embd
  EXPECT_TRUE(m->tie_embeddings);
  EXPECT_EQ(count_params(*m).total(), 124439808);
}

// Llama-2-7B: 6,738,415,616 parameters (the count transformers reports for meta-llama/Llama-2-7b-hf).
TEST(HfConfigTest, Llama2ExactCount) {
  auto m = load_model(fixture("llama-2-7b"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE(m->is_moe());
  EXPECT_EQ(m->head_dim, 128);
  EXPECT_EQ(count_params(*m).total(), 6738415616);
}

std::string hf_error(const std::string& text) {
  auto r = load_model_from_text(text, "x", "config.json");
  EXPECT_FALSE(r.ok()) << text;
  return r.ok() ? "" : r.status().message();
}

TEST(HfConfigTest, BadConfigsNameTheField) {
  EXPECT_NE(hf_error(R"({"model_type": "bert"})").find("model_type: 'bert' is not allowed; pick one of {"),
            std::string::npos);
  std::string base = R"({"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 32768, "vocab_size": 32000, "intermediate_size": 14336,
    "num_local_experts": 8, "num_experts_per_tok": 2)";
  auto with = [&](const std::string& extra) { return base + extra + "}"; };
  EXPECT_NE(hf_error(with("")).find("num_hidden_layers: required field is missing"), std::string::npos);
  Json j = Json::parse(with(R"(, "num_hidden_layers": 32)"));
  j["num_experts_per_tok"] = 9;
  EXPECT_NE(hf_error(j.dump()).find("num_experts_per_tok: 9 is out of range; allowed 1..num_local_experts=8"),
            std::string::npos);
  j["num_experts_per_tok"] = 2;
  j["num_attention_heads"] = 30;  // no head_dim: derived from hidden_size / heads
  EXPECT_NE(hf_error(j.dump()).find("num_attention_heads: 30 does not divide hidden_size=4096"), std::string::npos);
  j["num_attention_heads"] = 32;
  j["hidden_act"] = "relu";
  EXPECT_NE(hf_error(j.dump()).find("hidden_act: 'relu' is not allowed; pick one of {silu, swish}"), std::string::npos);
  j["hidden_act"] = "silu";
  j["num_key_value_heads"] = 5;
  EXPECT_NE(hf_error(j.dump()).find("num_key_value_heads: 5 must divide num_attention_heads=32"), std::string::npos);
}

}  // namespace
}  // namespace piper
