// The MPI backend against hand-computable data: P2P, all-reduce, reduce-scatter, all-gather, all-to-all-v with
// uneven, zero-size and random splits (one rank receiving nothing), sub-communicators, bad input.
#include <gtest/gtest.h>

#include <numeric>

#include "comm_test_util.h"
#include "piper/comm/channels.h"
#include "piper/comm/mesh.h"

namespace piper::comm::testing {
namespace {

TEST(MpiCommunicator, RingSendRecvOnSeparateChannels) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  auto channels = P2pChannels::create(*w);
  ASSERT_TRUE(channels.ok()) << channels.status().to_string();
  int me = w->rank(), n = w->size();
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  // Forward to next, backward to prev at the same time (the pipeline pattern): 1000 + 10 * src bytes.
  auto fwd = pattern_block(me, next, 1000 + 10 * me);
  auto bwd = pattern_block(me, prev, 1000 + 10 * me);
  std::vector<uint8_t> from_prev(1000 + 10 * prev), from_next(1000 + 10 * next);
  std::vector<Handle> hs;
  auto keep = [&](Result<Handle> r) {
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    hs.push_back(std::move(r).value());
  };
  keep(channels->irecv(from_prev.data(), from_prev.size(), prev, 1));
  keep(channels->irecv(from_next.data(), from_next.size(), next, 1));
  keep(channels->isend(fwd.data(), fwd.size(), next, 1));
  keep(channels->isend(bwd.data(), bwd.size(), prev, 1));
  ASSERT_EQ(hs.size(), 4u);
  ASSERT_TRUE(w->wait_all(hs, kTestTimeoutS).ok());
  if (n == 2) {
    // With two ranks prev == next: the two messages differ only by channel and must not be swapped.
    EXPECT_EQ(from_prev, pattern_block(prev, me, from_prev.size()));
  } else {
    EXPECT_EQ(from_prev, pattern_block(prev, me, from_prev.size()));
    EXPECT_EQ(from_next, pattern_block(next, me, from_next.size()));
  }
}

TEST(MpiCommunicator, ZeroByteMessagesPostNothing) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  auto h = w->isend(nullptr, 0, (w->rank() + 1) % w->size(), 3);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->done());
  auto r = w->irecv(nullptr, 0, (w->rank() + 1) % w->size(), 3);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(w->wait(*r, 0.0).ok());
}

TEST(MpiCommunicator, AllReduceSumOutOfPlaceAndInPlace) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), me = w->rank();
  const size_t count = 1001;
  std::vector<float> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(me * 1000 + i);
  auto h = w->all_reduce_sum(in.data(), out.data(), count);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(out[i], static_cast<float>(1000 * n * (n - 1) / 2 + n * i)) << "element " << i;
  }
  auto h2 = w->all_reduce_sum(in.data(), in.data(), count);
  ASSERT_TRUE(h2.ok());
  ASSERT_TRUE(w->wait(*h2, kTestTimeoutS).ok());
  EXPECT_EQ(in, out);
}

// In place below and above 64 KiB (from there, with 4 ranks or more, the backend reduces a copy of its input:
// mpi_communicator.cc): every rank's sums either way.
TEST(MpiCommunicator, AnInPlaceAllReduceOfALargeBufferSumsEveryRank) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), me = w->rank();
  for (size_t count : {size_t{16383}, size_t{16384}, size_t{300001}}) {
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(me + (i % 1000));
    auto h = w->all_reduce_sum(buf.data(), buf.data(), count);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(buf[i], static_cast<float>(n * (n - 1) / 2 + n * (i % 1000))) << count << " floats, element " << i;
    }
  }
}

TEST(MpiCommunicator, ReduceScatterSum) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), me = w->rank();
  const size_t per_rank = 37;
  std::vector<float> in(per_rank * n), out(per_rank, -1);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(me + 10 * i);
  auto h = w->reduce_scatter_sum(in.data(), out.data(), per_rank);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());
  for (size_t i = 0; i < per_rank; ++i) {
    size_t global = me * per_rank + i;
    EXPECT_EQ(out[i], static_cast<float>(n * (n - 1) / 2 + n * 10 * global));
  }
}

TEST(MpiCommunicator, AllGather) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), me = w->rank();
  const size_t bytes = 333;
  auto in = pattern_block(me, 0, bytes);
  std::vector<uint8_t> out(bytes * n);
  auto h = w->all_gather(in.data(), out.data(), bytes);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + r * bytes, out.begin() + (r + 1) * bytes), pattern_block(r, 0, bytes));
  }
}

size_t uneven_sizes(int src, int dst, int n, uint64_t) { return ((src + 1) * (dst + 2) % 7) * 13; }
// The last rank receives nothing at all; rank 0 sends nothing to anyone.
size_t zero_sizes(int src, int dst, int n, uint64_t) {
  if (dst == n - 1 || src == 0) return 0;
  return 100 * (src + dst) + 1;
}
size_t random_sizes(int src, int dst, int n, uint64_t seed) {
  uint64_t x = mix(seed, src, dst);
  return (x % 4 == 0) ? 0 : static_cast<size_t>((x >> 8) % 20000);
}

