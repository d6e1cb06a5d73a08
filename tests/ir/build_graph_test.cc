// build_graph: the single-device DAG agrees with the spec's own parameter and FLOP counts (one source of truth).
#include "piper/ir/build_graph.h"

#include <gtest/gtest.h>

#include <cmath>

#include "piper/ir/passes/passes.h"
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

namespace piper::ir {
namespace {

// Module recomputation (Megatron's --recompute-modules layernorm moe_act) drops the router's pre-MLP norm output
// (whole, h per token) and the experts' activation output (k f per token) from the forward chunks; it counts
// unsharded bytes, so after a shard directive it is refused, and a model without MoE layers has nothing to drop.
TEST(BuildGraphTest, RecomputeModulesDropTheNormAndActivationOutputs) {
  auto model = load_model("tiny-moe");
  ASSERT_TRUE(model.ok()) << model.status().message();
  const TrainSpec t = train(128);
  const int64_t tokens = t.micro_batch_size * t.seq_len;
  auto base = build_graph(*model, t, MeshInfo{});
  ASSERT_TRUE(base.ok()) << base.status().message();
  Graph g = *base;
  RecomputeDirective d;
  d.filter.pass = Pass::kF;
  d.modules = {"layernorm", "moe_act"};
  ASSERT_TRUE(apply_recompute(g, d).ok());
  int routers = 0, experts = 0;
  for (size_t i = 0; i < g.num_nodes(); ++i) {
    const Node& before = base->node(static_cast<NodeId>(i));
    const Node& after = g.node(static_cast<NodeId>(i));
    EXPECT_FALSE(after.recompute) << after.name;
    if (after.kind != NodeKind::kChunk || after.tags.pass != Pass::kF) continue;
    const int64_t dropped = before.activation_bytes - after.activation_bytes;
    if (after.tags.part == "router") {
      ++routers;
      EXPECT_EQ(dropped, tokens * model->hidden_size * 2) << after.name;
      EXPECT_EQ(before.activation_whole_bytes - after.activation_whole_bytes, dropped) << after.name;
    } else if (after.tags.part == "experts") {
      ++experts;
      EXPECT_EQ(dropped, tokens * model->moe.top_k * model->moe.expert_intermediate_size * 2) << after.name;
    } else {
      EXPECT_EQ(dropped, 0) << after.name;
    }
  }
  EXPECT_EQ(routers, model->num_moe_layers());
  EXPECT_EQ(experts, model->num_moe_layers());

  Graph sharded = *base;
  ShardDirective ep;
  ep.filter.part = "experts";
  ep.axis = "ep";
  sharded.mesh.ep = 2;
  sharded.mesh.dp = 2;
  ASSERT_TRUE(apply_shard(sharded, ep).ok());
  Status late = apply_recompute(sharded, d);
  EXPECT_NE(late.message().find("before the shard directives"), std::string::npos) << late.message();

  auto dense = load_model("gpt-1.7b");
  ASSERT_TRUE(dense.ok()) << dense.status().message();
  auto plain = build_graph(*dense, t, MeshInfo{});
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  Status none = apply_recompute(*plain, d);
  EXPECT_NE(none.message().find("matches no MoE router or experts"), std::string::npos) << none.message();
}

}  // namespace
}  // namespace piper::ir
