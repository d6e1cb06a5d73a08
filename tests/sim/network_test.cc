#include "piper/sim/network.h"

#include <gtest/gtest.h>

#include "test_clusters.h"

namespace piper::sim {
namespace {

using testing::make_cluster;

std::vector<std::string> names(const Network& net, const Route& r) {
  std::vector<std::string> out;
  for (int l : r.links) out.push_back(net.links()[l].name());
  return out;
}

TEST(NetworkTest, UniformNodeIsASwitch) {
  Network net = Network::build(make_cluster(1, 4, 100e9, 0, 0, 2e-6)).value();
  EXPECT_EQ(net.num_devices(), 4);
  Route r = net.route(0, 3).value();
  EXPECT_EQ(names(net, r), (std::vector<std::string>{"node0.dev0.out", "node0.dev3.in"}));
  EXPECT_DOUBLE_EQ(r.latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(net.links()[r.links[0]].bw_bytes_per_s, 100e9);
  EXPECT_TRUE(net.route(2, 2).value().links.empty());
  EXPECT_EQ(net.route(0, 4).status().code(), StatusCode::kOutOfRange);
}

// GB200 NVL72 (issue 32): trays of one 72-GPU domain reach each other through the NVLink switches, not the NICs.
TEST(NetworkTest, ScaleUpDomainSpansNodes) {
  ClusterSpec c = make_cluster(20, 4, 720e9, 1, 50e9, 3e-6);
  c.scale_up.nodes_per_domain = 18;
  Network net = Network::build(c).value();
  EXPECT_EQ(net.domain_of_node(17), 0);
  EXPECT_EQ(net.domain_of_node(18), 1);
  Route in = net.route(0, 17 * 4 + 3).value();  // tray 0 -> tray 17: same domain
  EXPECT_EQ(names(net, in), (std::vector<std::string>{"node0.dev0.out", "node17.dev3.in"}));
  EXPECT_DOUBLE_EQ(net.links()[in.links[0]].bw_bytes_per_s, 720e9);
  Route out = net.route(0, 18 * 4).value();  // tray 0 -> tray 18: the next domain, over the NICs
  EXPECT_EQ(net.links()[out.links.front()].kind, LinkKind::kNicTx);
  EXPECT_EQ(net.links()[out.links.back()].kind, LinkKind::kNicRx);
  c.scale_up.job_nodes_per_domain = 16;  // the job holds 16 trays per rack
  Network seg = Network::build(c).value();
  EXPECT_EQ(seg.links()[seg.route(0, 16 * 4).value().links.front()].kind, LinkKind::kNicTx);
  EXPECT_EQ(seg.links()[seg.route(0, 15 * 4).value().links.front()].kind, LinkKind::kPortOut);
}

TEST(NetworkTest, PerPairMatrixGivesDirectLinks) {
  ClusterSpec c = make_cluster(1, 3, 0, 0, 0, 1e-6);
  c.node.pair_bw_bytes_per_s = {{0, 50e9, 100e9}, {50e9, 0, 0}, {100e9, 0, 0}};
  Network net = Network::build(c).value();
  Route r = net.route(0, 2).value();
  ASSERT_EQ(r.links.size(), 1u);
  EXPECT_EQ(net.links()[r.links[0]].name(), "node0.dev0->dev2");
  EXPECT_DOUBLE_EQ(net.links()[r.links[0]].bw_bytes_per_s, 100e9);
  EXPECT_NE(net.route(1, 2).status().message().find("no direct link from local device 1 to 2"), std::string::npos);
  c.node.pair_bw_bytes_per_s[1].pop_back();
  EXPECT_NE(Network::build(c).status().message().find("row 1 has 2 entries"), std::string::npos);
}

TEST(NetworkTest, DevicesUseTheirNearestNic) {
  // 4 devices, 2 NICs: NIC 1 lists devices 0 and 1 (so they use it); 2 and 3 fall back to d mod 2 = NIC 0, 1.
  ClusterSpec c = make_cluster(2, 4, 100e9, 2, 25e9, 0, 3e-6);
  c.node.nics[1].near_devices = {0, 1};
  Network net = Network::build(c).value();
  EXPECT_EQ(net.nic_of(0), 1);
  EXPECT_EQ(net.nic_of(1), 1);
  EXPECT_EQ(net.nic_of(2), 0);
  EXPECT_EQ(net.nic_of(7), 1);
  Route r = net.route(2, 5).value();
  EXPECT_EQ(names(net, r), (std::vector<std::string>{"node0.nic0.tx", "group0.fabric", "node1.nic1.rx"}));
  EXPECT_DOUBLE_EQ(r.latency_s, 3e-6);
  // One group, two nodes of 50 GB/s injection each, no taper.
  EXPECT_DOUBLE_EQ(net.links()[r.links[1]].bw_bytes_per_s, 100e9);
}

TEST(NetworkTest, DragonflyGroupsWithTaper) {
  ClusterSpec c = make_cluster(5, 1, 0, 1, 10e9, 0, 2e-6);
  c.fabric.topology = FabricTopology::kDragonfly;
  c.fabric.nodes_per_group = 2;  // groups {0,1}, {2,3}, {4}
  c.fabric.intra_group_taper = 2;
  c.fabric.inter_group_taper = 4;
  c.fabric.inter_group_latency_s = 1e-6;
  Network net = Network::build(c).value();
  EXPECT_EQ(net.num_groups(), 3);
  Route r = net.route(1, 4).value();
  EXPECT_EQ(names(net, r), (std::vector<std::string>{"node1.nic0.tx", "group0.fabric", "group0.global.tx",
                                                     "group2.global.rx", "group2.fabric", "node4.nic0.rx"}));
  EXPECT_DOUBLE_EQ(r.latency_s, 3e-6);
  EXPECT_DOUBLE_EQ(net.links()[r.links[1]].bw_bytes_per_s, 2 * 10e9 / 2);
  EXPECT_DOUBLE_EQ(net.links()[r.links[2]].bw_bytes_per_s, 2 * 10e9 / 4);
  EXPECT_DOUBLE_EQ(net.links()[r.links[3]].bw_bytes_per_s, 1 * 10e9 / 4);  // the last group has one node
  EXPECT_EQ(net.route(0, 1).value().links.size(), 3u);
}

TEST(NetworkTest, BadClustersAreErrors) {
  EXPECT_NE(Network::build(make_cluster(2, 2, 1e9, 0, 0)).status().message().find("node.nics is empty"),
            std::string::npos);
  EXPECT_FALSE(Network::build(make_cluster(1, 2, 0, 0, 0)).ok());
  ClusterSpec c = make_cluster(2, 2, 1e9, 1, 1e9);
  c.node.nics[0].near_devices = {5};
  EXPECT_NE(Network::build(c).status().message().find("lists device 5"), std::string::npos);
  c = make_cluster(2, 2, 1e9, 1, 1e9);
  c.fabric.inter_group_taper = 0.5;
  EXPECT_NE(Network::build(c).status().message().find("tapers"), std::string::npos);
  c = make_cluster(2, 2, 1e9, 1, 1e9);
  c.fabric.topology = FabricTopology::kSingleNode;
  EXPECT_FALSE(Network::build(c).ok());
  EXPECT_FALSE(Network::build(make_cluster(0, 2, 1e9, 1, 1e9)).ok());
}

}  // namespace
}  // namespace piper::sim
