// HALO all-to-all-v and MoE dispatch must equal the flat all-to-all byte for byte, for every node layout and
// lane count that divides the group: uneven, zero-size and random splits, a rank receiving nothing, dropped
// slots, every token to one expert, ranks with no tokens.
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "piper/comm/algorithms/halo_all_to_all.h"
#include "piper/comm/algorithms/moe_dispatch.h"
#include "piper/comm/algorithms/pairwise_all_to_all.h"

namespace piper::comm::testing {
namespace {

struct Layout {
  int ranks_per_node;
  int lanes;
};

std::vector<Layout> layouts(int p) {
  std::vector<Layout> out;
  for (int g = 1; g <= p; ++g) {
    if (p % g != 0) continue;
    for (int l = 1; l <= g; ++l) {
      if (g % l == 0) out.push_back({g, l});
    }
  }
  return out;
}

size_t uneven(int src, int dst, int, uint64_t) { return ((src + 1) * (dst + 2) % 7) * 13; }
size_t zero_and_silent(int src, int dst, int n, uint64_t) {
  if (dst == n - 1 || src == 0) return 0;
  return 100 * (src + dst) + 1;
}
size_t random_sizes(int src, int dst, int, uint64_t seed) {
  uint64_t x = mix(seed, src, dst);
  return (x % 4 == 0) ? 0 : static_cast<size_t>((x >> 8) % 5000);
}

TEST(HaloAllToAll, EqualsFlatForEveryLayout) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  for (Layout layout : layouts(w->size())) {
    auto topo = NodeTopology::create(w->size(), layout.ranks_per_node, layout.lanes);
    ASSERT_TRUE(topo.ok());
    auto ctx = HaloContext::create(*w, *topo);
    ASSERT_TRUE(ctx.ok()) << ctx.status().to_string();
    std::vector<std::pair<SizeFn, uint64_t>> cases = {{uneven, 0}, {zero_and_silent, 0}};
    for (uint64_t seed = 1; seed <= 3; ++seed) cases.push_back({random_sizes, seed});
    // Remote blocks of at least `direct` bytes bypass the proxies: none (0), the default (every block here is
    // smaller), a mix (blocks of 500..4999 bytes go directly, smaller ones are batched), all (1).
    for (size_t direct : {size_t{0}, kDefaultHaloDirectPairBytes, size_t{500}, size_t{1}})
      for (auto [fn, seed] : cases) {
        (*ctx)->set_direct_pair_bytes(direct);
        auto c = make_all_to_all_case(w->rank(), w->size(), fn, seed);
        std::vector<uint8_t> halo(c.expected.size(), 0xEE), flat(c.expected.size(), 0xDD);
        Status s = halo_all_to_all_v(**ctx, c.send.data(), c.send_bytes, halo.data(), c.recv_bytes, kTestTimeoutS);
        ASSERT_TRUE(s.ok()) << s.to_string();
        EXPECT_EQ(halo, c.expected) << "G=" << layout.ranks_per_node << " lanes=" << layout.lanes << " seed=" << seed
                                    << " direct=" << direct;
        s = pairwise_all_to_all_v(*w, c.send.data(), c.send_bytes, flat.data(), c.recv_bytes, kTestTimeoutS);
        ASSERT_TRUE(s.ok()) << s.to_string();
        EXPECT_EQ(flat, c.expected);
      }
  }
}

// Token t of rank s: byte i = (s, t, i) pattern; 16 experts, expert e on rank e / (16 / P).
constexpr size_t kTokenBytes = 12;
constexpr int kExperts = 16;

std::vector<uint8_t> make_tokens(int src, int64_t num_tokens) {
  std::vector<uint8_t> tokens(num_tokens * kTokenBytes);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (size_t i = 0; i < kTokenBytes; ++i) tokens[t * kTokenBytes + i] = pattern_byte(src, static_cast<int>(t), i);
  }
  return tokens;
}

enum class RoutingCase { kRandomTop4, kAllToExpertZero, kLastRankGetsNothing, kDroppedSlotsAndEmptyRanks };

