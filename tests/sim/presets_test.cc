// The network model on the compiled-in cluster presets.
#include "piper/spec/presets.h"

#include <gtest/gtest.h>

#include "piper/sim/collectives.h"
#include "piper/spec/cluster_loader.h"

namespace piper::sim {
namespace {

std::vector<std::string> names(const Network& net, const Route& r) {
  std::vector<std::string> out;
  for (int l : r.links) out.push_back(net.links()[l].name());
  return out;
}

TEST(PresetsTest, EveryClusterPresetBuildsAndRoutes) {
  for (const std::string& name : cluster_preset_names()) {
    for (int nodes : {1, 2, 300}) {
      Result<ClusterSpec> c = load_cluster(name, nodes);
      if (!c.ok()) continue;  // a fixed box (max_nodes) refuses larger counts
      Result<Network> net = Network::build(*c);
      ASSERT_TRUE(net.ok()) << name << " x" << nodes << ": " << net.status().to_string();
      const int last = net->num_devices() - 1;
      Result<Route> r = net->route(0, last);
      ASSERT_TRUE(r.ok()) << name << ": " << r.status().to_string();
      if (last > 0) {
        EXPECT_FALSE(r->links.empty()) << name;
      }
      EXPECT_GT(r->latency_s, 0) << name;
    }
  }
}

TEST(PresetsTest, FrontierRoutes) {
  Network net = Network::build(load_cluster("frontier", 256).value()).value();  // two dragonfly groups
  EXPECT_EQ(net.num_groups(), 2);
  // GCD 0 -> GCD 1 share an MI250X: the 200 GB/s direct link; GCD 1 -> GCD 2 cross packages: 50 GB/s.
  Route same_package = net.route(0, 1).value();
  ASSERT_EQ(same_package.links.size(), 1u);
  EXPECT_DOUBLE_EQ(net.links()[same_package.links[0]].bw_bytes_per_s, 200e9);
  EXPECT_DOUBLE_EQ(net.links()[net.route(1, 2).value().links[0]].bw_bytes_per_s, 50e9);
  // GCD 2 uses NIC 1 (near_devices {2, 3}); GCD 5 of node 1 arrives on NIC 2.
  EXPECT_EQ(names(net, net.route(2, 8 + 5).value()),
            (std::vector<std::string>{"node0.nic1.tx", "group0.fabric", "node1.nic2.rx"}));
  // Node 0 to node 128 crosses the global links: 4 us NIC + 2 us inter-group latency.
  Route far = net.route(0, 128 * 8).value();
  EXPECT_EQ(far.links.size(), 6u);
  EXPECT_DOUBLE_EQ(far.latency_s, 4e-6 + 2e-6);
  EXPECT_DOUBLE_EQ(net.links()[far.links[2]].bw_bytes_per_s, 128 * 4 * 25e9 / 1.75);
}

TEST(PresetsTest, FrontierRingInsideANodeIsBoundByTheSlowestPair) {
  // Ring 0..7: the steps cross 50 GB/s links (1 -> 2, 3 -> 4, ...), so the ring runs at 50 GB/s:
  // 2(n-1)/n * S / 50 GB/s + 2(n-1) * 5 us.
  Network net = Network::build(load_cluster("frontier", 1).value()).value();
  FlowSim sim(net.link_bandwidths());
  CollectiveFlows c = add_ring_all_reduce(net, &sim, {0, 1, 2, 3, 4, 5, 6, 7}, 1e9).value();
  const double closed = 2.0 * 7 / 8 * 1e9 / 50e9 + 14 * 5e-6;
  EXPECT_NEAR(finish_time_s(sim.run(), c), closed, 0.01 * closed);
}

}  // namespace
}  // namespace piper::sim
