#include "piper/ir/passes/passes.h"

#include <gtest/gtest.h>

#include "piper/ir/layer_chain.h"
#include "piper/ir/verify.h"

namespace piper::ir {
namespace {

Graph chain(int layers, int pp, int vpp = 1) {
  MeshInfo mesh;
  mesh.pp = pp;
  mesh.vpp = vpp;
  return build_layer_chain(layers, mesh);
}

Directive place_stage(int lo, int hi, int stage) {
  PlaceDirective d;
  d.filter.layer = IntRange{lo, hi};
  d.stage = stage;
  return Directive{d};
}

Directive place_rank(int stage, int rank) {
  PlaceDirective d;
  d.filter.stage = IntRange::single(stage);
  d.rank = rank;
  return Directive{d};
}

TEST(PassesTest, AcyclicCheckAgreesWithTopoOrder) {
  Graph g = chain(3, 1);
  EXPECT_TRUE(g.is_acyclic());
  EXPECT_TRUE(g.topo_order().ok());
  // A temporal edge against a data edge closes a cycle.
  const Edge e = g.edge(0);
  g.add_edge(e.dst, e.src, EdgeKind::kTemporal);
  EXPECT_FALSE(g.is_acyclic());
  EXPECT_FALSE(g.topo_order().ok());
}

TEST(PassesTest, SplitClonesPerMicrobatchAndSharesUpdates) {
  Graph g = chain(2, 1);
  ASSERT_TRUE(apply_split(g, SplitDirective{3}).ok());
  EXPECT_EQ(g.num_microbatches, 3);
  int chunks = 0, updates = 0;
  for (const Node& n : g.nodes()) {
    chunks += n.kind == NodeKind::kChunk;
    updates += n.kind == NodeKind::kUpdate;
  }
  EXPECT_EQ(chunks, 2 * 2 * 3);
  EXPECT_EQ(updates, 2);
  // Each update is fed by the backward of every microbatch.
  for (const Node& n : g.nodes()) {
    if (n.kind == NodeKind::kUpdate) {
      EXPECT_EQ(g.preds(n.id).size(), 3u);
    }
  }
  EXPECT_TRUE(verify_graph(g).ok());
  Status again = apply_split(g, SplitDirective{2});
  EXPECT_FALSE(again.ok());
}

// The graph-wide sizes survive the split: EP dispatch/combine are sized top_k x hidden from moe_top_k, plan memory
// and cost annotations from param_bytes and grad_bytes (the split once reset them to 1, 2 and 4).
TEST(PassesTest, SplitKeepsTheGraphWideSizes) {
  Graph g = chain(2, 1);
  g.moe_top_k = 8;
  g.param_bytes = 4;
  g.grad_bytes = 2;
  ASSERT_TRUE(apply_split(g, SplitDirective{2}).ok());
  EXPECT_EQ(g.moe_top_k, 8);
  EXPECT_EQ(g.param_bytes, 4);
  EXPECT_EQ(g.grad_bytes, 2);
}

TEST(PassesTest, PlaceRejectsStagesAndRanksThatDoNotExist) {
  Graph g = chain(4, 2);
  std::vector<Directive> ds = {place_stage(0, 1, 0), place_stage(2, 3, 5)};
  Status s = apply_directives(g, ds);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("directive 1 (place): stage 5 does not exist"), std::string::npos) << s.message();
  g = chain(4, 2);
  s = apply_directives(g, {place_stage(0, 1, 0), place_rank(0, 2)});
  EXPECT_NE(s.message().find("pipeline rank 2 does not exist"), std::string::npos) << s.message();
  g = chain(4, 2);
  s = apply_directives(g, {place_stage(7, 9, 0)});
  EXPECT_NE(s.message().find("layer 7-9 is outside the model's 4 layers (allowed layer 0..3)"), std::string::npos)
      << s.message();
}

// A layer filter 0-99 on a 4-layer model matched layers 0-3 without a word: a file written for another model.
TEST(PassesTest, FiltersOutsideTheModelOrPlanAreRefused) {
  Graph g = chain(4, 2);
  Status s = apply_directives(g, {place_stage(0, 99, 0)});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(
      s.message().find("directive 0 (place): filter {\"layer\":\"0-99\"}: layer 0-99 is outside the model's 4 layers "
                       "(allowed layer 0..3)"),
      std::string::npos)
      << s.message();
  g = chain(4, 2);
  PlaceDirective by_stage;
  by_stage.filter.stage = IntRange{0, 5};
  by_stage.rank = 0;
  s = apply_directives(g, {place_stage(0, 3, 0), Directive{by_stage}});
  EXPECT_NE(s.message().find("stage 0-5 is outside the mesh's pp*vpp = 2 stages (allowed stage 0..1)"),
            std::string::npos)
      << s.message();
  g = chain(4, 2);
  StreamDirective by_mb;
  by_mb.filter.mb = IntRange{0, 7};
  by_mb.stream = "x";
  s = apply_directives(g, {Directive{SplitDirective{4}}, Directive{by_mb}});
  EXPECT_NE(s.message().find("mb 0-7 is outside the plan's 4 microbatches (split comes first) (allowed mb 0..3)"),
            std::string::npos)
      << s.message();
  g = chain(4, 2);
  EXPECT_TRUE(apply_directives(g, {place_stage(0, 3, 0)}).ok());  // exactly the model's layers
}

// The split graph is bounded before it is allocated.
TEST(PassesTest, SplitRefusesAGraphPastTheNodeBound) {
  Graph g = chain(512, 1);  // ~1.5k nodes x 65536 microbatches = ~10^8 nodes
  Status s = apply_directives(g, {Directive{SplitDirective{65536}}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("split into 65536 microbatches would make a graph of"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("allowed <= 4194304 nodes"), std::string::npos) << s.message();
}

TEST(PassesTest, OrderSplitsOnlyTheNamedBackwardsAndChainsSlots) {
  Graph g = chain(1, 1);
  OrderDirective o;
  o.rank = 0;
  o.slots = {{stage_filter(0, 0, Pass::kF)},
             {stage_filter(0, 1, Pass::kF)},
             {stage_filter(0, 0, Pass::kB)},
             {stage_filter(0, 1, Pass::kBW), stage_filter(0, 0, Pass::kW)}};
  Status s = apply_directives(g, {Directive{SplitDirective{2}}, place_stage(0, 0, 0), place_rank(0, 0), Directive{o}});
  ASSERT_TRUE(s.ok()) << s.message();
  int w = 0, bw = 0;
  for (const Node& n : g.nodes()) {
    w += n.tags.pass == Pass::kW;
    bw += n.tags.pass == Pass::kBW;
  }
  EXPECT_EQ(w, 1);   // mb 0 split
  EXPECT_EQ(bw, 1);  // mb 1 kept fused
  NodeId f1 = g.select(stage_filter(0, 1, Pass::kF))[0];
  NodeId b0 = g.select(stage_filter(0, 0, Pass::kB))[0];
  EXPECT_TRUE(g.has_edge(f1, b0, EdgeKind::kTemporal));
  // The overlapped slot's members are not ordered against each other.
  NodeId bw1 = g.select(stage_filter(0, 1, Pass::kBW))[0];
  NodeId w0 = g.select(stage_filter(0, 0, Pass::kW))[0];
  EXPECT_FALSE(g.has_edge(bw1, w0, EdgeKind::kTemporal));
  EXPECT_FALSE(g.has_edge(w0, bw1, EdgeKind::kTemporal));
  EXPECT_EQ(g.node(w0).order_slot, g.node(bw1).order_slot);
}

TEST(PassesTest, OrderErrors) {
  Graph g = chain(2, 2);
  std::vector<Directive> base = {Directive{SplitDirective{2}}, place_stage(0, 0, 0), place_stage(1, 1, 1),
                                 place_rank(0, 0), place_rank(1, 1)};
  ASSERT_TRUE(apply_directives(g, base).ok());
  OrderDirective cross;
  cross.rank = 0;
  cross.slots = {{stage_filter(1, 0, Pass::kF)}};
  Graph g1 = g;
  Status s = apply_order(g1, cross);
  EXPECT_NE(s.message().find("is on rank 1, not rank 0"), std::string::npos) << s.message();
  OrderDirective cyc;
  cyc.rank = 0;
  cyc.slots = {{stage_filter(0, 0, Pass::kBW)}, {stage_filter(0, 0, Pass::kF)}};
  Graph g2 = g;
  s = apply_order(g2, cyc);
  EXPECT_NE(s.message().find("cycle"), std::string::npos) << s.message();
  OrderDirective twice;
  twice.rank = 0;
  twice.slots = {{stage_filter(0, 0, Pass::kF)}, {stage_filter(0, 0, Pass::kF)}};
  Graph g3 = g;
  s = apply_order(g3, twice);
  EXPECT_NE(s.message().find("already ordered"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace piper::ir
