#include "piper/sim/flow_sim.h"

#include <gtest/gtest.h>

namespace piper::sim {
namespace {

FlowSpec flow(std::vector<int> links, double bytes, double latency_s = 0, std::vector<int> after = {}) {
  FlowSpec f;
  for (int l : links) f.hops.push_back({l, 1.0});
  f.bytes = bytes;
  f.latency_s = latency_s;
  f.after = std::move(after);
  return f;
}

TEST(FlowSimTest, AFlowAloneGetsTheLinkBandwidth) {
  FlowSim sim({10e9});
  ASSERT_TRUE(sim.add(flow({0}, 1e9, 5e-6)).ok());
  EXPECT_DOUBLE_EQ(sim.run()[0], 5e-6 + 0.1);
}

TEST(FlowSimTest, TwoFlowsOnOneLinkEachGetHalf) {
  FlowSim sim({10e9, 40e9});
  ASSERT_TRUE(sim.add(flow({0, 1}, 1e9)).ok());
  ASSERT_TRUE(sim.add(flow({0}, 1e9)).ok());
  const std::vector<double> t = sim.run();
  EXPECT_DOUBLE_EQ(t[0], 0.2);
  EXPECT_DOUBLE_EQ(t[1], 0.2);
  EXPECT_EQ(max_min_rates({10e9, 40e9}, {&sim.flow(0).hops, &sim.flow(1).hops}), (std::vector<double>{5e9, 5e9}));
}

TEST(FlowSimTest, ThreeFlowsWithDifferentBottlenecksByHand) {
  // Links: L0 = 10, L1 = 4, L2 = 1 (bytes/s). A crosses L0 and L1, B crosses L0, C crosses L1 and L2.
  // Progressive filling: L2 saturates first at level 1 (C = 1); L1 then has 4 - 1 = 3 for A (A = 3); L0 leaves
  // 10 - 3 = 7 for B. Max-min allocation (A, B, C) = (3, 7, 1).
  const std::vector<Hop> a = {{0, 1}, {1, 1}}, b = {{0, 1}}, c = {{1, 1}, {2, 1}};
  EXPECT_EQ(max_min_rates({10, 4, 1}, {&a, &b, &c}), (std::vector<double>{3, 7, 1}));
  // As a simulation: sizes 6, 7, 1. Until t = 1 the rates are (3, 7, 1): B and C finish, A has 3 left and
  // now has L1 to itself (4/s): it ends at 1 + 3/4.
  FlowSim sim({10, 4, 1});
  ASSERT_TRUE(sim.add(flow({0, 1}, 6)).ok());
  ASSERT_TRUE(sim.add(flow({0}, 7)).ok());
  ASSERT_TRUE(sim.add(flow({1, 2}, 1)).ok());
  FlowSim::Stats stats;
  const std::vector<double> t = sim.run(&stats);
  EXPECT_DOUBLE_EQ(t[0], 1.75);
  EXPECT_DOUBLE_EQ(t[1], 1.0);
  EXPECT_DOUBLE_EQ(t[2], 1.0);
  EXPECT_EQ(stats.rate_updates, 2);
}

TEST(FlowSimTest, RatesAreRecomputedWhenAFlowEnds) {
  // Two flows on a 10 B/s link: both at 5 until the 10-byte one ends at t=2, then the other alone at 10.
  FlowSim sim({10});
  ASSERT_TRUE(sim.add(flow({0}, 10)).ok());
  ASSERT_TRUE(sim.add(flow({0}, 20)).ok());
  const std::vector<double> t = sim.run();
  EXPECT_DOUBLE_EQ(t[0], 2);
  EXPECT_DOUBLE_EQ(t[1], 3);
}

TEST(FlowSimTest, RatesAreRecomputedWhenAFlowStarts) {
  // A alone at 10 B/s for 1 s (10 of 30 bytes), then B (released at 1) shares: A's last 20 bytes at 5 B/s.
  FlowSim sim({10});
  ASSERT_TRUE(sim.add(flow({0}, 30)).ok());
  FlowSpec b = flow({0}, 10);
  b.release_s = 1;
  ASSERT_TRUE(sim.add(b).ok());
  const std::vector<double> t = sim.run();
  EXPECT_DOUBLE_EQ(t[1], 3);  // 10 bytes at 5 B/s
  EXPECT_DOUBLE_EQ(t[0], 4);  // 10 + 10 (shared) + 10 alone
}

TEST(FlowSimTest, DependenciesAndLatency) {
  FlowSim sim({10, 10});
  const int a = sim.add(flow({0}, 10, 0.5)).value();
  const int b = sim.add(flow({1}, 10, 0.25, {a})).value();
  const int local = sim.add(flow({}, 100, 0, {b})).value();  // no hops: done when its dependency is
  const std::vector<double> t = sim.run();
  EXPECT_DOUBLE_EQ(t[a], 1.5);
  EXPECT_DOUBLE_EQ(t[b], 2.75);
  EXPECT_DOUBLE_EQ(t[local], 2.75);
}

TEST(FlowSimTest, AggregateFlowEqualsIndividualSymmetricFlows) {
  // 4 ranks in a ring over private links tx[i] (cap 10) and rx[i] (cap 10) and one shared fabric (cap 20).
  // Class A: rank i sends 10 bytes to rank i+1; class B: rank i sends 30 bytes to rank i+2, latency 0.1.
  // Links 0..3 = tx, 4..7 = rx, 8 = fabric.
  const std::vector<double> caps = {10, 10, 10, 10, 10, 10, 10, 10, 20};
  FlowSim full(caps);
  std::vector<int> a_ids, b_ids;
  for (int i = 0; i < 4; ++i) a_ids.push_back(full.add(flow({i, 8, 4 + (i + 1) % 4}, 10)).value());
  for (int i = 0; i < 4; ++i) b_ids.push_back(full.add(flow({i, 8, 4 + (i + 2) % 4}, 30, 0.1)).value());
  const std::vector<double> t_full = full.run();
  // Representative: rank 0's transmit link, one representative receive link (each rx gets one flow of each
  // class), and the shared fabric loaded by all 4 members of each class.
  FlowSim agg(caps);
  FlowSpec a;
  a.hops = {{0, 1}, {8, 4}, {4, 1}};
  a.bytes = 10;
  FlowSpec b = a;
  b.bytes = 30;
  b.latency_s = 0.1;
  const int ia = agg.add(a).value();
  const int ib = agg.add(b).value();
  const std::vector<double> t_agg = agg.run();
  for (int i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(t_full[a_ids[i]], t_agg[ia]);
    EXPECT_DOUBLE_EQ(t_full[b_ids[i]], t_agg[ib]);
  }
  // By hand: fabric 20 shared by 4 A members until B starts at 0.1 (A at 5 each: 0.5 bytes sent);
  // then 8 members at 2.5: A's remaining 9.5 bytes take 3.8 s -> t = 3.9; B then has 30 - 9.5 = 20.5 left,
  // alone at 5 -> 4.1 s more.
  EXPECT_NEAR(t_agg[ia], 3.9, 1e-12);
  EXPECT_NEAR(t_agg[ib], 8.0, 1e-12);
}

TEST(FlowSimTest, BadFlowsAreErrors) {
  FlowSim sim({10});
  EXPECT_EQ(sim.add(flow({1}, 1)).status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(sim.add(flow({0}, -1)).ok());
  EXPECT_NE(sim.add(flow({0}, 1, 0, {0})).status().message().find("not an earlier flow"), std::string::npos);
  FlowSpec f = flow({0}, 1);
  f.hops[0].weight = 0;
  EXPECT_FALSE(sim.add(f).ok());
  EXPECT_EQ(sim.num_flows(), 0);
}

}  // namespace
}  // namespace piper::sim
