// The simulator's HALO proxies are the runtime's: HaloLayout against comm::NodeTopology.
#include <gtest/gtest.h>

#include "piper/comm/algorithms/topology.h"
#include "piper/sim/collectives.h"

namespace piper::sim {
namespace {

TEST(HaloLayoutTest, ProxiesMatchTheRuntime) {
  for (int k : {1, 2, 4, 8}) {
    for (int lanes = 1; lanes <= k; ++lanes) {
      if (k % lanes != 0) continue;
      const int nodes = 5;
      comm::NodeTopology topo = comm::NodeTopology::create(nodes * k, k, lanes).value();
      HaloLayout layout{k, lanes};
      for (int local = 0; local < k; ++local) EXPECT_EQ(layout.lane_of(local), topo.lane_of(local));
      for (int n = 0; n < nodes; ++n) {
        for (int m = 0; m < nodes; ++m) {
          for (int l = 0; l < lanes; ++l) {
            EXPECT_EQ(layout.send_proxy(n, m, l), topo.send_proxy(n, m, l)) << k << " " << lanes;
            EXPECT_EQ(layout.recv_proxy(n, m, l), topo.recv_proxy(n, m, l)) << k << " " << lanes;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace piper::sim
