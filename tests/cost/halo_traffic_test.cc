// The HALO traffic model (cost/halo_traffic.h): node-hit probabilities against enumeration of every routing, and
// the dispatch/combine message lists against hand counts.
#include "piper/cost/halo_traffic.h"

#include <gtest/gtest.h>

#include <vector>

namespace piper::cost {
namespace {

// Every subset of `k` of `pool` (calls f with each).
template <typename F>
void subsets(const std::vector<int>& pool, int k, F f) {
  std::vector<int> pick;
  auto rec = [&](auto&& self, size_t from) -> void {
    if (static_cast<int>(pick.size()) == k) {
      f(pick);
      return;
    }
    for (size_t i = from; i < pool.size(); ++i) {
      pick.push_back(pool[i]);
      self(self, i + 1);
      pick.pop_back();
    }
  };
  rec(rec, 0);
}

// P(node m hit) by enumerating every group choice and every top-k subset of their experts (equally likely).
std::vector<double> brute_force_hits(const HaloGroupShape& g, const HaloRouting& r) {
  const int groups = r.num_groups > 1 && r.topk_groups < r.num_groups ? r.num_groups : 1;
  const int chosen = groups == 1 ? 1 : r.topk_groups, size = r.num_experts / groups;
  const int per_node = r.num_experts / g.nodes;
  std::vector<int> all_groups;
  for (int i = 0; i < groups; ++i) all_groups.push_back(i);
  std::vector<double> hits(g.nodes, 0.0);
  double cases = 0;
  subsets(all_groups, chosen, [&](const std::vector<int>& gs) {
    std::vector<int> experts;
    for (int grp : gs) {
      for (int e = grp * size; e < (grp + 1) * size; ++e) experts.push_back(e);
    }
    subsets(experts, r.top_k, [&](const std::vector<int>& slots) {
      std::vector<char> hit(g.nodes, 0);
      for (int e : slots) hit[e / per_node] = 1;
      for (int m = 0; m < g.nodes; ++m) hits[m] += hit[m];
      cases += 1;
    });
  });
  for (double& h : hits) h /= cases;
  return hits;
}

TEST(HaloTrafficTest, NodeHitsMatchEnumeration) {
  struct Case {
    int nodes, per_node, experts, k, groups, topk_groups;
  };
  const std::vector<Case> cases = {
      {2, 2, 8, 2, 1, 1},  {2, 2, 8, 3, 1, 1},  {4, 1, 8, 4, 1, 1},   {4, 2, 16, 3, 1, 1},
      {3, 2, 12, 5, 1, 1}, {4, 2, 16, 4, 4, 2}, {2, 2, 16, 3, 8, 3},  // groups inside a node
      {8, 1, 16, 3, 4, 2},                                           // a group spans two nodes
      {3, 1, 12, 3, 4, 2},                                           // groups straddle node boundaries
  };
  for (const Case& c : cases) {
    HaloGroupShape g{c.nodes, c.per_node, 1};
    HaloRouting r{c.experts, c.k, c.groups, c.topk_groups};
    ASSERT_TRUE(validate_halo(g, r).ok()) << validate_halo(g, r).message();
    const std::vector<double> want = brute_force_hits(g, r);
    double distinct = 0;
    for (int m = 0; m < c.nodes; ++m) {
      EXPECT_NEAR(halo_node_hit_probability(g, r, m), want[m], 1e-12)
          << c.nodes << "x" << c.per_node << " E=" << c.experts << " k=" << c.k << " G=" << c.groups << " node " << m;
      distinct += want[m];
    }
    EXPECT_NEAR(halo_expected_distinct_nodes(g, r), distinct, 1e-12);
  }
}

// DeepSeek-V3 on 8 nodes (256 experts, 8 groups of one node each, top-4 groups, top-8): a node is hit when its
// group is picked (1/2) and one of the 8 slots among the 128 experts lands in it.
TEST(HaloTrafficTest, DeepSeekV3GroupLimitedRouting) {
  HaloGroupShape g{8, 8, 8};
  HaloRouting r{256, 8, 8, 4};
  double avoid = 1;
  for (int i = 0; i < 8; ++i) avoid *= (96.0 - i) / (128.0 - i);
  EXPECT_NEAR(halo_node_hit_probability(g, r, 3), 0.5 * (1 - avoid), 1e-12);
  EXPECT_NEAR(halo_expected_distinct_nodes(g, r), 4 * (1 - avoid), 1e-12);
  EXPECT_LT(halo_expected_distinct_nodes(g, r), 4.0);
}

TEST(HaloTrafficTest, BadShapesAreNamed) {
  EXPECT_NE(validate_halo({2, 4, 3}, {16, 2}).message().find("lanes=3"), std::string::npos);
  EXPECT_NE(validate_halo({2, 4, 1}, {12, 2}).message().find("num_experts=12"), std::string::npos);
  EXPECT_NE(validate_halo({2, 4, 1}, {16, 17}).message().find("top_k=17"), std::string::npos);
  EXPECT_FALSE(halo_dispatch_traffic({2, 4, 1}, {16, 17}, 10, 64).ok());
}

// 2 nodes x 2 ranks, one lane (proxy rotation), 8 experts top-2: hand counts of every step.
TEST(HaloTrafficTest, DispatchMessagesByHand) {
  HaloGroupShape g{2, 2, 1};
  HaloRouting r{8, 2};
  const double T = 28, tb = 64, hit = 1 - (4.0 * 3) / (8 * 7);  // C(4,2)/C(8,2) of the tokens miss a node
  HaloTraffic t = halo_dispatch_traffic(g, r, T, tb).value();
  const double rows = T * 2 / 4 * tb, piece = T * hit * (tb + 2);
  int direct = 0, gather = 0, batch = 0, scatter = 0;
  for (const HaloMessage& m : t.messages) {
    switch (m.step) {
      case HaloStep::kDirect:
        EXPECT_DOUBLE_EQ(m.bytes, rows);
        ++direct;
        break;
      case HaloStep::kGather:  // node n's send proxy for node m is local m % 2
        EXPECT_EQ(m.dst % 2, (1 - m.src / 2) % 2);
        EXPECT_DOUBLE_EQ(m.bytes, piece);
        ++gather;
        break;
      case HaloStep::kBatch:
        EXPECT_DOUBLE_EQ(m.bytes, 2 * piece);
        EXPECT_EQ(m.after.size(), 1u);
        ++batch;
        break;
      case HaloStep::kScatter:
        EXPECT_DOUBLE_EQ(m.bytes, 2 * rows);
        ++scatter;
        break;
      default:
        ADD_FAILURE() << to_string(m.step);
    }
  }
  EXPECT_EQ(direct, 4);
  EXPECT_EQ(gather, 2);
  EXPECT_EQ(batch, 2);
  EXPECT_EQ(scatter, 2);
  EXPECT_EQ(t.messages_inter, 2);
  EXPECT_DOUBLE_EQ(t.bytes_inter, 2 * 2 * piece);
}

// The combine returns the dispatch's deduplicated volume: partials of row_bytes per (token, remote node).
TEST(HaloTrafficTest, CombineReturnsTheDeduplicatedVolume) {
  HaloGroupShape g{4, 2, 2};
  HaloRouting r{16, 4};
  const double T = 1000, tb = 1024;
  const double hit = halo_node_hit_probability(g, r, 0);
  HaloTraffic t = halo_combine_traffic(g, r, T, tb).value();
  double partials = 0, meta = 0;
  for (const HaloMessage& m : t.messages) {
    if (m.src / 2 == m.dst / 2) continue;
    ASSERT_TRUE(m.step == HaloStep::kSlotMeta || m.step == HaloStep::kPartial) << to_string(m.step);
    (m.step == HaloStep::kSlotMeta ? meta : partials) += m.bytes;
    // A partial leaves after its group's metadata (2 lanes of 1 source: 1 message) and rows (from the 1 other rank).
    if (m.step == HaloStep::kPartial) {
      EXPECT_EQ(m.after.size(), 2u);
    }
  }
  EXPECT_NEAR(partials, 8 * T * 3 * hit * tb, 1e-6 * partials);
  EXPECT_NEAR(meta, 8 * T * 3 * hit * 4 * 8, 1e-6 * meta);
  HaloTraffic d = halo_dispatch_traffic(g, r, T, tb).value();
  EXPECT_NEAR(partials / tb, d.bytes_inter / (tb + 2), 1e-6 * partials / tb);
}

// The alpha-beta time: inter-node bytes dominate, and dedup makes HALO's NIC load smaller than flat's.
TEST(HaloTrafficTest, TimeFollowsTheBusiestLink) {
  HaloGroupShape g{2, 1, 1};
  HaloRouting r{2, 1};
  HaloTraffic t = halo_dispatch_traffic(g, r, 100, 1000).value();
  // One rank per node: each sends a batch of 100 * 0.5 tokens * 1001 B to the other node.
  HaloLinkModel link{1e9, 0, 1e6, 1e-3};
  EXPECT_NEAR(halo_traffic_time_s(g, t, link), 1e-3 + 50 * 1001 / 1e6, 1e-12);
}

}  // namespace
}  // namespace piper::cost
