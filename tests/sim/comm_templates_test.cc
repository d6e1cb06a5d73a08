// CommTemplates: representative (aggregate) templates complete when the full set of flows does, and transfers
// crossing the same NIC contend.
#include "piper/sim/comm_templates.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "test_clusters.h"

namespace piper::sim {
namespace {

// A Plan skeleton with the compiler's rank numbering (tp innermost, then dp, then pp).
compile::Plan make_plan(int pp, int dp, int ep, int tp) {
  compile::Plan plan;
  plan.mesh.pp = pp;
  plan.mesh.dp = dp;
  plan.mesh.ep = ep;
  plan.mesh.tp = tp;
  plan.world_size = pp * dp * tp;
  plan.templates.resize(static_cast<size_t>(pp));
  for (int rank = 0; rank < plan.world_size; ++rank) {
    compile::RankCoord c;
    c.tp = rank % tp;
    c.dp = (rank / tp) % dp;
    c.ep = c.dp % ep;
    c.pp = rank / (tp * dp);
    plan.coords.push_back(c);
    plan.rank_template.push_back(c.pp);
  }
  return plan;
}

struct Started {
  const FlowTemplate* tmpl;
  double payload;
};

// Starts every transfer at t = 0 and returns each one's completion time.
std::vector<double> run(const Network& net, const std::vector<Started>& transfers) {
  FluidNet fluid(net.link_bandwidths());
  for (size_t i = 0; i < transfers.size(); ++i)
    fluid.start(transfers[i].tmpl, transfers[i].payload, 0.0, static_cast<int64_t>(i));
  std::vector<double> done(transfers.size(), -1);
  std::vector<int64_t> out;
  while (!fluid.idle()) {
    const double t = fluid.next_time();
    out.clear();
    fluid.advance(t, &out);
    for (int64_t k : out) done[static_cast<size_t>(k)] = t;
  }
  return done;
}

Network net_of(int nodes, int gpus, int nics) {
  return Network::build(testing::make_cluster(nodes, gpus, 400e9, nics, 50e9, 2e-6, 5e-6)).value();
}

TEST(CommTemplatesTest, GroupsFollowTheCompilerNumbering) {
  compile::Plan plan = make_plan(2, 4, 2, 2);  // 16 ranks
  Network net = net_of(2, 8, 8);
  auto ct = CommTemplates::create(net, plan, false);
  ASSERT_TRUE(ct.ok());
  EXPECT_EQ(ct->group(11, "tp").value(), (std::vector<int>{10, 11}));
  EXPECT_EQ(ct->group(11, "dp").value(), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(ct->group(11, "ep").value(), (std::vector<int>{9, 11}));
  EXPECT_EQ(ct->group(11, "edp").value(), (std::vector<int>{10, 11, 14, 15}));  // with both tp ranks
  EXPECT_FALSE(ct->group(0, "pp").ok());
}

TEST(CommTemplatesTest, RepresentativeAllToAllEqualsFullGroup) {
  for (int nics : {1, 4}) {
    compile::Plan plan = make_plan(1, 8, 8, 1);  // one EP group over 2 nodes x 4 GPUs
    Network net = net_of(2, 4, nics);
    auto full = CommTemplates::create(net, plan, false).value();
    auto reduced = CommTemplates::create(net, plan, true).value();
    const FlowTemplate* f = full.collective(0, ir::NodeKind::kAllToAll, "ep", "flat").value();
    const FlowTemplate* r = reduced.collective(0, ir::NodeKind::kAllToAll, "ep", "flat").value();
    EXPECT_EQ(f->flows.size(), 56u);  // 8 x 7 flows
    EXPECT_EQ(r->flows.size(), 28u);  // those leaving the representative's node
    const double t_full = run(net, {{f, 64e6}})[0];
    const double t_red = run(net, {{r, 64e6}})[0];
    EXPECT_NEAR(t_red, t_full, 1e-9 * t_full) << nics << " NICs";
  }
}

TEST(CommTemplatesTest, RepresentativeRingEqualsAllParallelRings) {
  // dp rings of the two tp coordinates run at once over 2 nodes sharing 1 NIC per node.
  compile::Plan plan = make_plan(1, 4, 1, 2);
  Network net = net_of(2, 4, 1);
  auto full = CommTemplates::create(net, plan, false).value();
  auto reduced = CommTemplates::create(net, plan, true).value();
  const FlowTemplate* ring0 = full.collective(0, ir::NodeKind::kAllReduce, "dp", "ring").value();
  const FlowTemplate* ring1 = full.collective(1, ir::NodeKind::kAllReduce, "dp", "ring").value();
  const FlowTemplate* rep = reduced.collective(0, ir::NodeKind::kAllReduce, "dp", "ring").value();
  std::vector<double> both = run(net, {{ring0, 1e9}, {ring1, 1e9}});
  const double alone = run(net, {{ring0, 1e9}})[0];
  const double t_rep = run(net, {{rep, 1e9}})[0];
  EXPECT_GT(both[0], 1.5 * alone);  // the two rings share the NIC
  EXPECT_NEAR(t_rep, std::max(both[0], both[1]), 1e-9 * both[0]);
}

TEST(CommTemplatesTest, RepresentativeMultiChannelRingsEqualTheFullGroup) {
  // dp=16 over 2 nodes x 8 GPUs with a NIC per GPU: 8 ring channels, each crossing through another NIC.
  for (ir::NodeKind kind : {ir::NodeKind::kAllReduce, ir::NodeKind::kReduceScatter, ir::NodeKind::kAllGather}) {
    compile::Plan plan = make_plan(1, 16, 1, 1);
    Network net = net_of(2, 8, 8);
    auto full = CommTemplates::create(net, plan, false).value();
    auto reduced = CommTemplates::create(net, plan, true).value();
    const FlowTemplate* f = full.collective(0, kind, "dp", "ring").value();
    const FlowTemplate* r = reduced.collective(0, kind, "dp", "ring").value();
    const double t_full = run(net, {{f, 1e9}})[0];
    const double t_red = run(net, {{r, 1e9}})[0];
    EXPECT_NEAR(t_red, t_full, 1e-9 * t_full) << ir::to_string(kind);
    // The closed form's bandwidth: min(intra, 8 NIC shares) = 400 GB/s, plus 2(n-1) or (n-1) latencies.
    const double steps = kind == ir::NodeKind::kAllReduce ? 30 : 15;
    EXPECT_NEAR(t_full, steps / 16 * 1e9 / 400e9 + steps * 5e-6, 0.02 * t_full) << ir::to_string(kind);
  }
}

TEST(CommTemplatesTest, AllToAllAndAllReduceOnTheSameNicContend) {
  compile::Plan plan = make_plan(1, 8, 8, 1);
  Network net = net_of(2, 4, 1);
  auto ct = CommTemplates::create(net, plan, true).value();
  const FlowTemplate* a2a = ct.collective(0, ir::NodeKind::kAllToAll, "ep", "flat").value();
  const FlowTemplate* ar = ct.collective(0, ir::NodeKind::kAllReduce, "dp", "ring").value();
  const double a2a_alone = run(net, {{a2a, 256e6}})[0];
  const double ar_alone = run(net, {{ar, 512e6}})[0];
  std::vector<double> both = run(net, {{a2a, 256e6}, {ar, 512e6}});
  EXPECT_GT(both[0], 1.2 * a2a_alone);
  EXPECT_GT(both[1], 1.2 * ar_alone);
  // Sharing loses little: together they take about as long as one after the other (max-min is not perfectly
  // work-conserving across different bottleneck links).
  EXPECT_LE(std::max(both[0], both[1]), (a2a_alone + ar_alone) * 1.05);
}

// Pipeline slices on whole nodes run the same groups, so a slice's collective templates are another slice's with
// the links moved (CommTemplates::set_reuse_slices). Every translated template must equal the one built from the
// slice's own group instances: same flows, hops (links and weights), bytes, latencies and dependencies. Cases: one
// fabric group; several groups that the move keeps (2 nodes per slice, 2 per group); slices of half a group (moves
// by two slices are whole groups: translated, the others built); groups of 3 nodes (only the move by 6 nodes is
// whole groups, onto the partial last group: the templates that cross its narrower fabric are built, those inside a
// node translated); a partial last group whose fabric is narrower (built); slices that share a node (built).
TEST(CommTemplatesTest, TranslatedSliceTemplatesEqualBuiltOnes) {
  struct Case {
    int nodes, gpus, nics, per_group, pp, dp, ep, tp;
    bool translates;
  };
  for (const Case& k : {Case{4, 4, 2, 0, 4, 4, 4, 1, true}, Case{8, 4, 2, 2, 4, 8, 4, 1, true},
                        Case{8, 4, 2, 4, 4, 4, 2, 2, true}, Case{8, 4, 2, 3, 4, 8, 4, 1, true},
                        Case{6, 4, 2, 4, 3, 8, 8, 1, false},
                        Case{2, 4, 2, 0, 4, 2, 2, 1, false}}) {
    ClusterSpec c = testing::make_cluster(k.nodes, k.gpus, 400e9, k.nics, 50e9, 2e-6, 5e-6);
    c.fabric.nodes_per_group = k.per_group;
    c.fabric.intra_group_taper = 1.5;
    Network net = Network::build(c).value();
    compile::Plan plan = make_plan(k.pp, k.dp, k.ep, k.tp);
    CommTemplates moved = CommTemplates::create(net, plan, true).value();
    CommTemplates built = CommTemplates::create(net, plan, true).value();
    built.set_reuse_slices(false);
    HaloSimModel halo;
    halo.routing = cost::HaloRouting{16, 2, 1, 1};
    halo.dispatch_token_bytes = halo.token_bytes = 64;
    moved.set_halo_model(halo);
    built.set_halo_model(halo);
    const std::string at = std::to_string(k.nodes) + " nodes, pp=" + std::to_string(k.pp) + " dp=" +
                           std::to_string(k.dp) + " tp=" + std::to_string(k.tp) + " per group " +
                           std::to_string(k.per_group);
    for (auto [kind, axis, algorithm] :
         {std::make_tuple(ir::NodeKind::kAllReduce, "dp", "ring"), std::make_tuple(ir::NodeKind::kAllToAll, "ep", "flat"),
          std::make_tuple(ir::NodeKind::kAllToAll, "ep", "halo:dispatch:64:6400"),
          std::make_tuple(ir::NodeKind::kAllToAll, "ep", "halo:combine:64:6400"),
          std::make_tuple(ir::NodeKind::kReduceScatter, "dp", "ring"),
          std::make_tuple(ir::NodeKind::kAllGather, "tp", "ring")}) {
      if (std::string(axis) == "tp" && k.tp == 1) continue;
      for (int pp = 0; pp < k.pp; ++pp) {
        const int rank = pp * k.dp * k.tp;
        auto a = moved.collective(rank, kind, axis, algorithm);
        auto b = built.collective(rank, kind, axis, algorithm);
        ASSERT_TRUE(a.ok() && b.ok()) << at << " " << axis;
        ASSERT_EQ((*a)->flows.size(), (*b)->flows.size()) << at << " " << axis << " pp " << pp;
        for (size_t f = 0; f < (*a)->flows.size(); ++f) {
          const FlowTemplate::Flow& x = (*a)->flows[f];
          const FlowTemplate::Flow& y = (*b)->flows[f];
          EXPECT_EQ(x.bytes, y.bytes);
          EXPECT_EQ(x.latency_s, y.latency_s);
          EXPECT_EQ(x.after, y.after);
          EXPECT_EQ(x.children, y.children);
          ASSERT_EQ(x.hops.size(), y.hops.size()) << at << " " << axis << " pp " << pp << " flow " << f;
          for (size_t h = 0; h < x.hops.size(); ++h) {
            EXPECT_EQ(x.hops[h].link, y.hops[h].link) << at << " " << axis << " pp " << pp << " flow " << f;
            EXPECT_EQ(x.hops[h].weight, y.hops[h].weight);
          }
        }
      }
    }
    EXPECT_EQ(built.num_translated(), 0);
    EXPECT_EQ(moved.num_translated() > 0, k.translates) << at << ": " << moved.num_translated() << " translated";
  }
}

TEST(CommTemplatesTest, TooFewDevicesIsAnError) {
  compile::Plan plan = make_plan(2, 8, 1, 1);
  Network net = net_of(1, 8, 1);
  auto ct = CommTemplates::create(net, plan, true);
  ASSERT_FALSE(ct.ok());
  EXPECT_NE(ct.status().message().find("raise --nodes"), std::string::npos);
}

}  // namespace
}  // namespace piper::sim
