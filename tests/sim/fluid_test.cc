// FluidNet: incremental max-min sharing, dependencies and latency, against hand-computed times.
#include "piper/sim/fluid.h"

#include <gtest/gtest.h>

#include <cmath>

namespace piper::sim {
namespace {

FlowTemplate one_flow(int link, double latency_s = 0, double weight = 1) {
  FlowTemplate t;
  t.flows.push_back({{{link, weight}}, 1.0, latency_s, {}, {}});
  t.finalize();
  return t;
}

// Runs until idle; returns the completion time of each token (index = token).
std::vector<double> drain(FluidNet& net, size_t tokens) {
  std::vector<double> done(tokens, -1);
  std::vector<int64_t> out;
  while (!net.idle()) {
    double t = net.next_time();
    EXPECT_TRUE(std::isfinite(t));
    out.clear();
    net.advance(t, &out);
    for (int64_t k : out) done[static_cast<size_t>(k)] = t;
  }
  return done;
}

TEST(FluidTest, TwoFlowsOnOneLinkEachGetHalfTheBandwidth) {
  FluidNet net({100.0});
  FlowTemplate t = one_flow(0);
  net.start(&t, 100.0, 0.0, 0);
  net.start(&t, 100.0, 0.0, 1);
  std::vector<double> done = drain(net, 2);
  EXPECT_DOUBLE_EQ(done[0], 2.0);  // 100 bytes at 50 B/s each
  EXPECT_DOUBLE_EQ(done[1], 2.0);
}

TEST(FluidTest, LateFlowSharesOnlyWhileBothAreActive) {
  FluidNet net({100.0});
  FlowTemplate t = one_flow(0);
  net.start(&t, 100.0, 0.0, 0);
  // Run alone for 0.5 s (50 bytes), then share: 50 bytes left at 50 B/s -> done at 1.5; the second flow moved
  // 50 bytes by then and finishes its last 50 at full rate -> 2.0.
  std::vector<int64_t> out;
  net.advance(net.next_time(), &out);  // the flow becomes active at 0
  net.advance(0.5, &out);
  net.start(&t, 100.0, 0.5, 1);
  std::vector<double> done = drain(net, 2);
  EXPECT_DOUBLE_EQ(done[0], 1.5);
  EXPECT_DOUBLE_EQ(done[1], 2.0);
}

TEST(FluidTest, DependenciesAndLatencyChain) {
  FluidNet net({10.0, 10.0});
  FlowTemplate t;
  t.flows.push_back({{{0, 1.0}}, 1.0, 0.25, {}, {}});
  t.flows.push_back({{{1, 1.0}}, 1.0, 0.25, {0}, {}});
  t.finalize();
  net.start(&t, 10.0, 1.0, 7);
  std::vector<double> done = drain(net, 8);
  EXPECT_DOUBLE_EQ(done[7], 1.0 + 0.25 + 1.0 + 0.25 + 1.0);
}

TEST(FluidTest, AggregateWeightLoadsTheLinkForEveryMember) {
  // One representative flow standing for 4 members on a shared link: each member gets a quarter.
  FluidNet net({100.0});
  FlowTemplate t = one_flow(0, 0, 4.0);
  net.start(&t, 100.0, 0.0, 0);
  EXPECT_DOUBLE_EQ(drain(net, 1)[0], 4.0);
}

TEST(FluidTest, EmptyTransferCompletesAtItsStart) {
  FluidNet net({1.0});
  FlowTemplate empty;
  empty.finalize();
  net.start(&empty, 5.0, 0.0, 0);
  EXPECT_FALSE(net.idle());
  EXPECT_DOUBLE_EQ(net.next_time(), 0.0);
  std::vector<int64_t> out;
  net.advance(net.next_time(), &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], 0);
}

}  // namespace
}  // namespace piper::sim
