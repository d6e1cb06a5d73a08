// The calibration file of `piper bench comm` (comm::calibration_json) loaded into a ClusterSpec changes the
// network model's numbers (sim::Network link bandwidths and route latencies).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "piper/comm/comm_bench.h"
#include "piper/sim/network.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/comm_calibration.h"

namespace piper {
namespace {

comm::CommBenchReport measured_report() {
  comm::CommBenchReport r;
  r.ranks = 8;
  r.ranks_per_node = 4;
  r.intra = {true, 7.5e-6, 3.0e9};
  r.inter = {true, 2.1e-3, 1.25e8};
  return r;
}

Json as_json(const OrderedJson& j) { return Json::parse(j.dump()); }

TEST(CommCalibration, LoadingTheBenchFileChangesTheNetworkModel) {
  auto cluster = load_cluster("dgx-h100", 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();
  auto before = sim::Network::build(*cluster);
  ASSERT_TRUE(before.ok());
  const int g = cluster->node.devices_per_node;
  auto intra_before = before->route(0, 1), inter_before = before->route(0, g);
  ASSERT_TRUE(intra_before.ok() && inter_before.ok());

  const std::string path = ::testing::TempDir() + "/piper_comm_calibration.json";
  ASSERT_TRUE(write_text_file(path, comm::calibration_json(measured_report()).dump(2)).ok());
  ClusterSpec calibrated = *cluster;
  Status s = load_comm_calibration(path, &calibrated);
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::remove(path.c_str());
  EXPECT_DOUBLE_EQ(calibrated.node.intra.latency_s, 7.5e-6);
  EXPECT_DOUBLE_EQ(calibrated.node.intra.bw_bytes_per_s, 3.0e9);
  EXPECT_DOUBLE_EQ(calibrated.node.nic_latency_s, 2.1e-3);

  auto after = sim::Network::build(calibrated);
  ASSERT_TRUE(after.ok());
  auto intra_after = after->route(0, 1), inter_after = after->route(0, g);
  ASSERT_TRUE(intra_after.ok() && inter_after.ok());
  EXPECT_DOUBLE_EQ(intra_after->latency_s, 7.5e-6);
  EXPECT_NE(intra_after->latency_s, intra_before->latency_s);
  EXPECT_NEAR(inter_after->latency_s - inter_before->latency_s, 2.1e-3 - cluster->node.nic_latency_s, 1e-12);
  for (int link : intra_after->links) EXPECT_DOUBLE_EQ(after->links()[link].bw_bytes_per_s, 3.0e9);
  EXPECT_DOUBLE_EQ(after->links()[inter_after->links.front()].bw_bytes_per_s, 1.25e8);
  EXPECT_NE(after->link_bandwidths(), before->link_bandwidths());
}

TEST(CommCalibration, UnmeasuredLevelsLeaveTheClusterUnchanged) {
  auto cluster = load_cluster("dgx-h100", 2);
  ASSERT_TRUE(cluster.ok());
  comm::CommBenchReport r = measured_report();
  r.inter = {};
  ClusterSpec c = *cluster;
  ASSERT_TRUE(apply_comm_calibration(as_json(comm::calibration_json(r)), "test", &c).ok());
  EXPECT_DOUBLE_EQ(c.node.nic_latency_s, cluster->node.nic_latency_s);
  EXPECT_DOUBLE_EQ(c.node.nics.front().bw_bytes_per_s, cluster->node.nics.front().bw_bytes_per_s);
  EXPECT_DOUBLE_EQ(c.node.intra.bw_bytes_per_s, 3.0e9);
}

TEST(CommCalibration, BadFilesNameTheProblem) {
  auto cluster = load_cluster("dgx-h100", 2);
  ASSERT_TRUE(cluster.ok());
  ClusterSpec c = *cluster;
  Status s = apply_comm_calibration(Json::parse(R"({"node": {"intra": {"bw_bytes_per_s": -1}}})"), "f.json", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("bw_bytes_per_s"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("f.json"), std::string::npos) << s.message();
  s = apply_comm_calibration(Json::parse(R"({"node": {"nic_latncy_s": 1e-6}})"), "f.json", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("nic_latncy_s"), std::string::npos) << s.message();
  EXPECT_FALSE(load_comm_calibration("/nonexistent/calibration.json", &c).ok());
}

}  // namespace
}  // namespace piper