MoeRouting make_routing(RoutingCase rc, int src, int p, uint64_t seed) {
  MoeRouting r;
  r.top_k = 4;
  r.num_tokens = 20 + (mix(seed, src, 99) % 40);
  if (rc == RoutingCase::kDroppedSlotsAndEmptyRanks && src % 2 == 1) r.num_tokens = 0;
  const int experts_per_rank = kExperts / p;
  for (int64_t t = 0; t < r.num_tokens; ++t) {
    // top-4 distinct experts from a per-token permutation.
    std::vector<int> experts;
    for (int j = 0; static_cast<int>(experts.size()) < r.top_k; ++j) {
      int e = static_cast<int>(mix(seed, src * 1000 + t, j) % kExperts);
      if (rc == RoutingCase::kLastRankGetsNothing) e = e % (kExperts - experts_per_rank);
      bool dup = false;
      for (int x : experts) dup = dup || x == e;
      if (!dup) experts.push_back(e);
    }
    for (int j = 0; j < r.top_k; ++j) {
      int dest = experts[j] / experts_per_rank;
      if (rc == RoutingCase::kAllToExpertZero) dest = 0;
      if (rc == RoutingCase::kDroppedSlotsAndEmptyRanks && (t + j) % 3 == 0) dest = -1;
      r.dest_ranks.push_back(dest);
    }
  }
  return r;
}

// The rows rank `me` must receive, computed from every rank's routing (ordered by source, token, slot).
std::vector<uint8_t> expected_rows(RoutingCase rc, int me, int p, uint64_t seed) {
  std::vector<uint8_t> rows;
  for (int s = 0; s < p; ++s) {
    MoeRouting r = make_routing(rc, s, p, seed);
    auto tokens = make_tokens(s, r.num_tokens);
    for (int64_t t = 0; t < r.num_tokens; ++t) {
      for (int j = 0; j < r.top_k; ++j) {
        if (r.dest_ranks[t * r.top_k + j] == me) {
          rows.insert(rows.end(), tokens.begin() + t * kTokenBytes, tokens.begin() + (t + 1) * kTokenBytes);
        }
      }
    }
  }
  return rows;
}

TEST(HaloDispatch, EqualsFlatDispatchByteForByte) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int p = w->size(), me = w->rank();
  for (RoutingCase rc : {RoutingCase::kRandomTop4, RoutingCase::kAllToExpertZero, RoutingCase::kLastRankGetsNothing,
                         RoutingCase::kDroppedSlotsAndEmptyRanks}) {
    const uint64_t seed = 7 + static_cast<int>(rc);
    MoeRouting routing = make_routing(rc, me, p, seed);
    auto tokens = make_tokens(me, routing.num_tokens);
    auto expected = expected_rows(rc, me, p, seed);
    auto flat = flat_dispatch(*w, tokens.data(), kTokenBytes, routing, FlatDispatchKind::kMpiAllToAllV, kTestTimeoutS);
    ASSERT_TRUE(flat.ok()) << flat.status().to_string();
    EXPECT_EQ(flat->rows, expected) << "case " << static_cast<int>(rc);
    auto pairwise = flat_dispatch(*w, tokens.data(), kTokenBytes, routing, FlatDispatchKind::kPairwise, kTestTimeoutS);
    ASSERT_TRUE(pairwise.ok());
    EXPECT_EQ(pairwise->rows, expected);
    if (rc == RoutingCase::kLastRankGetsNothing && me == p - 1) {
      EXPECT_TRUE(flat->rows.empty());
    }
    for (Layout layout : layouts(p)) {
      auto topo = NodeTopology::create(p, layout.ranks_per_node, layout.lanes);
      ASSERT_TRUE(topo.ok());
      auto ctx = HaloContext::create(*w, *topo);
      ASSERT_TRUE(ctx.ok());
      auto halo = halo_dispatch(**ctx, tokens.data(), kTokenBytes, routing, kTestTimeoutS);
      ASSERT_TRUE(halo.ok()) << halo.status().to_string();
      EXPECT_EQ(halo->rows, expected) << "case " << static_cast<int>(rc) << " G=" << layout.ranks_per_node
                                      << " lanes=" << layout.lanes;
      EXPECT_EQ(halo->rows_from, flat->rows_from);
      DispatchTraffic traffic = dispatch_traffic(*topo, me, kTokenBytes, routing);
      EXPECT_LE(traffic.halo_internode_bytes, traffic.flat_internode_bytes / static_cast<int64_t>(kTokenBytes) *
                                                  (kTokenBytes + layout.ranks_per_node));
    }
  }
}

TEST(HaloDispatch, BadInputNamesTheProblem) {
  EXPECT_FALSE(NodeTopology::create(8, 3, 1).ok());
  EXPECT_FALSE(NodeTopology::create(8, 4, 3).ok());
  MoeRouting r;
  r.num_tokens = 1;
  r.top_k = 2;
  r.dest_ranks = {0, 99};
  Status s = r.validate(4);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 99"), std::string::npos) << s.message();
  r.dest_ranks = {0};
  EXPECT_FALSE(r.validate(4).ok());
}

}  // namespace
}  // namespace piper::comm::testing
