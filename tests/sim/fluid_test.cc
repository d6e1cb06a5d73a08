// FluidNet: incremental max-min sharing, dependencies and latency, against hand-computed times.
#include "piper/sim/fluid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

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

// Random transfers over a small network with one large link every flow crosses (a fabric): the local rate
// recomputation (the default) against the reference (every flow at each change). Returns the completion time of
// each transfer; `full` counts the local form's fallbacks to a recomputation over every flow.
std::vector<double> run_random(uint64_t seed, bool local_rates, int64_t* full, bool due_filter = true,
                               std::vector<int64_t>* order = nullptr) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto next = [&x](int n) {  // xorshift64*, then uniform in [0, n)
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return static_cast<int>(((x * 0x2545F4914F6CDD1DULL) >> 33) % static_cast<uint64_t>(n));
  };
  const int num_links = 12;
  std::vector<double> bw;
  for (int l = 0; l < num_links; ++l) bw.push_back(50.0 + 10.0 * next(8));
  bw.push_back(1e9);  // the fabric: never saturated
  bw.push_back(70.0);  // a shared link that does saturate now and then
  std::vector<FlowTemplate> tmpls(40);
  for (FlowTemplate& t : tmpls) {
    const int flows = 1 + next(4);
    for (int f = 0; f < flows; ++f) {
      FlowTemplate::Flow flow;
      const int a = next(num_links), b = next(num_links);
      flow.hops.push_back({a, 1.0 + next(3)});
      if (b != a) flow.hops.push_back({b, 1.0});
      flow.hops.push_back({num_links, 4.0});
      if (next(4) == 0) flow.hops.push_back({num_links + 1, 1.0});
      flow.bytes = 1.0 + next(5);
      flow.latency_s = 0.01 * next(3);
      if (f > 0 && next(2) == 0) flow.after.push_back(next(f));
      t.flows.push_back(flow);
    }
    t.finalize();
  }
  FluidNet net(bw, local_rates, due_filter);
  std::vector<double> starts(tmpls.size());
  for (size_t i = 0; i < starts.size(); ++i) starts[i] = 0.05 * next(100);
  std::sort(starts.begin(), starts.end());
  std::vector<double> done(tmpls.size(), -1);
  std::vector<int64_t> out;
  size_t started = 0;
  double now = 0;
  while (started < tmpls.size() || !net.idle()) {
    const double t = std::min(net.next_time(), started < tmpls.size() ? starts[started] : INFINITY);
    out.clear();
    net.advance(t, &out);
    now = t;
    for (int64_t k : out) done[static_cast<size_t>(k)] = now;
    if (order) order->insert(order->end(), out.begin(), out.end());
    while (started < tmpls.size() && starts[started] <= now) {
      net.start(&tmpls[started], 1.0 + next(3), now, static_cast<int64_t>(started));
      ++started;
    }
  }
  *full = net.full_rate_updates();
  return done;
}

TEST(FluidTest, LocalRatesGiveTheReferenceCompletionTimes) {
  int64_t fallbacks = 0, local_updates = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    int64_t full_local = 0, full_ref = 0;
    const std::vector<double> local = run_random(seed, true, &full_local);
    const std::vector<double> ref = run_random(seed, false, &full_ref);
    ASSERT_EQ(local.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_GT(ref[i], 0) << "seed " << seed << " transfer " << i;
      EXPECT_NEAR(local[i], ref[i], 1e-9 * ref[i]) << "seed " << seed << " transfer " << i;
    }
    fallbacks += full_local;
    local_updates += full_ref - full_local;
  }
  EXPECT_GT(fallbacks, 0);      // the shared link saturated somewhere: the fallback ran and was checked too
  EXPECT_GT(local_updates, 0);  // and the local form did most of the work
}

// advance() tests only the flows due by now (plus a margin) in full; without the filter it tests every flow in flight.
// Both must complete the same transfers at the same times, to the bit, in the same order.
TEST(FluidTest, DueFilterGivesTheSameCompletionsAsTestingEveryFlow) {
  for (bool local : {true, false}) {
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      int64_t full_a = 0, full_b = 0;
      std::vector<int64_t> order_a, order_b;
      const std::vector<double> filtered = run_random(seed, local, &full_a, true, &order_a);
      const std::vector<double> every = run_random(seed, local, &full_b, false, &order_b);
      ASSERT_EQ(filtered.size(), every.size());
      for (size_t i = 0; i < every.size(); ++i) {
        ASSERT_GT(every[i], 0) << "seed " << seed << " transfer " << i;
        EXPECT_EQ(filtered[i], every[i]) << "seed " << seed << " transfer " << i;
      }
      EXPECT_EQ(order_a, order_b) << "seed " << seed;
      EXPECT_EQ(full_a, full_b) << "seed " << seed;
    }
  }
}

}  // namespace
}  // namespace piper::sim
