// Collective costs and all-to-all traffic (reference: /work/shared/reference/moe_comm_and_balance.md §1).
#include "piper/cost/network.h"

#include <gtest/gtest.h>

namespace piper::cost {
namespace {

// 8 devices per node at 450 GB/s (DGX H100 NVLink per direction), 8 x 50 GB/s NICs, 128-node groups.
ClusterSpec dgx_like(int nodes) {
  ClusterSpec c;
  c.name = "test";
  c.num_nodes = nodes;
  c.node.devices_per_node = 8;
  c.node.intra = {450e9, 0};
  for (int i = 0; i < 8; ++i) c.node.nics.push_back({50e9, {i}});
  c.fabric.nodes_per_group = 128;
  c.fabric.inter_group_taper = 2.0;
  return c;
}

// E[#distinct nodes] = N (1 - (1 - 1/N)^k); k = 8: 3.60 (N=4), 5.25 (N=8), 6.45 (N=16), 7.18 (N=32)
// instead of 8 (moe_comm_and_balance.md §1, node-level dedup as in DeepEP normal mode and X-MoE RBD).
TEST(NetworkTest, ExpectedDistinctNodes) {
  struct Row {
    int nodes;
    double expected;
  };
  const Row rows[] = {{4, 3.60}, {8, 5.25}, {16, 6.45}, {32, 7.18}};
  for (const auto& row : rows) EXPECT_NEAR(expected_distinct_nodes(row.nodes, 8), row.expected, 0.005) << row.nodes;
  EXPECT_DOUBLE_EQ(expected_distinct_nodes(1, 8), 1.0);
  EXPECT_DOUBLE_EQ(expected_distinct_nodes(8, 8, 4), 4.0);  // DeepSeek-V3 node-limited routing: <= 4 nodes
}

// HALO vs flat on the NICs: flat sends every (token, expert) pair on its own, so k (N-1)/N copies leave the node;
// HALO (halo_traffic.h) sends one per distinct remote node, (N-1)(1 - C(E - E/N, k)/C(E, k)) for uniform routing:
// 4.63 of 7 at N = 8, k = 8, E = 256 (moe_comm_and_balance.md §1 gives the with-replacement 5.25 - 5.25/8).
TEST(NetworkTest, HaloVsFlatTraffic) {
  Network net(dgx_like(8));
  GroupLayout ep64 = net.layout(64, 1);
  ASSERT_EQ(ep64.nodes, 8);
  ASSERT_EQ(ep64.per_node, 8);
  const double token = 7168 * 2, tokens = 4096;
  A2aTraffic flat = flat_a2a_traffic_per_token(token, 8, ep64);
  EXPECT_DOUBLE_EQ(flat.inter_node, token * 8 * 7 / 8);
  const HaloGroupShape shape = net.halo_shape(ep64);
  EXPECT_EQ(shape.lanes, 8);  // one NIC per GPU: rail-aligned proxies
  HaloTraffic halo = halo_dispatch_traffic(shape, {256, 8}, tokens, token).value();
  double avoid = 1;
  for (int i = 0; i < 8; ++i) avoid *= (224.0 - i) / (256 - i);
  EXPECT_NEAR(halo.bytes_inter / 64 / tokens, 7 * (1 - avoid) * (token + 8), 1e-6 * token);
  EXPECT_LT(halo.bytes_inter, 64 * tokens * flat.inter_node);
  // And the time follows: HALO beats flat across nodes (the NICs are the bottleneck).
  EXPECT_LT(halo_traffic_time_s(shape, halo, net.halo_link(ep64)), net.all_to_all_flat_s(tokens * 8 * token, ep64));
}

TEST(NetworkTest, Layouts) {
  Network net(dgx_like(64));
  GroupLayout a = net.layout(16, 8);  // one member per node
  EXPECT_EQ(a.per_node, 1);
  EXPECT_EQ(a.nodes, 16);
  EXPECT_FALSE(a.crosses_groups);
  GroupLayout b = net.layout(4, 2);  // 4 members 2 apart: one node
  EXPECT_EQ(b.per_node, 4);
  EXPECT_EQ(b.nodes, 1);
  GroupLayout c = net.layout(256, 8);  // 256 nodes > 128-node groups
  EXPECT_TRUE(c.crosses_groups);
  GroupLayout d = net.combine(net.layout(8, 1), net.layout(4, 8), 8);
  EXPECT_EQ(d.size, 32);
  EXPECT_EQ(d.per_node, 8);
  EXPECT_EQ(d.nodes, 4);
}

// Ring all-reduce 2(n-1)/n S / bw (standard ring model, hardware_and_models.md §7); across nodes a ring with c
// members per node uses c NIC shares: bw = min(intra, c * nic).
TEST(NetworkTest, CollectiveFormulas) {
  Network net(dgx_like(4));
  const double S = 1e9;
  GroupLayout node = net.layout(8, 1);
  EXPECT_DOUBLE_EQ(net.all_reduce_s(S, node, AllReduceAlgo::kRing), 2 * 7.0 / 8 * S / 450e9);
  EXPECT_DOUBLE_EQ(net.reduce_scatter_s(S, node), 7.0 / 8 * S / 450e9);
  EXPECT_DOUBLE_EQ(net.all_gather_s(S, node), 7.0 / 8 * S / 450e9);
  GroupLayout two_nodes = net.layout(16, 1);
  EXPECT_DOUBLE_EQ(net.all_reduce_s(S, two_nodes, AllReduceAlgo::kRing), 2 * 15.0 / 16 * S / 400e9);
  GroupLayout spread = net.layout(4, 8);  // one per node: a single NIC share
  EXPECT_DOUBLE_EQ(net.all_reduce_s(S, spread, AllReduceAlgo::kRing), 2 * 3.0 / 4 * S / 50e9);
  EXPECT_DOUBLE_EQ(net.all_reduce_s(S, spread, AllReduceAlgo::kTree), 2 * S / 50e9);
  EXPECT_DOUBLE_EQ(net.all_reduce_s(S, net.layout(1, 1)), 0.0);
  EXPECT_DOUBLE_EQ(net.p2p_s(S, true), S / 50e9);
  EXPECT_DOUBLE_EQ(net.p2p_s(S, false), S / 450e9);
  // M2N: 4 senders into 2 receivers, each sender 1 GB: the receivers take 2 GB each.
  EXPECT_DOUBLE_EQ(net.m2n_s(S, 4, 2), 2 * S / 50e9);
  // Across dragonfly groups the global links are tapered.
  Network big(dgx_like(256));
  GroupLayout global = big.layout(256, 8);
  EXPECT_DOUBLE_EQ(big.all_reduce_s(S, global, AllReduceAlgo::kRing), 2 * 255.0 / 256 * S / 25e9);
}

// NIC affinity: a NIC shared by two devices gives each half of its bandwidth, and the worst NIC counts.
TEST(NetworkTest, NicAffinity) {
  ClusterSpec c = dgx_like(2);
  c.node.nics = {{100e9, {0, 1, 2, 3}}, {100e9, {4, 5, 6, 7}}};
  EXPECT_DOUBLE_EQ(Network(c).nic_bw_per_device(), 25e9);
  c.node.nics = {{100e9, {}}, {100e9, {}}, {100e9, {}}};  // round-robin: 3, 3, 2 devices
  EXPECT_NEAR(Network(c).nic_bw_per_device(), 100e9 / 3, 1);
}

}  // namespace
}  // namespace piper::cost
