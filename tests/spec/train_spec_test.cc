#include "piper/spec/train_spec.h"

#include <gtest/gtest.h>

#include "piper/spec/train_json.h"

namespace piper {
namespace {

TEST(TrainSpecTest, OptimizerStateBuffersPerParameter) {
  OptimizerSpec o;
  for (const char* name : {"adam", "adamw"}) {
    o.name = name;
    EXPECT_EQ(*optimizer_state_buffers(o), 2) << name;
  }
  o.name = "sgd";
  EXPECT_EQ(*optimizer_state_buffers(o), 1);
  o.name = "lion";
  Result<int> bad = optimizer_state_buffers(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'lion' has no memory model"), std::string::npos);
}

TEST(TrainSpecTest, JsonRoundTripAndDefaults) {
  auto t = train_from_json(Json::parse(R"({"global_batch": 64, "micro_batch_size": 2, "seq_len": 128,
                                           "param_dtype": "fp32", "optimizer": {"lr": 1e-3}})"),
                           "t");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->tokens_per_step(), 64 * 128);
  EXPECT_EQ(t->param_dtype, DType::kFP32);
  EXPECT_EQ(t->grad_dtype, DType::kFP32);  // default
  EXPECT_DOUBLE_EQ(t->optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(t->optimizer.beta2, 0.95);  // default
  auto again = train_from_json(Json::parse(to_json(*t).dump()), "round trip");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(to_json(*again).dump(), to_json(*t).dump());
}

std::string error_of(const std::string& text) {
  auto t = train_from_json(Json::parse(text), "train.json");
  EXPECT_FALSE(t.ok()) << text;
  return t.ok() ? "" : t.status().message();
}

TEST(TrainSpecTest, BadInputNamesTheField) {
  EXPECT_NE(error_of(R"({"seq_len": 128})").find("train.global_batch: required field is missing"), std::string::npos);
  EXPECT_NE(error_of(R"({"global_batch": 10, "micro_batch_size": 4})")
                .find("train.micro_batch_size: 4 does not divide global_batch=10"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"global_batch": 8, "param_dtype": "int8"})")
                .find("train.param_dtype: 'int8' is not allowed; pick one of {fp32, bf16, fp16, fp8}"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"global_batch": 8, "optimizer": {"name": "sgd"}})")
                .find("train.optimizer.name: 'sgd' is not allowed; pick one of {adamw}"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"global_batch": 8, "optimizer": {"beta1": 1.5}})").find("beta1 and beta2 must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"global_batch": 8, "seq": 4})").find("unknown field(s): train.seq"), std::string::npos);
}

}  // namespace
}  // namespace piper
