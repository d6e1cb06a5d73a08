// `piper calibrate --ranks R`'s file (comm::link_calibration_json): the intra-node link is the one that makes the
// simulator's ring all-reduce, ring all-gather and flat all-to-all take the measured times (recovered exactly from
// times made with those formulas); its synchronisation excess reaches the cluster only for the measured ranks per
// node; bad values are named.
#include "piper/comm/link_calibration.h"

#include <gtest/gtest.h>

#include "piper/spec/cluster_loader.h"
#include "piper/spec/comm_calibration.h"

namespace piper {
namespace {

constexpr double kAlpha = 5e-6, kBw = 1.5e9;

// Times of the simulator's algorithms on n ranks over a link of kAlpha per step and kBw per port.
comm::AlphaBeta algorithm_times(double steps, double port_bytes_per_byte) {
  std::vector<comm::SizedTime> points;
  for (size_t bytes : {size_t{8}, size_t{65536}, size_t{4} << 20}) {
    points.push_back({bytes, steps * kAlpha + port_bytes_per_byte * static_cast<double>(bytes - 8) / kBw});
  }
  return comm::fit_alpha_beta(points);
}

comm::LinkCalibration one_node(int n) {
  comm::LinkCalibration c;
  c.ranks = n;
  c.ranks_per_node = n;
  c.cores = 2;
  c.hosts = {"vm"};
  const double p = n;
  c.all_reduce = algorithm_times(2 * (p - 1), 2 * (p - 1) / p);
  c.all_gather = algorithm_times(p - 1, p - 1);
  c.all_to_all = algorithm_times(1, (p - 1) / p);
  c.intra = comm::fit_alpha_beta({{8, 1e-6}, {4 << 20, 1e-6 + 4194296 / 9e9}});
  c.sync_all_to_all = {true, 524288, {1e-4, 0, 0}, {2.1e-3, 0, 0}, 2.0e-3};
  c.sync_all_reduce = {true, 4096, {3e-5, 0, 0}, {1.53e-3, 0, 0}, 1.5e-3};
  c.sync_pairs = {true, 4096, {2e-5, 0, 0}, {0.52e-3, 0, 0}, 0.5e-3};
  c.contended_all_reduce = {true, 4096, 1, 1e-4, 3.6e-3, 3.5e-3, 1.1e-3};
  c.contended_all_to_all = {true, 524288, 1, 2e-4, 4.2e-3, 4.0e-3, 2.2e-3};
  c.contended_pairs = {true, 4096, 1, 5e-5, 1.05e-3, 1.0e-3, 0.6e-3};
  c.contended_p2p = {true, 131072, 1, 5e-5, 0.75e-3, 0.7e-3, 0.4e-3};
  return c;
}

TEST(LinkCalibration, FitsAlphaFromTheSmallestSizeAndBandwidthFromTheLargest) {
  comm::AlphaBeta f = comm::fit_alpha_beta({{4 << 20, 1e-6 + 4194296 / 9e9}, {8, 1e-6}, {4096, 2e-6}});
  ASSERT_TRUE(f.measured);
  EXPECT_DOUBLE_EQ(f.alpha_s, 1e-6);
  EXPECT_NEAR(f.bw_bytes_per_s, 9e9, 1);
  EXPECT_EQ(f.points.front().bytes, 8u);  // sorted
  EXPECT_FALSE(comm::fit_alpha_beta({{8, 1e-6}}).measured);
}

TEST(LinkCalibration, TheIntraLinkMakesTheSimulatorsAlgorithmsTakeTheMeasuredTimes) {
  for (int n : {2, 4, 8}) {
    const comm::EffectiveLink e = comm::effective_intra_link(one_node(n));
    ASSERT_TRUE(e.measured);
    EXPECT_NEAR(e.latency_s, kAlpha, 1e-12) << n;
    EXPECT_NEAR(e.bw_bytes_per_s, kBw, 1e-3 * kBw) << n;
  }
  comm::LinkCalibration two_nodes = one_node(4);
  two_nodes.hosts = {"a", "b"};
  EXPECT_FALSE(comm::effective_intra_link(two_nodes).measured);  // collectives cross the slower link
}

TEST(LinkCalibration, TheFileSetsTheLinkAndTheSyncExcessForTheMeasuredRanksOnly) {
  const Json file = Json::parse(comm::link_calibration_json(one_node(4), "test").dump());
  auto cluster = load_cluster("local-cpu", 1);
  ASSERT_TRUE(cluster.ok());
  ClusterSpec c = *cluster;
  c.node.devices_per_node = 4;
  c.node.shared_cores = 2;
  CommCalibrationInfo info;
  ASSERT_TRUE(apply_comm_calibration(file, "f.json", &c, &info).ok());
  EXPECT_NEAR(c.node.intra.bw_bytes_per_s, kBw, 1e-3 * kBw);
  EXPECT_NEAR(c.node.intra.latency_s, kAlpha, 1e-12);
  EXPECT_DOUBLE_EQ(c.node.sync_excess_all_to_all_s, 2.0e-3);
  EXPECT_DOUBLE_EQ(c.node.sync_excess_other_s, 1.5e-3);
  EXPECT_DOUBLE_EQ(c.node.sync_excess_pair_s, 0.5e-3);
  EXPECT_DOUBLE_EQ(c.node.busy_cpu_other_s, 1.1e-3);  // the CPU they take from compute
  EXPECT_DOUBLE_EQ(c.node.busy_cpu_all_to_all_s, 2.2e-3);
  EXPECT_DOUBLE_EQ(c.node.busy_cpu_pair_s, 0.6e-3);
  EXPECT_DOUBLE_EQ(c.node.busy_cpu_p2p_s, 0.4e-3);
  EXPECT_TRUE(info.sync_applied);
  // The cluster file keeps them (a cluster written out and read back prices the same).
  auto round = cluster_from_json(Json::parse(to_json(c).dump()), 1, "round trip");
  ASSERT_TRUE(round.ok()) << round.status().to_string();
  EXPECT_DOUBLE_EQ(round->node.busy_cpu_p2p_s, 0.4e-3);
  EXPECT_DOUBLE_EQ(round->node.busy_cpu_pair_s, 0.6e-3);

  ClusterSpec two = *cluster;  // 2 ranks per node: the excess measured with 4 does not apply
  ASSERT_TRUE(apply_comm_calibration(file, "f.json", &two, &info).ok());
  EXPECT_EQ(two.node.sync_excess_all_to_all_s, 0);
  EXPECT_EQ(two.node.busy_cpu_all_to_all_s, 0);
  EXPECT_TRUE(info.sync_measured);
  EXPECT_FALSE(info.sync_applied);
  EXPECT_EQ(info.sync_ranks_per_node, 4);
}

TEST(LinkCalibration, BadSyncFiguresAreNamed) {
  auto cluster = load_cluster("local-cpu", 1);
  ASSERT_TRUE(cluster.ok());
  ClusterSpec c = *cluster;
  Status s = apply_comm_calibration(
      Json::parse(R"({"ranks_per_node": 2, "measured": {"sync_all_to_all": {"excess_s": -1}}})"), "f.json", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sync_all_to_all.excess_s"), std::string::npos) << s.message();
  s = apply_comm_calibration(Json::parse(R"({"ranks_per_node": 2, "measured": {"contended_p2p": {"cpu_s": "fast"}}})"),
                             "f.json", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("contended_p2p.cpu_s must be a number"), std::string::npos) << s.message();
  s = apply_comm_calibration(
      Json::parse(R"({"ranks_per_node": 2, "measured": {"contended_all_reduce": {"cpu_s": 2}}})"), "f.json", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("allowed [0, 1]"), std::string::npos) << s.message();
  s = apply_comm_calibration(Json::parse(R"({"measured": 3})"), "f.json", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("calibration.measured"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace piper
