#include "piper/sim/collectives.h"

#include <gtest/gtest.h>

#include <numeric>

#include "test_clusters.h"

namespace piper::sim {
namespace {

using testing::make_cluster;

std::vector<int> iota(int n, int first = 0, int stride = 1) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i * stride;
  return v;
}

// Runs one collective alone and returns its time.
template <typename AddFn>
double time_alone(const Network& net, AddFn add) {
  FlowSim sim(net.link_bandwidths());
  CollectiveFlows c = add(&sim).value();
  return finish_time_s(sim.run(), c);
}

TEST(CollectivesTest, RingAllReduceMatchesAlphaBetaInsideANode) {
  // 8 devices on a 450 GB/s switch, alpha 3 us: 2(n-1)/n * S/bw + 2(n-1) * alpha.
  Network net = Network::build(make_cluster(1, 8, 450e9, 0, 0, 3e-6)).value();
  for (double bytes : {1e6, 256e6, 4e9}) {
    const double t = time_alone(net, [&](FlowSim* s) { return add_ring_all_reduce(net, s, iota(8), bytes); });
    const double closed = 2.0 * 7 / 8 * bytes / 450e9 + 2 * 7 * 3e-6;
    EXPECT_NEAR(t, closed, 0.01 * closed) << bytes;
  }
}

TEST(CollectivesTest, RingAllReduceMatchesAlphaBetaAcrossNodes) {
  // One device per node on 16 nodes, 25 GB/s NICs, 5 us per hop; the untapered fabric is never the bottleneck.
  Network net = Network::build(make_cluster(16, 1, 0, 1, 25e9, 0, 5e-6)).value();
  for (double bytes : {1e6, 1e9}) {
    const double t = time_alone(net, [&](FlowSim* s) { return add_ring_all_reduce(net, s, iota(16), bytes); });
    const double closed = 2.0 * 15 / 16 * bytes / 25e9 + 2 * 15 * 5e-6;
    EXPECT_NEAR(t, closed, 0.01 * closed) << bytes;
  }
  // Reduce-scatter and all-gather are each half of it.
  const double rs = time_alone(net, [&](FlowSim* s) { return add_ring_reduce_scatter(net, s, iota(16), 1e9); });
  const double ag = time_alone(net, [&](FlowSim* s) { return add_ring_all_gather(net, s, iota(16), 1e9); });
  EXPECT_NEAR(rs, 15.0 / 16 * 1e9 / 25e9 + 15 * 5e-6, 1e-9);
  EXPECT_NEAR(ag, rs, 1e-9);
}

// Long rings run as kMaxRingStages stages of consecutive steps: on uniform links the time is still the alpha-beta
// closed form of n-1 steps, with ~(n-1)/64 times fewer flows; rings of up to 64 steps keep one flow per step.
TEST(CollectivesTest, LongRingsRunInStagesWithTheSameTime) {
  for (int n : {65, 200, 1024}) {
    Network net = Network::build(make_cluster(n, 1, 0, 1, 25e9, 0, 5e-6)).value();
    for (double bytes : {1e6, 1e9}) {
      FlowSim sim(net.link_bandwidths());
      CollectiveFlows c = add_ring_all_gather(net, &sim, iota(n), bytes).value();
      const double t = finish_time_s(sim.run(), c);
      const double closed = (n - 1.0) / n * bytes / 25e9 + (n - 1) * 5e-6;
      EXPECT_NEAR(t, closed, 1e-9 * closed) << n << " " << bytes;
      const int g = (n - 1 + kMaxRingStages - 1) / kMaxRingStages;
      const int stages = (n - 1 + g - 1) / g;
      EXPECT_LE(stages, kMaxRingStages);
      EXPECT_EQ(c.phases.size(), static_cast<size_t>(stages)) << n;
      EXPECT_EQ(c.flows.size(), static_cast<size_t>(stages * n)) << n;
      if (n == 65) {
        EXPECT_EQ(stages, 64);
      }
    }
    FlowSim sim(net.link_bandwidths());
    CollectiveFlows ar = add_ring_all_reduce(net, &sim, iota(n), 1e9).value();
    const double closed = 2.0 * (n - 1) / n * 1e9 / 25e9 + 2 * (n - 1) * 5e-6;
    EXPECT_NEAR(finish_time_s(sim.run(), ar), closed, 1e-9 * closed) << n;
  }
}

TEST(CollectivesTest, TreeAllReduceByHand) {
  // 3 ranks on a 100 GB/s switch, alpha 1 us, one chunk: both leaves send 1 GB to the root, whose in-port they
  // share (0.02 s), then the root sends 1 GB to each leaf through its shared out-port (0.02 s): 0.04 s + 2 alpha.
  Network net = Network::build(make_cluster(1, 3, 100e9, 0, 0, 1e-6)).value();
  EXPECT_NEAR(time_alone(net, [&](FlowSim* s) { return add_tree_all_reduce(net, s, iota(3), 1e9, 1); }), 0.04 + 2e-6,
              1e-12);
  // Two ranks, 4 chunks: the down-going chunk j overlaps the up-going chunk j+1 (different ports):
  // 4 chunks up at 0.0025 s each, the last one then goes down: 5 x (0.0025 s + 1 us).
  Network two = Network::build(make_cluster(1, 2, 100e9, 0, 0, 1e-6)).value();
  EXPECT_NEAR(time_alone(two, [&](FlowSim* s) { return add_tree_all_reduce(two, s, iota(2), 1e9, 4); }),
              5 * (0.0025 + 1e-6), 1e-12);
  // Pipelining pays on a deep tree: 15 ranks, 16 chunks beat 1 chunk.
  Network deep = Network::build(make_cluster(1, 15, 100e9, 0, 0, 1e-6)).value();
  const double one = time_alone(deep, [&](FlowSim* s) { return add_tree_all_reduce(deep, s, iota(15), 1e9, 1); });
  const double many = time_alone(deep, [&](FlowSim* s) { return add_tree_all_reduce(deep, s, iota(15), 1e9, 16); });
  EXPECT_LT(many, 0.6 * one);
  FlowSim sim(deep.link_bandwidths());
  EXPECT_FALSE(add_tree_all_reduce(deep, &sim, iota(3), 1e9, 0).ok());
}

TEST(CollectivesTest, FlatAllToAllByHand) {
  // 2 nodes x 2 devices, one 10 GB/s NIC per node, 100 GB/s switch. Each device sends 1 GB to each other
  // device: the NIC carries 4 GB out per node (0.4 s); the 1 GB inside the node takes 0.01 s.
  Network net = Network::build(make_cluster(2, 2, 100e9, 1, 10e9)).value();
  const auto m = std::vector<std::vector<double>>(4, std::vector<double>(4, 1e9));
  EXPECT_NEAR(time_alone(net, [&](FlowSim* s) { return add_all_to_all_flat(net, s, iota(4), m); }), 0.4, 1e-12);
}

// The runtime's HALO all-to-all-v (cost/halo_traffic.h append_halo_all_to_all_v, every block batched) as flows.
Result<CollectiveFlows> halo_all_to_all_v(const Network& net, FlowSim* sim, const std::vector<int>& devices, int lanes,
                                          const std::vector<std::vector<double>>& m) {
  PIPER_ASSIGN_OR_RETURN(HaloLayout layout, HaloLayout::of_group(net, devices, lanes));
  const int k = layout.ranks_per_node;
  cost::HaloTraffic traffic;
  cost::append_halo_all_to_all_v({static_cast<int>(devices.size()) / k, k, lanes}, m, 0, {}, &traffic);
  return add_halo_traffic(net, sim, devices, traffic);
}

TEST(CollectivesTest, HaloRailAlignedByHand) {
  // Same cluster, lanes = 2 (every rank is its own proxy). Phase I (same node, 1 GB, 0.01 s) runs during
  // phase II: each device sends its 2 GB for the other node to its rail peer; the two batches of a node share its
  // NIC (5 GB/s each): 0.4 s. Phase III: the receive proxy forwards the 1 GB meant for its neighbour, 0.01 s,
  // after the batch arrived: 0.41 s in all.
  Network net = Network::build(make_cluster(2, 2, 100e9, 1, 10e9)).value();
  FlowSim sim(net.link_bandwidths());
  const auto m = std::vector<std::vector<double>>(4, std::vector<double>(4, 1e9));
  CollectiveFlows c = halo_all_to_all_v(net, &sim, iota(4), 2, m).value();
  ASSERT_EQ(c.phases.size(), 3u);
  EXPECT_EQ(c.phases[0].size(), 4u);  // 2 nodes x 2 ordered pairs, no gather (own proxy)
  EXPECT_EQ(c.phases[1].size(), 4u);  // each device -> its rail peer
  EXPECT_EQ(c.phases[2].size(), 4u);
  double phase2_bytes = 0;
  for (int f : c.phases[1]) phase2_bytes += sim.flow(f).bytes;
  EXPECT_DOUBLE_EQ(phase2_bytes, 8e9);  // everything that crosses nodes, batched
  const std::vector<double> t = sim.run();
  EXPECT_NEAR(finish_time_s(t, c), 0.41, 1e-12);
  double phase2_end = 0, phase3_start = 1e9;
  for (int f : c.phases[1]) phase2_end = std::max(phase2_end, t[f]);
  for (int f : c.phases[2]) phase3_start = std::min(phase3_start, t[f] - sim.flow(f).bytes / 100e9);
  EXPECT_NEAR(phase3_start, phase2_end, 1e-12);
  for (int f : c.phases[0]) EXPECT_NEAR(t[f], 0.01, 1e-12);  // phase I overlaps phase II
}

TEST(CollectivesTest, HaloOneLaneByHand) {
  // lanes = 1: node 0's send proxy for node 1 is local 1, the receive proxy on node 1 is local 0 (and mirrored).
  // Device (0,0) sends 1 GB directly to (0,1) and its 2 GB piece to the proxy (0,1) on the same port: 50 GB/s
  // each until the direct block ends at 0.02 s, the rest at 100 GB/s: gather done at 0.03 s. The 4 GB batch over
  // the 10 GB/s NIC: 0.43 s. The receive proxy scatters 2 GB to its neighbour: 0.45 s.
  Network net = Network::build(make_cluster(2, 2, 100e9, 1, 10e9)).value();
  FlowSim sim(net.link_bandwidths());
  const auto m = std::vector<std::vector<double>>(4, std::vector<double>(4, 1e9));
  CollectiveFlows c = halo_all_to_all_v(net, &sim, iota(4), 1, m).value();
  EXPECT_EQ(c.phases[0].size(), 6u);  // 4 direct + 2 gathers
  ASSERT_EQ(c.phases[1].size(), 2u);  // one batch per ordered node pair
  EXPECT_EQ(c.phases[2].size(), 2u);
  EXPECT_EQ(net.links()[net.route(1, 2).value().links[0]].name(), "node0.nic0.tx");
  const FlowSpec& batch = sim.flow(c.phases[1][0]);  // node 0 -> node 1
  EXPECT_DOUBLE_EQ(batch.bytes, 4e9);
  const std::vector<double> t = sim.run();
  EXPECT_NEAR(t[c.phases[1][0]], 0.43, 1e-12);
  EXPECT_NEAR(finish_time_s(t, c), 0.45, 1e-12);
}

TEST(CollectivesTest, HaloConservesBytesOnUnevenTraffic) {
  // 3 nodes x 4 devices, 2 lanes, uneven bytes: everything sent to another node crosses phase II exactly once,
  // and what reaches a rank through a proxy (phase III) or directly as its own proxy adds up.
  Network net = Network::build(make_cluster(3, 4, 100e9, 2, 10e9)).value();
  std::vector<std::vector<double>> m(12, std::vector<double>(12));
  double remote = 0;
  for (int i = 0; i < 12; ++i) {
    for (int j = 0; j < 12; ++j) {
      m[i][j] = (i * 7 + j * 3) % 5 * 1e6;  // includes zeros
      if (i / 4 != j / 4) remote += m[i][j];
    }
  }
  FlowSim sim(net.link_bandwidths());
  CollectiveFlows c = halo_all_to_all_v(net, &sim, iota(12), 2, m).value();
  double batched = 0;
  for (int f : c.phases[1]) batched += sim.flow(f).bytes;
  EXPECT_DOUBLE_EQ(batched, remote);
  for (int f : c.flows) EXPECT_GT(sim.flow(f).bytes, 0);  // no zero-byte flows
  EXPECT_LE(c.phases[1].size(), 3u * 2 * 2);              // at most one batch per (node pair, lane)
  const std::vector<double> t = sim.run();
  EXPECT_GT(finish_time_s(t, c), 0);
}

// The MoE dispatch and combine of the one HALO model (cost/halo_traffic.h) as flows: deduplicated per node, the
// dispatch crosses the NICs with fewer bytes than the flat all-to-all of the same tokens, and the simulated time
// agrees with the closed form's alpha-beta time of the same messages (halo_traffic_time_s) within 10 %.
TEST(CollectivesTest, HaloDispatchAndCombineFollowTheTrafficModel) {
  for (int lanes : {1, 2}) {
    Network net = Network::build(make_cluster(2, 2, 100e9, lanes, 10e9 / lanes, 1e-6, 5e-6)).value();
    const cost::HaloGroupShape g{2, 2, lanes};
    const cost::HaloRouting r{16, 4};
    const double tokens = 4096, tb = 16384;
    const cost::HaloLinkModel link{100e9, 1e-6, 10e9 / lanes, 5e-6};
    const double flat_s = time_alone(net, [&](FlowSim* s) {
      return add_all_to_all_flat(net, s, iota(4), uniform_all_to_all(4, tokens * r.top_k * tb));
    });
    for (bool dispatch : {true, false}) {
      const cost::HaloTraffic t = dispatch ? cost::halo_dispatch_traffic(g, r, tokens, tb).value()
                                           : cost::halo_combine_traffic(g, r, tokens, tb).value();
      FlowSim sim(net.link_bandwidths());
      CollectiveFlows c = add_halo_traffic(net, &sim, iota(4), t).value();
      ASSERT_EQ(c.flows.size(), t.messages.size());
      const double sim_s = finish_time_s(sim.run(), c), model_s = cost::halo_traffic_time_s(g, t, link);
      EXPECT_NEAR(sim_s, model_s, 0.1 * model_s) << "lanes " << lanes << (dispatch ? " dispatch" : " combine");
      EXPECT_LT(sim_s, flat_s) << "lanes " << lanes << (dispatch ? " dispatch" : " combine");
    }
  }
}

TEST(CollectivesTest, HaloNeedsANodeMajorGroup) {
  Network net = Network::build(make_cluster(2, 2, 100e9, 1, 10e9)).value();
  FlowSim sim(net.link_bandwidths());
  const auto m3 = std::vector<std::vector<double>>(3, std::vector<double>(3, 1.0));
  EXPECT_NE(halo_all_to_all_v(net, &sim, {0, 1, 2}, 1, m3).status().message().find("node-major"), std::string::npos);
  const auto m4 = std::vector<std::vector<double>>(4, std::vector<double>(4, 1.0));
  EXPECT_FALSE(halo_all_to_all_v(net, &sim, {0, 2, 1, 3}, 1, m4).ok());
  EXPECT_NE(halo_all_to_all_v(net, &sim, iota(4), 3, m4).status().message().find("lanes=3"), std::string::npos);
}

TEST(CollectivesTest, EpAllToAllAndDpAllReduceContendOnTheNic) {
  // 2 nodes x 4 devices, one 25 GB/s NIC per node. EP all-to-all over all 8 devices; DP all-reduce between
  // device 0 of each node. Both cross the same NICs, so each is slower together than alone.
  Network net = Network::build(make_cluster(2, 4, 450e9, 1, 25e9, 1e-6, 5e-6)).value();
  const auto ep = uniform_all_to_all(8, 2e9);
  const std::vector<int> dp = {0, 4};
  const double ep_alone = time_alone(net, [&](FlowSim* s) { return add_all_to_all_flat(net, s, iota(8), ep); });
  const double dp_alone = time_alone(net, [&](FlowSim* s) { return add_ring_all_reduce(net, s, dp, 1e9); });
  FlowSim sim(net.link_bandwidths());
  CollectiveFlows a = add_all_to_all_flat(net, &sim, iota(8), ep).value();
  CollectiveFlows r = add_ring_all_reduce(net, &sim, dp, 1e9).value();
  const std::vector<double> t = sim.run();
  // By hand: alone, a NIC carries 16 EP flows of 0.25 GB (4 GB: 0.16 s + 5 us), and the DP ring 2 steps of
  // 0.5 GB (2 x (0.02 s + 5 us)). Together, the 17 flows get 25/17 GB/s each: the EP flows end at 0.17 s (+5 us)
  // with 0.25 GB of the DP step left, which then runs alone (0.01 s), then the second DP step (0.02 s + 5 us).
  EXPECT_NEAR(ep_alone, 0.16 + 5e-6, 1e-12);
  EXPECT_NEAR(dp_alone, 2 * (0.02 + 5e-6), 1e-12);
  EXPECT_NEAR(finish_time_s(t, a), 0.17 + 5e-6, 1e-12);
  EXPECT_NEAR(finish_time_s(t, r), 0.2 + 10e-6, 1e-12);
  EXPECT_GT(finish_time_s(t, a), 1.05 * ep_alone);
  EXPECT_GT(finish_time_s(t, r), 2 * dp_alone);
  // The NIC is shared, not wasted: together they take no longer than one after the other.
  EXPECT_LE(std::max(finish_time_s(t, a), finish_time_s(t, r)), (ep_alone + dp_alone) * 1.0001);
}

TEST(CollectivesTest, AggregateAllToAllEqualsTheFullOne) {
  struct Case {
    int nodes, gpus, nics;
    double taper;
  };
  for (Case cs : {Case{2, 4, 2, 1}, Case{4, 2, 1, 2}, Case{3, 4, 4, 1.5}, Case{1, 8, 0, 1}, Case{4, 1, 1, 3}}) {
    ClusterSpec c = make_cluster(cs.nodes, cs.gpus, 200e9, cs.nics, 25e9, 1e-6, 4e-6);
    c.fabric.intra_group_taper = cs.taper;
    Network net = Network::build(c).value();
    const int n = cs.nodes * cs.gpus;
    const double full =
        time_alone(net, [&](FlowSim* s) { return add_all_to_all_flat(net, s, iota(n), uniform_all_to_all(n, 1e9)); });
    FlowSim sim(net.link_bandwidths());
    CollectiveFlows agg = add_all_to_all_uniform_aggregate(net, &sim, iota(n), 1e9).value();
    EXPECT_EQ(static_cast<int>(agg.flows.size()), n - 1);
    EXPECT_NEAR(finish_time_s(sim.run(), agg), full, 1e-9 * full)
        << cs.nodes << " nodes x " << cs.gpus << " gpus, " << cs.nics << " nics, taper " << cs.taper;
  }
}

TEST(CollectivesTest, AggregateAllToAllRefusesAsymmetricGroups) {
  Network net = Network::build(make_cluster(2, 4, 200e9, 2, 25e9)).value();
  FlowSim sim(net.link_bandwidths());
  // Devices 0 and 2 share NIC 0: the group uses only NIC 0 on node 0 but local devices 0, 2 vs 4+1, 4+3 differ.
  EXPECT_NE(add_all_to_all_uniform_aggregate(net, &sim, {0, 2, 5, 7}, 1e9).status().message().find("not symmetric"),
            std::string::npos);
  // Devices 0, 1, 2 on NICs 0, 1, 0: NIC 0 serves two ranks, NIC 1 one.
  EXPECT_FALSE(add_all_to_all_uniform_aggregate(net, &sim, {0, 1, 2, 4, 5, 6}, 1e9).ok());
  EXPECT_TRUE(add_all_to_all_uniform_aggregate(net, &sim, {0, 2, 4, 6}, 1e9).ok());
}

TEST(CollectivesTest, AggregateParallelRingsEqualTheFullOnes) {
  struct Case {
    int nodes, gpus, nics;
    double taper;
    std::vector<int> locals;
  };
  for (const Case& cs : {Case{4, 4, 2, 1, {0, 1, 2, 3}}, Case{3, 4, 4, 2, {0, 1, 2, 3}}, Case{4, 4, 2, 3, {0, 2}},
                         Case{5, 2, 1, 1, {1}}}) {
    ClusterSpec c = make_cluster(cs.nodes, cs.gpus, 200e9, cs.nics, 25e9, 1e-6, 4e-6);
    c.fabric.intra_group_taper = cs.taper;
    Network net = Network::build(c).value();
    FlowSim full(net.link_bandwidths());
    std::vector<CollectiveFlows> rings;
    for (int g : cs.locals) rings.push_back(add_ring_all_reduce(net, &full, iota(cs.nodes, g, cs.gpus), 1e9).value());
    const std::vector<double> t_full = full.run();
    FlowSim agg(net.link_bandwidths());
    CollectiveFlows rep = add_parallel_rings_all_reduce_aggregate(net, &agg, iota(cs.nodes), cs.locals, 1e9).value();
    EXPECT_EQ(static_cast<int>(rep.flows.size()), 2 * (cs.nodes - 1));
    const double t_rep = finish_time_s(agg.run(), rep);
    for (const CollectiveFlows& r : rings) {
      EXPECT_NEAR(finish_time_s(t_full, r), t_rep, 1e-9 * t_rep)
          << cs.nodes << " nodes x " << cs.gpus << " gpus, " << cs.nics << " nics, taper " << cs.taper;
    }
  }
  Network net = Network::build(make_cluster(4, 4, 200e9, 2, 25e9)).value();
  FlowSim sim(net.link_bandwidths());
  EXPECT_FALSE(add_parallel_rings_all_reduce_aggregate(net, &sim, {0}, {0}, 1e9).ok());
  EXPECT_NE(add_parallel_rings_all_reduce_aggregate(net, &sim, iota(4), {0, 1, 3}, 1e9)
                .status()
                .message()
                .find("not symmetric"),
            std::string::npos);
}

TEST(CollectivesTest, M2nAndP2p) {
  // 2 attention devices on node 0 send to 2 expert devices on node 1 through one 10 GB/s NIC: 4 x 1 GB.
  Network net = Network::build(make_cluster(2, 2, 100e9, 1, 10e9)).value();
  const auto m = std::vector<std::vector<double>>(2, std::vector<double>(2, 1e9));
  EXPECT_NEAR(time_alone(net, [&](FlowSim* s) { return add_m2n(net, s, {0, 1}, {2, 3}, m); }), 0.4, 1e-12);
  EXPECT_NEAR(time_alone(net, [&](FlowSim* s) { return add_p2p(net, s, 0, 3, 1e9); }), 0.1, 1e-12);
  // Chained: a p2p released after another finishes.
  FlowSim sim(net.link_bandwidths());
  CollectiveFlows first = add_p2p(net, &sim, 0, 1, 1e9).value();
  CollectiveFlows second = add_p2p(net, &sim, 1, 2, 1e9, {0, first.flows}).value();
  EXPECT_NEAR(finish_time_s(sim.run(), second), 0.01 + 0.1, 1e-12);
}

TEST(CollectivesTest, BadGroupsAreErrors) {
  Network net = Network::build(make_cluster(1, 4, 100e9, 0, 0)).value();
  FlowSim sim(net.link_bandwidths());
  EXPECT_NE(add_ring_all_reduce(net, &sim, {0, 1, 1}, 1e6).status().message().find("appears twice"), std::string::npos);
  EXPECT_EQ(add_ring_all_reduce(net, &sim, {0, 9}, 1e6).status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(add_ring_all_reduce(net, &sim, {}, 1e6).ok());
  EXPECT_FALSE(add_p2p(net, &sim, 0, 1, -1).ok());
  EXPECT_FALSE(add_all_to_all_flat(net, &sim, {0, 1}, {{0, 1}}).ok());
  EXPECT_FALSE(add_m2n(net, &sim, {0}, {1, 2}, {{1, 2, 3}}).ok());
}

}  // namespace
}  // namespace piper::sim
