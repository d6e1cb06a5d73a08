// af-pipe's NIC split (cost/nic_split.h): the per-NIC bandwidth factors and every refusal.
#include "piper/cost/nic_split.h"

#include <gtest/gtest.h>

#include "piper/spec/cluster_loader.h"

namespace piper::cost {
namespace {

Strategy af(const std::string& text) {
  auto s = Strategy::parse(text);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? *s : Strategy{};
}

const char* kEven = "dp=16,ep=16,schedule=af-pipe,microbatches=8,disagg=1,attn_ranks=16,ffn_ranks=16";

TEST(NicSplit, NoPortsIsNoSplit) {
  auto c = load_cluster("h800", 4);
  ASSERT_TRUE(c.ok());
  auto n = nic_split(af(kEven), *c);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_FALSE(n->active);
  EXPECT_TRUE(n->nic_scale.empty());
}

TEST(NicSplit, ScalesEachGroupsNicsToItsShare) {
  auto c = load_cluster("h800", 4);  // 8 GPUs and 8 NICs per node: ranks 0-15 on nodes 0-1, 16-31 on nodes 2-3
  ASSERT_TRUE(c.ok());
  auto n = nic_split(af(std::string(kEven) + ",attn_ports=8,ffn_ports=24"), *c);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_TRUE(n->active);
  EXPECT_EQ(n->natural_attn, 16);
  EXPECT_EQ(n->natural_ffn, 16);
  EXPECT_DOUBLE_EQ(n->attn_scale, 0.5);
  EXPECT_DOUBLE_EQ(n->ffn_scale, 1.5);
  ASSERT_EQ(n->nic_scale.size(), 32u);
  EXPECT_DOUBLE_EQ(n->nic_scale[0], 0.5);    // node 0
  EXPECT_DOUBLE_EQ(n->nic_scale[15], 0.5);   // node 1
  EXPECT_DOUBLE_EQ(n->nic_scale[16], 1.5);   // node 2
  EXPECT_DOUBLE_EQ(n->nic_scale[31], 1.5);   // node 3
}

TEST(NicSplit, RefusesWhatItCannotPrice) {
  auto c4 = load_cluster("h800", 4);
  auto c1 = load_cluster("h800", 1);
  ASSERT_TRUE(c4.ok() && c1.ok());
  auto too_many = nic_split(af(std::string(kEven) + ",attn_ports=16,ffn_ports=17"), *c4);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("33 ports but cluster"), std::string::npos) << too_many.status().message();
  EXPECT_NE(too_many.status().message().find("32 NICs"), std::string::npos);
  const std::string one_node = "dp=4,ep=4,schedule=af-pipe,microbatches=8,disagg=1,attn_ranks=4,ffn_ranks=4";
  EXPECT_TRUE(nic_split(af(one_node + ",attn_ports=4,ffn_ports=4"), *c1).ok());
  auto moved = nic_split(af(one_node + ",attn_ports=3,ffn_ports=5"), *c1);
  ASSERT_FALSE(moved.ok());
  EXPECT_NE(moved.status().message().find("must be attn_ports=4, ffn_ports=4"), std::string::npos)
      << moved.status().message();
  // h800 gives each GPU its own NIC; with 4 NICs per 8 GPUs (device d on NIC d mod 4) attention ranks 0-2 and
  // FFN ranks 3-5 share NIC 0 (devices 0 and 4).
  ClusterSpec shared = *c4;
  shared.node.nics.resize(4);
  for (size_t i = 0; i < shared.node.nics.size(); ++i) shared.node.nics[i].near_devices.clear();
  auto mixed = nic_split(af("dp=3,ep=1,schedule=af-pipe,microbatches=8,disagg=1,attn_ranks=3,ffn_ranks=3,"
                            "attn_ports=4,ffn_ports=4"),
                         shared);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("serves devices of both groups"), std::string::npos)
      << mixed.status().message();
}

TEST(NicSplit, StrategyKeysRoundTripAndAreChecked) {
  const Strategy s = af(std::string(kEven) + ",attn_ports=8,ffn_ports=24");
  EXPECT_EQ(s.attn_ports, 8);
  auto back = Strategy::parse(s.to_string());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, s);
  auto j = Strategy::from_json(s.to_json());
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_EQ(*j, s);
  EXPECT_EQ(af(kEven).to_string().find("ports"), std::string::npos);  // printed only when set
  auto one = Strategy::parse(std::string(kEven) + ",attn_ports=8");
  ASSERT_TRUE(one.ok());
  EXPECT_NE(one->validate().message().find("set both"), std::string::npos) << one->validate().message();
  auto plain = Strategy::parse("dp=2,attn_ports=1,ffn_ports=1");
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(plain->validate().message().find("add disagg=1"), std::string::npos) << plain->validate().message();
}

}  // namespace
}  // namespace piper::cost
