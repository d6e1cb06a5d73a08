// build_graph: the single-device DAG agrees with the spec's own parameter and FLOP counts (one source of truth).
#include "piper/ir/build_graph.h"

#include <gtest/gtest.h>

#include <cmath>

#include "piper/spec/counting.h"
#include "piper/spec/model_loader.h"

namespace piper::ir {
namespace {

TrainSpec train(int64_t seq_len) {
  TrainSpec t;
  t.micro_batch_size = 2;
  t.seq_len = seq_len;
  return t;
}

class BuildGraphTest : public ::testing::TestWithParam<const char*> {};

TEST_P(BuildGraphTest, ChunksAddUpToTheSpecCounts) {
  auto model = load_model(GetParam());
  ASSERT_TRUE(model.ok()) << model.status().message();
  const TrainSpec t = train(512);
  auto g = build_graph(*model, t, MeshInfo{});
  ASSERT_TRUE(g.ok()) << g.status().message();
  int64_t params = 0;
  double fwd_flops = 0, bwd_flops = 0;
  int moe_layers = 0, updates = 0;
  for (const Node& n : g->nodes()) {
    if (n.kind == NodeKind::kUpdate) ++updates;
    if (n.kind != NodeKind::kChunk) continue;
    if (n.tags.pass == Pass::kF) {
      params += n.param_count;
      fwd_flops += static_cast<double>(n.flops);
      moe_layers += n.tags.part == "experts";
    } else {
      bwd_flops += static_cast<double>(n.flops);
    }
  }
  EXPECT_EQ(params, count_params(*model).total());
  const double tokens = static_cast<double>(t.micro_batch_size * t.seq_len);
  EXPECT_NEAR(fwd_flops, forward_flops_per_token(*model, t.seq_len) * tokens, 1e-6 * fwd_flops);  // rounding
  EXPECT_NEAR(bwd_flops, 2 * fwd_flops, 1e-9 * fwd_flops);
  EXPECT_EQ(moe_layers, model->num_moe_layers());
  // One update node per chunk: embed, head, attn per layer, and router+experts(+shared) or mlp per layer.
  const int per_moe = 2 + (model->moe.num_shared_experts > 0 ? 1 : 0);
  EXPECT_EQ(updates, 2 + model->num_layers + model->num_dense_layers() + per_moe * model->num_moe_layers());
}

INSTANTIATE_TEST_SUITE_P(Presets, BuildGraphTest,
                         ::testing::Values("tiny-moe", "deepseek-v3", "mixtral-8x7b", "gpt-oss-20b", "gpt-1.7b"));

TEST(BuildGraphErrorTest, RejectsEmptyModelAndBatch) {
  ModelSpec m;
  auto g = build_graph(m, train(64), MeshInfo{});
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("num_layers"), std::string::npos) << g.status().message();
  auto tiny = load_model("tiny-moe");
  ASSERT_TRUE(tiny.ok());
  g = build_graph(*tiny, train(0), MeshInfo{});
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("seq_len"), std::string::npos) << g.status().message();
}

}  // namespace
}  // namespace piper::ir
