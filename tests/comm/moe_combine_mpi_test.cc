// MoE combine (flat and HALO) against a reference every source rank computes alone: y[t] = sum over the
// token's non-dropped slots j, in slot order, of w[t, j] * expert_output(dest_j, x[t]). The expert outputs
// are produced on the expert ranks from the rows the dispatch delivered, so dispatch and combine compose.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "comm_test_util.h"
#include "piper/comm/algorithms/moe_combine.h"

namespace piper::comm::testing {
namespace {

constexpr int64_t kHidden = 5;

enum class Case { kExactRandom, kFloatRandom, kSameNodeSlots, kEmptyRankAndExpert, kDroppedAndNoTokens };

int64_t num_tokens(Case c, int rank) {
  if (c == Case::kDroppedAndNoTokens && rank == 0) return 0;  // a source with no tokens at all
  return 3 + (rank * 5) % 7;                                   // uneven splits
}

// Experts: 2 per rank, expert e on rank e / 2. Slot weights are dyadic in the exact cases.
MoeRouting make_routing(Case c, int me, int p, std::vector<float>* weights) {
  MoeRouting r;
  r.num_tokens = num_tokens(c, me);
  r.top_k = std::min(3, 2 * p);
  const int experts = 2 * p;
  for (int64_t t = 0; t < r.num_tokens; ++t) {
    std::vector<int> chosen;
    for (uint64_t probe = 0; static_cast<int>(chosen.size()) < r.top_k; ++probe) {
      int e = static_cast<int>(mix(static_cast<uint64_t>(c) * 7 + 1, me * 1000 + t, probe) % experts);
      if (c == Case::kEmptyRankAndExpert) {
        e = e % (experts - 3);  // rank p-1 (experts 2p-2, 2p-1) and expert 2p-3 get nothing
      }
      if (c == Case::kSameNodeSlots) e = (2 * (p - 1 - me % p) + static_cast<int>(chosen.size())) % experts;
      bool dup = false;
      for (int x : chosen) dup = dup || x == e;
      // Distinct experts in the random cases; repeated ones (two slots of a token on one expert) elsewhere.
      if (!dup || (c != Case::kExactRandom && c != Case::kFloatRandom)) chosen.push_back(e);
    }
    for (int j = 0; j < r.top_k; ++j) {
      int dest = chosen[j] / 2;
      if (c == Case::kDroppedAndNoTokens && (t + j + me) % 3 == 0) dest = -1;
      r.dest_ranks.push_back(dest);
      uint64_t bits = mix(99, me * 1000 + t, j);
      weights->push_back(c == Case::kFloatRandom ? static_cast<float>(bits % 100000) / 100000.0f + 0.01f
                                                 : 0.125f * static_cast<float>(1 + bits % 8));
    }
  }
  return r;
}

float input(Case c, int src, int64_t t, int64_t i) {
  if (c == Case::kFloatRandom) return std::sin(0.37f * static_cast<float>(src * 131 + t * 17 + i) + 0.1f);
  return static_cast<float>((src * 3 + t * 7 + i) % 17) - 8.0f;  // small integers: every sum is exact
}

float expert_output(int rank, float x) { return x * static_cast<float>(rank + 1) + static_cast<float>(rank); }

struct Layout {
  int ranks_per_node, lanes;
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

TEST(MoeCombine, FlatAndHaloEqualTheLocalWeightedSum) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int p = w->size(), me = w->rank();
  for (Case c : {Case::kExactRandom, Case::kFloatRandom, Case::kSameNodeSlots, Case::kEmptyRankAndExpert,
                 Case::kDroppedAndNoTokens}) {
    std::vector<float> weights;
    MoeRouting routing = make_routing(c, me, p, &weights);
    std::vector<float> x(routing.num_tokens * kHidden);
    for (int64_t t = 0; t < routing.num_tokens; ++t) {
      for (int64_t i = 0; i < kHidden; ++i) x[t * kHidden + i] = input(c, me, t, i);
    }
    auto rows = flat_dispatch(*w, x.data(), kHidden * sizeof(float), routing, FlatDispatchKind::kMpiAllToAllV,
                              kTestTimeoutS);
    ASSERT_TRUE(rows.ok()) << rows.status().to_string();
    std::vector<float> out(rows->rows.size() / sizeof(float));
    if (!out.empty()) std::memcpy(out.data(), rows->rows.data(), rows->rows.size());  // no null to memcpy (UBSan)
    for (float& v : out) v = expert_output(me, v);
    if (c == Case::kEmptyRankAndExpert && me == p - 1) {
      EXPECT_TRUE(out.empty());
    }

    std::vector<float> expected(x.size(), 0.0f);
    for (int64_t t = 0; t < routing.num_tokens; ++t) {
      for (int j = 0; j < routing.top_k; ++j) {
        int d = routing.dest_ranks[t * routing.top_k + j];
        if (d < 0) continue;
        float wt = weights[t * routing.top_k + j];
        for (int64_t i = 0; i < kHidden; ++i) expected[t * kHidden + i] += wt * expert_output(d, x[t * kHidden + i]);
      }
    }
    for (FlatDispatchKind kind : {FlatDispatchKind::kMpiAllToAllV, FlatDispatchKind::kPairwise}) {
      auto flat = flat_combine(*w, out, kHidden, routing, weights, kind, kTestTimeoutS);
      ASSERT_TRUE(flat.ok()) << flat.status().to_string();
      EXPECT_EQ(*flat, expected) << "case " << static_cast<int>(c);  // same additions in the same order
      // With the dispatch's counts (no count exchange): the same sums, and a re-dispatch of the same routing
      // (as a backward pass makes) the same rows.
      auto known = flat_combine(*w, out, kHidden, routing, weights, kind, kTestTimeoutS, rows->rows_from);
      ASSERT_TRUE(known.ok()) << known.status().to_string();
      EXPECT_EQ(*known, expected) << "case " << static_cast<int>(c);
      auto again = flat_dispatch(*w, x.data(), kHidden * sizeof(float), routing, kind, kTestTimeoutS, rows->rows_from);
      ASSERT_TRUE(again.ok()) << again.status().to_string();
      EXPECT_EQ(again->rows, rows->rows) << "case " << static_cast<int>(c);
      EXPECT_EQ(again->rows_from, rows->rows_from);
    }
    for (Layout layout : layouts(p)) {
      auto topo = NodeTopology::create(p, layout.ranks_per_node, layout.lanes);
      ASSERT_TRUE(topo.ok());
      auto ctx = HaloContext::create(*w, *topo);
      ASSERT_TRUE(ctx.ok());
      auto halo = halo_combine(**ctx, out, kHidden, routing, weights, kTestTimeoutS);
      ASSERT_TRUE(halo.ok()) << halo.status().to_string();
      ASSERT_EQ(halo->size(), expected.size());
      for (int64_t t = 0; t < routing.num_tokens; ++t) {
        // Bitwise when sums are exact or no remote node holds two of the token's slots; else to rounding.
        std::vector<int> per_node(topo->num_nodes(), 0);
        bool regrouped = false;
        for (int j = 0; j < routing.top_k; ++j) {
          int d = routing.dest_ranks[t * routing.top_k + j];
          if (d < 0 || topo->node_of(d) == topo->node_of(me)) continue;
          regrouped = regrouped || ++per_node[topo->node_of(d)] > 1;
        }
        for (int64_t i = 0; i < kHidden; ++i) {
          float got = (*halo)[t * kHidden + i], want = expected[t * kHidden + i];
          if (c != Case::kFloatRandom || !regrouped) {
            EXPECT_EQ(got, want) << "case " << static_cast<int>(c) << " G=" << layout.ranks_per_node
                                 << " lanes=" << layout.lanes << " token " << t;
          } else {
            EXPECT_NEAR(got, want, 1e-5f * (1.0f + std::fabs(want)) * p) << "token " << t;
          }
        }
      }
      CombineTraffic traffic = combine_traffic(*topo, me, kHidden, routing);
      EXPECT_LE(traffic.halo_internode_bytes - traffic.flat_internode_bytes,
                traffic.flat_internode_bytes / (kHidden * 4) * routing.top_k * 8);
      if (c == Case::kSameNodeSlots && topo->num_nodes() > 1 && routing.num_tokens > 0 && routing.top_k > 1 &&
          layout.ranks_per_node >= 2) {
        EXPECT_GT(traffic.flat_internode_bytes, 0);
      }
    }
  }
}

TEST(MoeCombine, BadInputNamesTheProblem) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int p = w->size();
  std::vector<float> weights;
  MoeRouting routing = make_routing(Case::kExactRandom, w->rank(), p, &weights);
  std::vector<float> short_weights(weights.begin(), weights.end() - 1);
  std::vector<float> none;
  auto bad = flat_combine(*w, none, kHidden, routing, short_weights, FlatDispatchKind::kMpiAllToAllV, kTestTimeoutS);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("routing weights"), std::string::npos) << bad.status().to_string();
  // Known counts of the wrong length, or negative: refused on every rank before any exchange.
  std::vector<int64_t> one_short(static_cast<size_t>(p - 1), 0), negative(static_cast<size_t>(p), -1);
  std::vector<uint8_t> tokens(routing.num_tokens * kHidden * sizeof(float), 0);
  std::vector<int64_t> not_mine(static_cast<size_t>(p), 0);
  not_mine[static_cast<size_t>(w->rank())] =
      std::count(routing.dest_ranks.begin(), routing.dest_ranks.end(), w->rank()) + 1;
  for (const auto* known : {&one_short, &negative, &not_mine}) {
    auto refused = flat_dispatch(*w, tokens.data(), kHidden * sizeof(float), routing, FlatDispatchKind::kPairwise,
                                 kTestTimeoutS, *known);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("known row count"), std::string::npos) << refused.status().to_string();
    if (known == &not_mine) {
      EXPECT_NE(refused.status().message().find("not this routing's"), std::string::npos)
          << refused.status().to_string();
    }
  }
  // Every rank passes one float too many: the size check fails on all ranks after the count exchange.
  auto topo = NodeTopology::create(p, p % 2 == 0 ? p / 2 : 1, 1);
  ASSERT_TRUE(topo.ok());
  auto ctx = HaloContext::create(*w, *topo);
  ASSERT_TRUE(ctx.ok());
  std::vector<uint8_t> x(routing.num_tokens * kHidden * sizeof(float), 0);
  auto rows = flat_dispatch(*w, x.data(), kHidden * sizeof(float), routing, FlatDispatchKind::kMpiAllToAllV,
                            kTestTimeoutS);
  ASSERT_TRUE(rows.ok());
  std::vector<float> extra(rows->rows.size() / sizeof(float) + 1, 0.0f);
  auto halo = halo_combine(**ctx, extra, kHidden, routing, weights, kTestTimeoutS);
  ASSERT_FALSE(halo.ok());
  EXPECT_NE(halo.status().message().find("dispatch order"), std::string::npos) << halo.status().to_string();
  auto flat = flat_combine(*w, extra, kHidden, routing, weights, FlatDispatchKind::kMpiAllToAllV, kTestTimeoutS);
  ASSERT_FALSE(flat.ok());
  EXPECT_NE(flat.status().message().find("expert_rows has"), std::string::npos);
}

}  // namespace
}  // namespace piper::comm::testing
