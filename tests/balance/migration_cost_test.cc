// One migration cost model for the trainer and `piper simulate --expert-zipf` (balance/migration_cost.h).
#include "piper/balance/migration_cost.h"

#include <gtest/gtest.h>

#include "piper/spec/cluster_loader.h"
#include "piper/spec/counting.h"
#include "piper/spec/model_loader.h"

namespace piper::balance {
namespace {

TrainSpec fp32_train() {
  TrainSpec t;
  t.param_dtype = t.grad_dtype = t.master_dtype = t.optimizer_dtype = DType::kFP32;
  return t;
}

TEST(MigrationCostTest, Fp32ExpertMovesWeightsGradientsAndBothMoments) {
  const ModelSpec m = load_model("tiny-moe").value();
  // tiny-moe's experts are gated MLPs without bias: 3 h f parameters, each 4 + 4 + 2 x 4 bytes in fp32 (no master
  // copy: the weights are the master).
  const double h = static_cast<double>(m.hidden_size);
  const double f = static_cast<double>(m.moe.expert_intermediate_size);
  ASSERT_EQ(expert_params(m), static_cast<int64_t>(3 * h * f));
  EXPECT_EQ(expert_migration_bytes(m, fp32_train(), 1), 16.0 * 3.0 * h * f);
}

TEST(MigrationCostTest, MixedPrecisionAddsTheMasterCopyAndEtpSlicesTheExpert) {
  const ModelSpec m = load_model("mixtral-8x7b").value();
  TrainSpec t;  // bf16 weights, fp32 gradients, fp32 master, fp32 moments
  const double params = static_cast<double>(expert_params(m));
  EXPECT_EQ(expert_migration_bytes(m, t, 1), params * (2 + 4 + 2 * 4 + 4));
  EXPECT_EQ(expert_migration_bytes(m, t, 2), params * (2 + 4 + 2 * 4 + 4) / 2);
}

TEST(MigrationCostTest, MovesOverTheIntraNodeLink) {
  const ModelSpec m = load_model("tiny-moe").value();
  const ClusterSpec c = load_cluster("dgx-h100", 1).value();
  const MigrationCost cost = migration_cost(m, fp32_train(), c, 1, 10, 2e-6);
  EXPECT_EQ(cost.link_bw_bytes_per_s, c.node.intra.bw_bytes_per_s);
  EXPECT_EQ(cost.link_latency_s, c.node.intra.latency_s);
  EXPECT_EQ(cost.steps_next_window, 10);
  EXPECT_EQ(cost.time_per_token_s, 2e-6);
  EXPECT_TRUE(cost.validate().ok());
}

}  // namespace
}  // namespace piper::balance
