// A rank that never joins: the others get DEADLINE_EXCEEDED naming it within the timeout, instead of hanging.
// The late rank then joins so that the operation completes and the job ends cleanly.
#include <gtest/gtest.h>

#include <chrono>

#include "comm_test_util.h"

namespace piper::comm::testing {
namespace {

constexpr double kShortTimeoutS = 0.5;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The last rank is late: it waits for a "go" from every other rank, which they send only after their wait on
// the collective has timed out.
TEST(MpiTimeout, CollectiveNamesTheRankThatNeverArrived) {
  auto w = world();
  auto side = world();
  ASSERT_NE(w, nullptr);
  const int n = w->size(), late = n - 1, me = w->rank();
  float value = 1.0f, sum = 0.0f;
  char go = 'g';
  if (me != late) {
    auto h = w->all_reduce_sum(&value, &sum, 1);
    ASSERT_TRUE(h.ok());
    auto t0 = std::chrono::steady_clock::now();
    Status s = w->wait(*h, kShortTimeoutS);
    double waited_s = seconds_since(t0);
    ASSERT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
    EXPECT_NE(s.message().find("all_reduce"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("group 'world'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("did not arrive: rank " + std::to_string(late) + "."), std::string::npos)
        << s.message();
    EXPECT_GE(waited_s, kShortTimeoutS);
    EXPECT_LT(waited_s, kShortTimeoutS + 10.0);  // bounded: the wait returns, it does not hang
    auto g = side->isend(&go, 1, late, 5);
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE(side->wait(*g, kTestTimeoutS).ok());
    ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());  // completes once the late rank joins
  } else {
    for (int p = 0; p < n - 1; ++p) {
      char got = 0;
      auto r = side->irecv(&got, 1, p, 5);
      ASSERT_TRUE(r.ok());
      ASSERT_TRUE(side->wait(*r, kTestTimeoutS).ok());
      EXPECT_EQ(got, 'g');
    }
    auto h = w->all_reduce_sum(&value, &sum, 1);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(w->wait(*h, kTestTimeoutS).ok());
  }
  EXPECT_EQ(sum, static_cast<float>(n));
}

// A receive whose sender is late names the sender.
TEST(MpiTimeout, ReceiveNamesTheSilentPeer) {
  auto w = world();
  auto side = world();
  ASSERT_NE(w, nullptr);
  const int me = w->rank();
  uint32_t payload = 0, sent = 0xC0FFEE;
  char go = 'g';
  if (me == 0) {
    auto r = w->irecv(&payload, sizeof(payload), 1, 9);
    ASSERT_TRUE(r.ok());
    Status s = w->wait(*r, kShortTimeoutS);
    ASSERT_EQ(s.code(), StatusCode::kDeadlineExceeded);
    EXPECT_NE(s.message().find("recv"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
    auto g = side->isend(&go, 1, 1, 5);
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE(side->wait(*g, kTestTimeoutS).ok());
    ASSERT_TRUE(w->wait(*r, kTestTimeoutS).ok());
    EXPECT_EQ(payload, sent);
  } else if (me == 1) {
    char got = 0;
    auto r = side->irecv(&got, 1, 0, 5);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(side->wait(*r, kTestTimeoutS).ok());
    auto s = w->isend(&sent, sizeof(sent), 0, 9);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(w->wait(*s, kTestTimeoutS).ok());
  }
}

}  // namespace
}  // namespace piper::comm::testing
