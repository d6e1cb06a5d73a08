// M2N between the first half (attention) and the second half (experts) of the world: two fused steps, with
// uneven and zero-size blocks; what every rank receives equals a flat all-to-all-v in which only the other
// group sends to it.
#include <gtest/gtest.h>

#include "comm_test_util.h"
#include "piper/comm/algorithms/m2n.h"

namespace piper::comm::testing {
namespace {

// Bytes that src sends to dst in step `step` (0 for pairs inside one group).
size_t block_bytes(int src, int dst, int step, int half) {
  if ((src < half) == (dst < half)) return 0;
  return ((src * 5 + dst * 3 + step) % 4) * 97;  // 0 for some pairs
}

TEST(M2n, FusedStepsEqualFlatAllToAll) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), me = w->rank(), half = n / 2;
  std::vector<int> attention, experts;
  for (int r = 0; r < n; ++r) (r < half ? attention : experts).push_back(r);
  auto groups = M2nGroups::create(n, attention, experts);
  ASSERT_TRUE(groups.ok()) << groups.status().to_string();
  const std::vector<int>& peers = groups->peers_of(me);
  for (int step = 0; step < 2; ++step) {
    // Step 0: only the attention ranks send (the first dispatch, nothing to combine yet).
    auto active = [&](int src) { return step > 0 || src < half; };
    std::vector<size_t> send_bytes, recv_bytes;
    std::vector<uint8_t> send, expected;
    for (int p : peers) {
      size_t out = active(me) ? block_bytes(me, p, step, half) : 0;
      size_t in = active(p) ? block_bytes(p, me, step, half) : 0;
      send_bytes.push_back(out);
      recv_bytes.push_back(in);
      auto b = pattern_block(me + 100 * step, p, out);
      send.insert(send.end(), b.begin(), b.end());
      auto e = pattern_block(p + 100 * step, me, in);
      expected.insert(expected.end(), e.begin(), e.end());
    }
    std::vector<uint8_t> recv(expected.size(), 0xEE);
    Status s = m2n_step(*w, *groups, send.data(), send_bytes, recv.data(), recv_bytes, kTestTimeoutS);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(recv, expected) << "step " << step;

    // The same bytes through a flat all-to-all-v over the whole world.
    std::vector<size_t> flat_send(n, 0), flat_recv(n, 0);
    for (size_t i = 0; i < peers.size(); ++i) {
      flat_send[peers[i]] = send_bytes[i];
      flat_recv[peers[i]] = recv_bytes[i];
    }
    std::vector<uint8_t> flat(expected.size(), 0xDD);
    auto h = w->all_to_all_v(send.data(), flat_send, flat.data(), flat_recv);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());
    EXPECT_EQ(recv, flat);
  }
}

TEST(M2n, BadGroupsNameTheProblem) {
  EXPECT_FALSE(M2nGroups::create(4, {0, 1}, {1, 2}).ok());
  EXPECT_FALSE(M2nGroups::create(4, {}, {1, 2}).ok());
  auto bad = M2nGroups::create(4, {0, 9}, {1});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rank 9"), std::string::npos);
}

}  // namespace
}  // namespace piper::comm::testing
