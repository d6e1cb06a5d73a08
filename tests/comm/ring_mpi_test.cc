// The ring all-gather and reduce-scatter of the MPI backend (comm/mpi/mpi_ring.h), forced on one node with
// RingCollectives::kAlways: the same bytes and sums as Open MPI's own collectives, rings in flight together kept
// apart, a late rank named by a timed-out wait, and PIPER_MPI_RING checked.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm_test_util.h"

namespace piper::comm::testing {
namespace {

std::unique_ptr<Communicator> ring_world() { return world(MpiOptions{.ring = RingCollectives::kAlways}); }

std::vector<uint8_t> gathered(Communicator& w, size_t bytes) {
  auto in = pattern_block(w.rank(), 1, bytes);
  std::vector<uint8_t> out(bytes * w.size(), 0xEE);
  auto h = w.all_gather(in.data(), out.data(), bytes);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  if (h.ok()) {
    EXPECT_TRUE(w.wait(*h, kTestTimeoutS).ok());
  }
  return out;
}

TEST(MpiRing, AllGatherGivesOpenMpisBytes) {
  auto ring = ring_world();
  auto own = world(MpiOptions{.ring = RingCollectives::kNever});
  ASSERT_NE(ring, nullptr);
  ASSERT_NE(own, nullptr);
  for (size_t bytes : {size_t{1}, size_t{333}, size_t{1} << 20}) {
    const auto out = gathered(*ring, bytes);
    EXPECT_EQ(out, gathered(*own, bytes)) << bytes << " bytes per rank";
    for (int r = 0; r < ring->size(); ++r) {
      ASSERT_EQ(std::vector<uint8_t>(out.begin() + r * bytes, out.begin() + (r + 1) * bytes),
                pattern_block(r, 1, bytes))
          << "rank " << r << "'s block, " << bytes << " bytes per rank";
    }
  }
}

TEST(MpiRing, ReduceScatterSumsEveryRanksPart) {
  auto w = ring_world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), me = w->rank();
  for (size_t per_rank : {size_t{1}, size_t{37}, size_t{100000}}) {
    std::vector<float> in(per_rank * n), out(per_rank, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(me + 10 * (i % 1000));
    auto h = w->reduce_scatter_sum(in.data(), out.data(), per_rank);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());
    for (size_t i = 0; i < per_rank; ++i) {
      const size_t global = me * per_rank + i;
      ASSERT_EQ(out[i], static_cast<float>(n * (n - 1) / 2 + n * 10 * (global % 1000))) << "element " << i;
    }
  }
}

// Output inside the input (this rank's own part), as a ZeRO shard may be.
TEST(MpiRing, ReduceScatterIntoItsOwnPartOfTheInput) {
  auto w = ring_world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), me = w->rank();
  const size_t per_rank = 513;
  std::vector<float> buf(per_rank * n);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(me + 1) * static_cast<float>(i % 7);
  float* mine = buf.data() + me * per_rank;
  auto h = w->reduce_scatter_sum(buf.data(), mine, per_rank);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());
  for (size_t i = 0; i < per_rank; ++i) {
    ASSERT_EQ(mine[i], static_cast<float>(n * (n + 1) / 2) * static_cast<float>((me * per_rank + i) % 7)) << i;
  }
}

// Rings posted together and waited in reverse order: each one's messages carry its own tags.
TEST(MpiRing, RingsInFlightTogetherKeepTheirMessagesApart) {
  auto w = ring_world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), me = w->rank();
  constexpr int kRings = 6;
  const size_t bytes = 4096;
  std::vector<std::vector<uint8_t>> in(kRings), out(kRings);
  std::vector<std::vector<float>> sums_in(kRings), sums_out(kRings);
  std::vector<Handle> hs;
  for (int k = 0; k < kRings; ++k) {
    in[k] = pattern_block(me, k, bytes);
    out[k].assign(bytes * n, 0);
    auto g = w->all_gather(in[k].data(), out[k].data(), bytes);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    hs.push_back(std::move(*g));
    sums_in[k].assign(64 * n, static_cast<float>(k + me));
    sums_out[k].assign(64, -1);
    auto s = w->reduce_scatter_sum(sums_in[k].data(), sums_out[k].data(), 64);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    hs.push_back(std::move(*s));
  }
  for (auto it = hs.rbegin(); it != hs.rend(); ++it) ASSERT_TRUE(w->wait(*it, kTestTimeoutS).ok());
  for (int k = 0; k < kRings; ++k) {
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(std::vector<uint8_t>(out[k].begin() + r * bytes, out[k].begin() + (r + 1) * bytes),
                pattern_block(r, k, bytes))
          << "ring " << k << ", rank " << r;
    }
    EXPECT_EQ(sums_out[k], std::vector<float>(64, static_cast<float>(n * k + n * (n - 1) / 2))) << "ring " << k;
  }
}

