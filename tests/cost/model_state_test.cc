// Model-state memory against published numbers; every row cites its source.
#include "piper/cost/model_state.h"

#include <gtest/gtest.h>

namespace piper::cost {
namespace {

// Megatron-LM megatron/training/theoretical_memory_usage.py: 18 bytes/param without the distributed
// optimizer (bf16 param 2 + fp32 grad 4 + fp32 master 4 + Adam 8), 6 + 12/dp with it.
TEST(ModelStateTest, MegatronBytesPerParam) {
  TrainSpec train;  // bf16 params, fp32 grads, fp32 master, fp32 Adam moments: Megatron's mixed precision
  auto b = ByteConvention::from_train(train);
  ASSERT_TRUE(b.ok());
  EXPECT_DOUBLE_EQ(b->total(), 18.0);
  struct Row {
    int dp;
    double bytes_per_param;  // Megatron: 6 + 12/dp with --use-distributed-optimizer
  };
  const Row rows[] = {{1, 18.0}, {2, 12.0}, {8, 7.5}, {64, 6.1875}, {128, 6.09375}};
  for (const auto& row : rows) {
    EXPECT_DOUBLE_EQ(model_state_bytes(1.0, 0, row.dp, *b).total(), 18.0) << "no sharding at ZeRO-0, dp=" << row.dp;
    EXPECT_DOUBLE_EQ(model_state_bytes(1.0, 1, row.dp, *b).total(), row.bytes_per_param) << "dp=" << row.dp;
  }
}

// ZeRO paper (Rajbhandari et al., arXiv:1910.02054, Figure 1): Psi = 7.5B, N_d = 64, K = 12, fp16 params and
// grads (16 bytes/param): 120 GB, 31.4 GB, 16.6 GB, 1.9 GB for the baseline and stages 1, 2, 3.
TEST(ModelStateTest, ZeroPaperFigure1) {
  TrainSpec train;
  train.param_dtype = DType::kFP16;
  train.grad_dtype = DType::kFP16;
  auto b = ByteConvention::from_train(train);
  ASSERT_TRUE(b.ok());
  EXPECT_DOUBLE_EQ(b->total(), 16.0);
  const double psi = 7.5e9;
  const double expected_gb[] = {120.0, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    double gb = model_state_bytes(psi, stage, 64, *b).total() / 1e9;
    EXPECT_NEAR(gb, expected_gb[stage], 0.05) << "ZeRO stage " << stage;
  }
  // The parts ZeRO-2 keeps whole: the fp16 parameters (2 Psi = 15 GB).
  EXPECT_DOUBLE_EQ(model_state_bytes(psi, 2, 64, *b).params, 15e9);
}

TEST(ModelStateTest, ConventionFollowsTrainDtypes) {
  TrainSpec train;
  train.master_dtype = DType::kBF16;  // no separate master copy
  train.optimizer.name = "sgd";
  auto b = ByteConvention::from_train(train);
  ASSERT_TRUE(b.ok());
  EXPECT_DOUBLE_EQ(b->master, 0.0);
  EXPECT_DOUBLE_EQ(b->optimizer, 4.0);
  train.optimizer.name = "lion";
  auto bad = ByteConvention::from_train(train);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("use adam, adamw or sgd"), std::string::npos);
  // Adam step traffic: read grad 4, read+write master 4 and moments 8, write the bf16 copy 2.
  EXPECT_DOUBLE_EQ(optimizer_step_bytes_per_param(*ByteConvention::from_train(TrainSpec{})), 4 + 2 * 12 + 2);
}

}  // namespace
}  // namespace piper::cost