void check_all_to_all_v(Communicator& w, SizeFn fn, uint64_t seed) {
  auto c = make_all_to_all_case(w.rank(), w.size(), fn, seed);
  std::vector<uint8_t> recv(c.expected.size(), 0xEE);
  auto h = w.all_to_all_v(c.send.data(), c.send_bytes, recv.data(), c.recv_bytes);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_TRUE(w.wait(*h, kTestTimeoutS).ok());
  EXPECT_EQ(recv, c.expected);
}

TEST(MpiCommunicator, AllToAllVUneven) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  check_all_to_all_v(*w, uneven_sizes, 0);
}

TEST(MpiCommunicator, AllToAllVZeroSizeAndRankReceivingNothing) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  check_all_to_all_v(*w, zero_sizes, 0);
}

TEST(MpiCommunicator, AllToAllVRandomSizes) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  for (uint64_t seed = 1; seed <= 5; ++seed) check_all_to_all_v(*w, random_sizes, seed);
}

TEST(MpiCommunicator, MeshAxisCommunicatorsReduceOverTheRightRanks) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int n = w->size();
  auto mesh = Mesh::create({"tp", "dp"}, {2, n / 2});
  ASSERT_TRUE(mesh.ok());
  for (const char* axis : {"tp", "dp"}) {
    auto sub = mesh_communicator(*w, *mesh, {axis});
    ASSERT_TRUE(sub.ok()) << sub.status().to_string();
    auto members = mesh->group(w->rank(), {axis});
    ASSERT_TRUE(members.ok());
    EXPECT_EQ((*sub)->size(), static_cast<int>(members->size()));
    EXPECT_EQ((*sub)->world_ranks(), *members);
    float value = static_cast<float>(1 << w->rank()), sum = 0;
    auto h = (*sub)->all_reduce_sum(&value, &sum, 1);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE((*sub)->wait(*h, kTestTimeoutS).ok());
    float expect = 0;
    for (int r : *members) expect += static_cast<float>(1 << r);
    EXPECT_EQ(sum, expect) << "axis " << axis << " group " << (*sub)->name();
  }
}

TEST(MpiCommunicator, BadInputIsAnErrorNotACrash) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  char byte = 0;
  auto bad_peer = w->isend(&byte, 1, w->size(), 0);
  ASSERT_FALSE(bad_peer.ok());
  EXPECT_NE(bad_peer.status().message().find("peer"), std::string::npos);
  auto bad_tag = w->irecv(&byte, 1, 0, 40000);
  EXPECT_FALSE(bad_tag.ok());
  std::vector<size_t> short_counts(1, 0);
  auto bad_counts = w->all_to_all_v(&byte, short_counts, &byte, short_counts);
  EXPECT_EQ(bad_counts.ok(), w->size() == 1);
  auto bad_split = w->split({(w->rank() + 1) % w->size()}, "not-me");
  ASSERT_FALSE(bad_split.ok());
  EXPECT_NE(bad_split.status().message().find("does not contain itself"), std::string::npos);
}

// A message shorter than its receive completes in MPI without a word (a longer one is MPI's truncation error):
// the receive names both sizes instead, so that ranks disagreeing on a routing's counts never go on with a
// buffer half of stale bytes.
TEST(MpiCommunicator, AMessageShorterThanItsReceiveIsAnError) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  std::vector<uint8_t> sent(8, 7), got(16, 0);
  if (w->rank() == 0) {
    auto s = w->isend(sent.data(), sent.size(), 1, 5);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    ASSERT_TRUE(w->wait(*s, kTestTimeoutS).ok());
  } else if (w->rank() == 1) {
    auto r = w->irecv(got.data(), got.size(), 0, 5);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const Status st = w->wait(*r, kTestTimeoutS);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.to_string();
    EXPECT_NE(st.message().find("8 bytes arrived from rank 0 of group"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("16 bytes were expected"), std::string::npos) << st.to_string();
    EXPECT_FALSE(w->wait(*r, kTestTimeoutS).ok()) << "a second wait must not find the receive complete";
  }
  // The exact size still passes.
  if (w->rank() == 0) {
    auto s = w->isend(sent.data(), sent.size(), 1, 6);
    ASSERT_TRUE(s.ok() && w->wait(*s, kTestTimeoutS).ok());
  } else if (w->rank() == 1) {
    auto r = w->irecv(got.data(), sent.size(), 0, 6);
    ASSERT_TRUE(r.ok() && w->wait(*r, kTestTimeoutS).ok());
    EXPECT_EQ(got[0], 7);
  }
}

}  // namespace
}  // namespace piper::comm::testing