TEST(MpiRing, ATimedOutRingNamesTheRankThatDidNotCome) {
  auto w = ring_world();
  auto side = world();
  ASSERT_NE(w, nullptr);
  ASSERT_NE(side, nullptr);
  const int n = w->size(), late = n - 1;
  std::vector<uint8_t> in(64, static_cast<uint8_t>(w->rank())), out(64 * n);
  auto barrier = [&] {
    auto b = side->barrier();
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE(side->wait(*b, kTestTimeoutS).ok());
  };
  Result<Handle> h = Handle();
  if (w->rank() != late) {
    h = w->all_gather(in.data(), out.data(), 64);
    ASSERT_TRUE(h.ok());
    const Status st = w->wait(*h, 0.3);
    EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
    EXPECT_NE(st.to_string().find("rank " + std::to_string(late)), std::string::npos) << st.to_string();
    barrier();
  } else {
    barrier();
    h = w->all_gather(in.data(), out.data(), 64);
    ASSERT_TRUE(h.ok());
  }
  ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r * 64], r);
}

// Ranks deciding differently would post a ring against Open MPI's collective and never match: refused on every rank.
TEST(MpiRing, RanksThatDisagreeAboutRingsAreRefused) {
  auto probe = world();
  ASSERT_NE(probe, nullptr);
  const bool rings = probe->rank() % 2 == 1;
  auto w = mpi_world(MpiOptions{.ring = rings ? RingCollectives::kAlways : RingCollectives::kNever});
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("give every rank the same PIPER_MPI_RING"), std::string::npos)
      << w.status().to_string();
  // The world is still usable afterwards.
  auto again = ring_world();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(gathered(*again, 8).size(), 8u * again->size());
}

// Two rings waited in opposite orders on alternate ranks: each test advances both, so neither waits for the other.
TEST(MpiRing, RingsWaitedInOppositeOrdersBothComplete) {
  auto w = ring_world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), me = w->rank();
  const size_t bytes = 1 << 16;
  std::vector<uint8_t> in_a = pattern_block(me, 2, bytes), in_b = pattern_block(me, 3, bytes);
  std::vector<uint8_t> out_a(bytes * n), out_b(bytes * n);
  auto a = w->all_gather(in_a.data(), out_a.data(), bytes);
  auto b = w->all_gather(in_b.data(), out_b.data(), bytes);
  ASSERT_TRUE(a.ok() && b.ok());
  if (me % 2 == 0) {
    ASSERT_TRUE(w->wait(*a, kTestTimeoutS).ok());
    ASSERT_TRUE(w->wait(*b, kTestTimeoutS).ok());
  } else {
    ASSERT_TRUE(w->wait(*b, kTestTimeoutS).ok());
    ASSERT_TRUE(w->wait(*a, kTestTimeoutS).ok());
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(std::vector<uint8_t>(out_b.begin() + r * bytes, out_b.begin() + (r + 1) * bytes),
              pattern_block(r, 3, bytes));
  }
}

TEST(MpiRing, AnUnknownPiperMpiRingIsRefusedNamingTheChoices) {
  ASSERT_EQ(setenv("PIPER_MPI_RING", "sometimes", 1), 0);
  auto w = mpi_world();
  unsetenv("PIPER_MPI_RING");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("PIPER_MPI_RING='sometimes'"), std::string::npos) << w.status().to_string();
  EXPECT_NE(w.status().message().find("across-nodes"), std::string::npos);
}

}  // namespace
}  // namespace piper::comm::testing
