// The scale-up domain in the cost model's network (issue 32): on GB200 NVL72 a group of up to 72 ranks reaches
// its members through NVLink, across trays; a group that straddles two domains pays the NICs.
#include <gtest/gtest.h>

#include "piper/cost/network.h"
#include "piper/spec/cluster_loader.h"

namespace piper::cost {
namespace {

TEST(DomainNetworkTest, Nvl72GroupsStayOnNvlinkAcrossTrays) {
  auto c = load_cluster("gb200-nvl72", 64);
  ASSERT_TRUE(c.ok()) << c.status().message();
  Network net(*c);
  EXPECT_TRUE(net.multi_node_domain());
  EXPECT_EQ(net.devices_per_node(), 72);
  EXPECT_DOUBLE_EQ(net.intra_bw(), 720e9);
  EXPECT_DOUBLE_EQ(net.nic_bw_per_device(), 50e9);  // one ConnectX-7 per GPU, not the tray's four shared
  // ep = 8 (two trays): inside one domain.
  GroupLayout g8 = net.layout(8, 1);
  EXPECT_EQ(g8.nodes, 1);
  // ep = 64 over 72-rank domains: the copy at ranks 64..127 straddles; worst alignment gcd(72, 64) = 8.
  GroupLayout g64 = net.layout(64, 1);
  EXPECT_EQ(g64.per_node, 8);
  EXPECT_EQ(g64.nodes, 8);
  // The job holds 16 trays of each rack (64 ranks): ep = 64 fits a domain.
  c->scale_up.job_nodes_per_domain = 16;
  Network seg(*c);
  GroupLayout s64 = seg.layout(64, 1);
  EXPECT_EQ(s64.nodes, 1);
  EXPECT_EQ(s64.per_node, 64);
  const double bytes = 1e9;
  EXPECT_LT(seg.all_to_all_flat_s(bytes, s64), net.all_to_all_flat_s(bytes, g64) / 5);
}

TEST(DomainNetworkTest, OneNodeDomainsKeepTheNodeModel) {
  auto c = load_cluster("b200", 4);
  ASSERT_TRUE(c.ok()) << c.status().message();
  Network net(*c);
  EXPECT_FALSE(net.multi_node_domain());
  EXPECT_EQ(net.devices_per_node(), 8);
  GroupLayout g = net.layout(16, 1);
  EXPECT_EQ(g.per_node, 8);
  EXPECT_EQ(g.nodes, 2);
}

}  // namespace
}  // namespace piper::cost
