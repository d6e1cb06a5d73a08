// `piper calibrate --ranks R`'s file (comm::link_calibration_json): the intra-node link is the one that makes the
// simulator's ring all-reduce, ring all-gather and flat all-to-all take the measured times (recovered exactly from
// times made with those formulas); its synchronisation excess reaches the cluster only for the measured ranks per
// node; bad values are named.
#include "piper/comm/link_calibration.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "piper/cost/copy_cost.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/comm_calibration.h"

namespace piper {
namespace {

constexpr double kAlpha = 5e-6, kBw = 1.5e9;

// Times of the simulator's algorithms on n ranks over a link of kAlpha per step and kBw per port.
// The CPU of a call: 20 us, and kCpuPerByte per byte its rank's port carries.
constexpr double kCpuPerByte = 0.3e-9;

comm::AlphaBeta algorithm_times(double steps, double port_bytes_per_byte) {
  std::vector<comm::SizedTime> points;
  for (size_t bytes : {size_t{8}, size_t{65536}, size_t{4} << 20}) {
    const double port = port_bytes_per_byte * static_cast<double>(bytes);
    points.push_back({bytes, steps * kAlpha + port_bytes_per_byte * static_cast<double>(bytes - 8) / kBw,
                      20e-6 + kCpuPerByte * port});
  }
  return comm::fit_alpha_beta(points);
}

// A synchronisation figure of two rounds, 0.8x and 1.2x the excess.
comm::SyncUnderLoad sync_figure(size_t bytes, double idle_s, double excess_s) {
  comm::SyncUnderLoad s;
  s.measured = true;
  s.bytes = bytes;
  s.idle.after_last_arrival_s = idle_s;
  s.busy.after_last_arrival_s = idle_s + excess_s;
  s.excess_s = excess_s;
  s.trim = 0.1;
  s.samples_per_round = 12;
  s.round_excess_s = {0.8 * excess_s, 1.2 * excess_s};
  s.round_excess_min_s = 0.8 * excess_s;
  s.round_excess_max_s = 1.2 * excess_s;
  return s;
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
  c.sync_all_to_all = sync_figure(524288, 1e-4, 2.0e-3);
  c.sync_all_reduce = sync_figure(4096, 3e-5, 1.5e-3);
  c.sync_pairs = sync_figure(4096, 2e-5, 0.5e-3);
  c.contended_all_reduce = {true, 4096, 1, 1e-4, 3.6e-3, 3.5e-3, 1.1e-3, 0, {}};
  c.contended_all_to_all = {true, 524288, 1, 2e-4, 4.2e-3, 4.0e-3, 2.2e-3, 0, {}};
  c.contended_pairs = {true, 4096, 1, 5e-5, 1.05e-3, 1.0e-3, 0.6e-3, 0, {}};
  c.contended_p2p = {true, 131072, 1, 5e-5, 0.75e-3, 0.7e-3, 0.4e-3, 0, {}};
  // 16 MiB beside the computing threads: its own CPU 5 ms above the 4 KiB call's 0.1 ms.
  c.contended_all_reduce.comm_cpu_s = 0.1e-3;
  c.contended_all_reduce_large = {true, size_t{16} << 20, 1, 20e-3, 40e-3, 20e-3, 6e-3, 5.1e-3, {}};
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
    // The CPU per byte carried: the rise of a call's CPU over the rise of its port bytes, every kind alike.
    for (double k : e.cpu_per_byte_by_kind) EXPECT_NEAR(k, kCpuPerByte, 1e-15) << n;
    EXPECT_NEAR(e.cpu_s_per_byte, kCpuPerByte, 1e-15) << n;
  }
  comm::LinkCalibration two_nodes = one_node(4);
  two_nodes.hosts = {"a", "b"};
  EXPECT_FALSE(comm::effective_intra_link(two_nodes).measured);  // collectives cross the slower link
}

// local-cpu as `piper train --ranks 4` sees this 2-core machine: 4 ranks sharing 2 cores.
ClusterSpec four_ranks_on_two_cores() {
  ClusterSpec c = load_cluster("local-cpu", 1).value();
  c.node.devices_per_node = 4;
  c.node.shared_cores = 2;
  return c;
}

TEST(LinkCalibration, TheFileSetsTheLinkAndTheSyncExcessForTheMeasuredRanksOnly) {
  const Json file = Json::parse(comm::link_calibration_json(one_node(4), "test").dump());
  auto cluster = load_cluster("local-cpu", 1);
  ASSERT_TRUE(cluster.ok());
  ClusterSpec c = four_ranks_on_two_cores();
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
  // The copies' CPU per byte: 5 ms over a ring all-reduce's port bytes, 2 (n - 1) / n of the 16 MiB - 4 KiB more.
  const double per_byte = 5e-3 / (1.5 * static_cast<double>((size_t{16} << 20) - 4096));
  EXPECT_NEAR(comm::copy_cpu_s_per_byte(one_node(4)), per_byte, 1e-18);
  EXPECT_NEAR(c.node.copy_cpu_s_per_byte, per_byte, 1e-18);
  EXPECT_NEAR(cost::copy_seconds_per_byte(c.node, cost::CopyKind::kSummed), per_byte,
              1e-18);  // in place of 1 / intra bandwidth
  comm::LinkCalibration no_large = one_node(4);
  no_large.contended_all_reduce_large.measured = false;
  EXPECT_EQ(comm::copy_cpu_s_per_byte(no_large), 0);
  EXPECT_TRUE(info.sync_applied);
  // The cluster file keeps them (a cluster written out and read back prices the same).
  auto round = cluster_from_json(Json::parse(to_json(c).dump()), 1, "round trip");
  ASSERT_TRUE(round.ok()) << round.status().to_string();
  EXPECT_DOUBLE_EQ(round->node.busy_cpu_p2p_s, 0.4e-3);
  EXPECT_DOUBLE_EQ(round->node.busy_cpu_pair_s, 0.6e-3);
  EXPECT_FALSE(c.node.node_figures);  // one node: nothing measured inside a node apart
  EXPECT_EQ(c.node.busy_cpu_node_other_s, 0);

  ClusterSpec two = *cluster;  // 2 ranks per node: the excess measured with 4 does not apply
  ASSERT_TRUE(apply_comm_calibration(file, "f.json", &two, &info).ok());
  EXPECT_EQ(two.node.sync_excess_all_to_all_s, 0);
  EXPECT_EQ(two.node.busy_cpu_all_to_all_s, 0);
  EXPECT_TRUE(info.sync_measured);
  EXPECT_FALSE(info.sync_applied);
  EXPECT_EQ(info.sync_ranks_per_node, 4);
}

// Gathered and exchanged bytes (MPI copies them, sums nothing) have their own measured CPU per byte: the large
// all-gather's and all-to-all's own CPU above the 4 KiB all-reduce's, over (n - 1)/n of the measured size. The file
// carries them to the node, a cluster file keeps them, and a kind left unmeasured falls back to the summed figure.
TEST(LinkCalibration, GatheredAndExchangedBytesTakeTheirOwnMeasuredCpuPerByte) {
  comm::LinkCalibration m = one_node(4);
  const size_t big = size_t{16} << 20;
  m.contended_all_gather_large = {true, big, 1, 10e-3, 20e-3, 10e-3, 2.2e-3, 2.1e-3, {}};
  m.contended_all_to_all_large = {true, big, 1, 8e-3, 18e-3, 10e-3, 3.2e-3, 3.1e-3, {}};
  const double port = 0.75 * static_cast<double>(big - 4096);
  EXPECT_NEAR(comm::gather_copy_cpu_s_per_byte(m), 2e-3 / port, 1e-18);
  EXPECT_NEAR(comm::exchange_copy_cpu_s_per_byte(m), 3e-3 / port, 1e-18);
  EXPECT_EQ(comm::gather_copy_cpu_s_per_byte(one_node(4)), 0);  // not measured (a file from before session 39)

  ClusterSpec c = four_ranks_on_two_cores();
  CommCalibrationInfo info;
  ASSERT_TRUE(
      apply_comm_calibration(Json::parse(comm::link_calibration_json(m, "test").dump()), "f.json", &c, &info).ok());
  EXPECT_NEAR(c.node.gather_copy_cpu_s_per_byte, 2e-3 / port, 1e-18);
  EXPECT_NEAR(c.node.exchange_copy_cpu_s_per_byte, 3e-3 / port, 1e-18);
  const double summed = comm::copy_cpu_s_per_byte(m);
  EXPECT_NEAR(cost::copy_seconds_per_byte(c.node, cost::CopyKind::kSummed), summed, 1e-18);
  EXPECT_NEAR(cost::copy_seconds_per_byte(c.node, cost::CopyKind::kGathered), 2e-3 / port, 1e-18);
  EXPECT_NEAR(cost::copy_seconds_per_byte(c.node, cost::CopyKind::kExchanged), 3e-3 / port, 1e-18);
  auto round = cluster_from_json(Json::parse(to_json(c).dump()), 1, "round trip");
  ASSERT_TRUE(round.ok()) << round.status().to_string();
  EXPECT_DOUBLE_EQ(round->node.gather_copy_cpu_s_per_byte, c.node.gather_copy_cpu_s_per_byte);
  EXPECT_DOUBLE_EQ(round->node.exchange_copy_cpu_s_per_byte, c.node.exchange_copy_cpu_s_per_byte);
  c.node.gather_copy_cpu_s_per_byte = 0;
  EXPECT_NEAR(cost::copy_seconds_per_byte(c.node, cost::CopyKind::kGathered), summed, 1e-18);
  c.node.exchange_copy_cpu_s_per_byte = -1e-9;
  EXPECT_NE(c.validate().message().find("node.exchange_copy_cpu_s_per_byte"), std::string::npos);
}

// Across nodes, the same figures measured over each node's own ranks set the node fields a collective inside one
// node takes (the world's carry the transport between nodes); a cluster file keeps them.
TEST(LinkCalibration, FiguresInsideOneNodeSetTheirOwnFields) {
  comm::LinkCalibration two = one_node(4);
  two.hosts = {"a", "b"};
  two.ranks = 8;
  two.node_sync_all_to_all = two.sync_all_to_all;
  two.node_sync_all_to_all.excess_s = 0.3e-3;
  two.node_sync_all_reduce = two.sync_all_reduce;
  two.node_sync_all_reduce.excess_s = 0;  // measured as nothing: taken, not the world's
  two.node_contended_all_to_all = two.contended_all_to_all;
  two.node_contended_all_to_all.cpu_s = 0.19e-3;
  two.node_contended_all_reduce = two.contended_all_reduce;
  two.node_contended_all_reduce.cpu_s = 0.22e-3;
  const Json file = Json::parse(comm::link_calibration_json(two, "test").dump());
  ASSERT_TRUE(file["measured"].contains("node_contended_all_to_all")) << file.dump();
  ClusterSpec c = load_cluster("local-cpu", 1).value();  // the node figures alone matter here
  c.node.devices_per_node = 4;
  c.node.shared_cores = 1;
  ASSERT_TRUE(apply_comm_calibration(file, "f.json", &c, nullptr).ok());
  EXPECT_DOUBLE_EQ(c.node.sync_excess_all_to_all_s, 2.0e-3);  // the world's, as before
  EXPECT_TRUE(c.node.node_figures);
  EXPECT_DOUBLE_EQ(c.node.sync_excess_node_all_to_all_s, 0.3e-3);
  EXPECT_EQ(c.node.sync_excess_node_other_s, 0);
  EXPECT_DOUBLE_EQ(c.node.busy_cpu_node_all_to_all_s, 0.19e-3);
  EXPECT_DOUBLE_EQ(c.node.busy_cpu_node_other_s, 0.22e-3);
  const sim::SyncCost cost = sim::sync_cost_of(c);
  EXPECT_TRUE(cost.node_figures);
  EXPECT_DOUBLE_EQ(cost.cpu_node_all_to_all_s, 0.19e-3);
  EXPECT_EQ(cost.ranks_per_node, 4);
  auto round = cluster_from_json(Json::parse(to_json(c).dump()), 1, "round trip");
  ASSERT_TRUE(round.ok()) << round.status().to_string();
  EXPECT_DOUBLE_EQ(round->node.busy_cpu_node_other_s, 0.22e-3);
  EXPECT_DOUBLE_EQ(round->node.sync_excess_node_all_to_all_s, 0.3e-3);
  EXPECT_TRUE(round->node.node_figures);  // the measured 0 kept as measured
  EXPECT_EQ(round->node.sync_excess_node_other_s, 0);
  // A calibration of one host applied afterwards replaces the whole set: no figures inside a node are left over.
  const Json one_host = Json::parse(comm::link_calibration_json(one_node(4), "test").dump());
  ClusterSpec again = c;
  ASSERT_TRUE(apply_comm_calibration(one_host, "g.json", &again, nullptr).ok());
  EXPECT_FALSE(again.node.node_figures);
  EXPECT_EQ(again.node.busy_cpu_node_all_to_all_s, 0);
  Json bad = file;
  bad["measured"]["node_contended_all_to_all"]["cpu_s"] = 2.0;  // seconds per call: at most 1
  ClusterSpec d = c;
  auto refused = apply_comm_calibration(bad, "f.json", &d, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("node_contended_all_to_all.cpu_s"), std::string::npos) << refused.message();
}

// The exchange chain's lags (by task length) reach the node as NodeSpec::exchange_lag, the simulator's SyncCost and
// the cluster file; a later calibration without the chain leaves none behind; a file whose points break the rule
// (task lengths ascending in (0, 1] s, lags in [0, 1] s) is refused by name.
TEST(LinkCalibration, TheExchangeChainsLagsReachTheNodeAndTheClusterFile) {
  comm::LinkCalibration cal = one_node(4);
  cal.exchange_chain.measured = true;
  cal.exchange_chain.busiest_factor = 1.5;
  cal.exchange_chain.task_s = {0.5e-3, 4e-3};
  cal.exchange_chain.lag_s = {0.25e-3, 2e-3};
  cal.exchange_chain.period_s = {1.6e-3, 10.2e-3};
  cal.exchange_chain.fluid_period_s = {1.25e-3, 10e-3};
  cal.exchange_chain.wait_s = {1e-3, 5e-3};
  cal.exchange_chain.wait_cpu_s = {0.1e-3, 0.3e-3};
  cal.exchange_chain.wait_cpu_share = 0.05;
  const Json file = Json::parse(comm::link_calibration_json(cal, "test").dump());
  ASSERT_TRUE(file["measured"].contains("exchange_chain")) << file.dump();
  EXPECT_EQ(file["measured"]["exchange_chain"]["points"].size(), 2u);
  ClusterSpec c = load_cluster("local-cpu", 1).value();
  c.node.devices_per_node = 4;
  c.node.shared_cores = 1;
  ASSERT_TRUE(apply_comm_calibration(file, "f.json", &c, nullptr).ok());
  const std::vector<std::pair<double, double>> want = {{0.5e-3, 0.25e-3}, {4e-3, 2e-3}};
  EXPECT_EQ(c.node.exchange_lag, want);
  EXPECT_EQ(sim::sync_cost_of(c).exchange_lag, want);
  EXPECT_DOUBLE_EQ(c.node.a2a_wait_cpu_share, 0.05);
  EXPECT_DOUBLE_EQ(sim::sync_cost_of(c).a2a_wait_cpu_share, 0.05);
  auto round = cluster_from_json(Json::parse(to_json(c).dump()), 1, "round trip");
  ASSERT_TRUE(round.ok()) << round.status().to_string();
  EXPECT_EQ(round->node.exchange_lag, want);
  EXPECT_DOUBLE_EQ(round->node.a2a_wait_cpu_share, 0.05);
  ClusterSpec again = c;
  ASSERT_TRUE(apply_comm_calibration(Json::parse(comm::link_calibration_json(one_node(4), "t").dump()), "g.json",
                                     &again, nullptr)
                  .ok());
  EXPECT_TRUE(again.node.exchange_lag.empty());
  EXPECT_EQ(again.node.a2a_wait_cpu_share, 0);
  Json share = file;
  share["measured"]["exchange_chain"]["wait_cpu_share"] = 1.5;  // a share of one core: at most 1
  ClusterSpec e = c;
  auto too_much = apply_comm_calibration(share, "f.json", &e, nullptr);
  ASSERT_FALSE(too_much.ok());
  EXPECT_NE(too_much.message().find("exchange_chain.wait_cpu_share"), std::string::npos) << too_much.message();
  for (auto [task_s, lag_s] : {std::pair{0.4e-3, 1e-3}, std::pair{8e-3, 2.0}, std::pair{0.0, 1e-3}}) {
    Json bad = file;
    bad["measured"]["exchange_chain"]["points"][1]["task_s"] = task_s;  // not ascending / lag too long / no task
    bad["measured"]["exchange_chain"]["points"][1]["lag_s"] = lag_s;
    ClusterSpec d = load_cluster("local-cpu", 1).value();
    d.node.devices_per_node = 4;
    auto refused = apply_comm_calibration(bad, "f.json", &d, nullptr);
    ASSERT_FALSE(refused.ok()) << task_s << " " << lag_s;
    EXPECT_NE(refused.message().find("exchange_chain.points: entry 1"), std::string::npos) << refused.message();
  }
  Json cluster = Json::parse(to_json(c).dump());
  cluster["node"]["exchange_lag"] = Json::parse("[[0.004, 0.001], [0.002, 0.001]]");
  auto refused = cluster_from_json(cluster, 1, "c.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("exchange_lag: entry 1"), std::string::npos) << refused.status().message();
  cluster["node"]["exchange_lag"] = Json::parse("[[0.004]]");
  EXPECT_FALSE(cluster_from_json(cluster, 1, "c.json").ok());
}

// The time after the last arrival on shared cores is bimodal (an early rank asleep in its backoff or not): the
// simulator needs its expected value. Half the iterations at 0.1 ms, half at 2.5 ms, one at 0 and one interrupted
// (80 ms): the trimmed mean is the body's mean, 1.3 ms; the median is a mode (2.5 ms), the plain mean the
// interruption's (5.2 ms).
TEST(LinkCalibration, TheTrimmedMeanOfABimodalSampleIsItsMeanNotAMode) {
  std::vector<double> samples = {0.0, 80e-3};
  for (int i = 0; i < 9; ++i) samples.insert(samples.end(), {0.1e-3, 2.5e-3});
  auto trimmed = comm::trimmed_mean(samples, 0.1);
  ASSERT_TRUE(trimmed.ok()) << trimmed.status().to_string();
  EXPECT_NEAR(*trimmed, 1.3e-3, 1e-12);
  std::sort(samples.begin(), samples.end());
  EXPECT_NEAR(samples[samples.size() / 2], 2.5e-3, 1e-12);  // what a median would have said
  auto plain = comm::trimmed_mean(samples, 0);
  ASSERT_TRUE(plain.ok());
  EXPECT_NEAR(*plain, (0.9e-3 + 22.5e-3 + 80e-3) / 20, 1e-12);
  auto one = comm::trimmed_mean({4e-3}, 0.4);  // too few to trim: the sample itself
  ASSERT_TRUE(one.ok());
  EXPECT_DOUBLE_EQ(*one, 4e-3);
}

TEST(LinkCalibration, TheTrimmedMeanRefusesNoSamplesABadTrimAndNonFiniteSamples) {
  auto none = comm::trimmed_mean({}, 0.1);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no samples"), std::string::npos) << none.status().message();
  for (double trim : {-0.1, 0.5, std::nan("")}) {
    auto bad = comm::trimmed_mean({1, 2, 3}, trim);
    ASSERT_FALSE(bad.ok()) << trim;
    EXPECT_NE(bad.status().message().find("allowed [0, 0.5)"), std::string::npos) << bad.status().message();
  }
  auto inf = comm::trimmed_mean({1, std::numeric_limits<double>::infinity()}, 0.1);
  ASSERT_FALSE(inf.ok());
  EXPECT_NE(inf.status().message().find("finite"), std::string::npos) << inf.status().message();
}

comm::SyncRound round_of(std::vector<double> after_s) {
  comm::SyncRound r;
  r.iteration_s.assign(after_s.size(), 5e-3);
  r.work_cpu_s.assign(after_s.size(), 4e-3);
  r.after_last_arrival_s = std::move(after_s);
  return r;
}

// Two rounds whose busy iterations fall into different modes: each round's excess differs, the figure is the
// pooled busy samples' trimmed mean less the idle samples' median, and the spread is the rounds' min and max. The
// idle loop's outlier (a rank descheduled while 4 poll on 2 cores) does not eat the excess.
TEST(LinkCalibration, TheSyncExcessIsTheBusyTrimmedMeanLessTheIdleMedianWithEachRoundsExcess) {
  const std::vector<comm::SyncRound> idle = {round_of({1e-4, 1e-4, 1e-4, 1e-4, 3e-3}),
                                             round_of({1e-4, 1e-4, 1e-4, 1e-4, 1e-4})};
  const std::vector<comm::SyncRound> busy = {round_of({0.2e-3, 0.2e-3, 0.2e-3, 0.2e-3, 2.2e-3}),
                                             round_of({0.2e-3, 2.2e-3, 2.2e-3, 2.2e-3, 2.2e-3})};
  auto s = comm::sync_under_load(idle, busy, 0.1);  // 10 pooled samples: one off each end
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(s->measured);
  EXPECT_EQ(s->samples_per_round, 5);
  EXPECT_DOUBLE_EQ(s->trim, 0.1);
  EXPECT_NEAR(s->busy.after_last_arrival_s, (4 * 0.2e-3 + 4 * 2.2e-3) / 8, 1e-12);
  EXPECT_NEAR(s->idle.after_last_arrival_s, 1e-4, 1e-12);
  EXPECT_NEAR(s->excess_s, 1.2e-3 - 1e-4, 1e-12);
  ASSERT_EQ(s->round_excess_s.size(), 2u);
  EXPECT_NEAR(s->round_excess_s[0], 0.6e-3 - 1e-4, 1e-12);  // 5 samples: none trimmed
  EXPECT_NEAR(s->round_excess_s[1], 1.8e-3 - 1e-4, 1e-12);
  EXPECT_DOUBLE_EQ(s->round_excess_min_s, s->round_excess_s[0]);
  EXPECT_DOUBLE_EQ(s->round_excess_max_s, s->round_excess_s[1]);
  EXPECT_NEAR(s->busy.iteration_s, 5e-3, 1e-12);
  EXPECT_NEAR(s->busy.work_cpu_s, 4e-3, 1e-12);

  // Busy faster than idle: no excess, not a negative one.
  auto faster = comm::sync_under_load({round_of({1e-3, 1e-3})}, {round_of({1e-4, 1e-4})}, 0.1);
  ASSERT_TRUE(faster.ok());
  EXPECT_EQ(faster->excess_s, 0);
  EXPECT_EQ(faster->round_excess_max_s, 0);
}

TEST(LinkCalibration, TheSyncExcessRefusesMissingOrUnmatchedRounds) {
  auto none = comm::sync_under_load({}, {}, 0.1);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("at least one (got 0 and 0)"), std::string::npos) << none.status().message();
  auto unmatched = comm::sync_under_load({round_of({1e-4})}, {round_of({1e-3}), round_of({1e-3})}, 0.1);
  ASSERT_FALSE(unmatched.ok());
  EXPECT_NE(unmatched.status().message().find("got 1 and 2"), std::string::npos) << unmatched.status().message();
  auto empty = comm::sync_under_load({round_of({})}, {round_of({1e-3})}, 0.1);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no samples"), std::string::npos) << empty.status().message();
}

// The file and the text show how stable each synchronisation figure is: every round's excess, its min and max.
TEST(LinkCalibration, TheFileAndTheTextCarryTheRoundsSpread) {
  const comm::LinkCalibration c = one_node(4);
  const Json file = Json::parse(comm::link_calibration_json(c, "test").dump());
  const Json& m = file["measured"]["sync_all_to_all"];
  EXPECT_DOUBLE_EQ(m["excess_s"].get<double>(), 2.0e-3);
  ASSERT_EQ(m["round_excess_s"].size(), 2u);
  EXPECT_DOUBLE_EQ(m["round_excess_s"][1].get<double>(), 2.4e-3);
  EXPECT_DOUBLE_EQ(m["round_excess_min_s"].get<double>(), 1.6e-3);
  EXPECT_DOUBLE_EQ(m["round_excess_max_s"].get<double>(), 2.4e-3);
  EXPECT_EQ(m["samples_per_round"].get<int>(), 12);
  EXPECT_DOUBLE_EQ(m["trim"].get<double>(), 0.1);
  const std::string text = comm::to_text(c);
  EXPECT_NE(text.find("2 rounds of 12 samples: 1.600 ms .. 2.400 ms more per round (trimmed means, 10% off each end)"),
            std::string::npos)
      << text;
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
