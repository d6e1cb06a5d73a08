#include "piper/spec/cluster_spec.h"

#include <gtest/gtest.h>

#include "piper/spec/cluster_loader.h"
#include "piper/spec/presets.h"

namespace piper {
namespace {

TEST(ClusterSpecTest, EveryPresetLoadsAndRoundTrips) {
  auto names = cluster_preset_names();
  ASSERT_GE(names.size(), 6u);
  for (const auto& name : names) {
    auto c = load_cluster(name, 1);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().message();
    EXPECT_EQ(c->name, name);
    auto again = cluster_from_json(Json::parse(to_json(*c).dump()), 1, "round trip");
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(to_json(*again).dump(), to_json(*c).dump());
  }
}

TEST(ClusterSpecTest, H800Numbers) {
  auto c = load_cluster("h800", 16);  // DisagMoE testbed: 16 nodes x 8 H800
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->world_size(), 128);
  EXPECT_DOUBLE_EQ(c->device.peak_flops(DType::kBF16), 989e12);
  EXPECT_DOUBLE_EQ(c->node.pair_bw(0, 5), 160e9);   // DeepEP's achievable NVLink bandwidth, per direction
  EXPECT_DOUBLE_EQ(c->node.nic_bw_total(), 400e9);  // 8 x 400 Gb/s CX-7
  EXPECT_EQ(c->node.nic_of_device(3), 3);
}

TEST(ClusterSpecTest, FrontierTopology) {
  auto c = load_cluster("frontier", 256);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->node.devices_per_node, 8);
  EXPECT_DOUBLE_EQ(c->node.pair_bw(0, 1), 200e9);  // same MI250X package
  EXPECT_DOUBLE_EQ(c->node.pair_bw(1, 2), 50e9);   // different package (lower bound of 50-100 GB/s)
  EXPECT_EQ(c->node.nics.size(), 4u);
  EXPECT_EQ(c->node.nic_of_device(5), 2);  // NIC 2 sits at the MI250X holding GCDs 4 and 5
  EXPECT_DOUBLE_EQ(c->node.nic_bw_total(), 100e9);
  EXPECT_EQ(c->fabric.topology, FabricTopology::kDragonfly);
  EXPECT_EQ(c->fabric.nodes_per_group, 128);
  EXPECT_DOUBLE_EQ(c->fabric.inter_group_taper, 1.75);
}

TEST(ClusterSpecTest, NodeCountIsChecked) {
  auto r = load_cluster("local-cpu", 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--nodes 2 is out of range; allowed 1..1"), std::string::npos)
      << r.status().message();
  r = load_cluster("h800", 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--nodes 0 is out of range; allowed >= 1"), std::string::npos)
      << r.status().message();
  auto local = load_cluster("local-cpu", 1);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->world_size(), 2);
  EXPECT_DOUBLE_EQ(local->device.peak_flops_fp32, 2.1e9 * 64);  // 2.1 GHz x 64 FLOP/cycle (AVX-512 FMA x2)
}

TEST(ClusterSpecTest, UnknownPresetAndBadFields) {
  auto r = load_cluster("h80", 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("did you mean 'h800'"), std::string::npos) << r.status().message();
  auto base = to_json(load_cluster("dgx-h100", 1).value());
  Json j = Json::parse(base.dump());
  j["node"]["nics"][0]["near_devices"] = {9};
  r = cluster_from_json(j, 1, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cluster.node.nics[0].near_devices: device 9 is out of range; allowed 0..7"),
            std::string::npos)
      << r.status().message();
  j = Json::parse(base.dump());
  j["fabric"]["topology"] = "torus";
  r = cluster_from_json(j, 1, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("pick one of {single-node, fat-tree, dragonfly}"), std::string::npos);
  j = Json::parse(base.dump());
  j["device"]["memory_bytes"] = -1;
  EXPECT_FALSE(cluster_from_json(j, 1, "t").ok());
}

// node.shared_cores / node.device_cores: CPU ranks sharing a node's cores (cluster_spec.h). Read, written back,
// range-checked, and the closed form's static share.
TEST(ClusterSpecTest, SharedCores) {
  ClusterSpec c = load_cluster("local-cpu", 1).value();
  EXPECT_EQ(c.node.shared_cores, 0);
  EXPECT_EQ(c.node.static_core_share(), 1.0);
  EXPECT_FALSE(to_json(c)["node"].contains("shared_cores"));
  Json j = Json::parse(to_json(c).dump());
  j["node"]["devices_per_node"] = 4;
  j["node"]["shared_cores"] = 2;
  j["node"]["device_cores"] = 1;
  auto r = cluster_from_json(j, 1, "t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->node.shared_cores, 2);
  EXPECT_EQ(r->node.device_cores, 1);
  EXPECT_EQ(r->node.static_core_share(), 0.5);  // 4 ranks of 1 core on 2 cores, all busy
  EXPECT_EQ(to_json(*r)["node"]["shared_cores"], 2.0);
  r->node.device_cores = 2;
  EXPECT_EQ(r->node.static_core_share(), 0.25);
  r->node.devices_per_node = 1;
  EXPECT_EQ(r->node.static_core_share(), 1.0);  // one rank of 2 threads on 2 cores
  j["node"]["device_cores"] = 3;
  r = cluster_from_json(j, 1, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cluster.node.device_cores: 3 is out of range; allowed (0, 2]"),
            std::string::npos)
      << r.status().message();
  j["node"]["device_cores"] = 1;
  j["node"]["shared_cores"] = -1;
  EXPECT_FALSE(cluster_from_json(j, 1, "t").ok());
}

TEST(ClusterSpecTest, Dtypes) {
  EXPECT_EQ(dtype_bytes(DType::kBF16), 2);
  EXPECT_EQ(dtype_bytes(DType::kFP32), 4);
  auto d = parse_dtype("bf16", "x");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, DType::kBF16);
  auto bad = parse_dtype("int4", "--dtype");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("pick one of {fp32, bf16, fp16, fp8}"), std::string::npos);
}

}  // namespace
}  // namespace piper
