// Heartbeats (comm/heartbeat.h) on 2, 4 and 8 oversubscribed ranks: a rank that computes without a single MPI
// call for 3x the silence threshold is not declared stopped (its heartbeat thread beats on); a rank stopped with
// SIGSTOP is named by every other rank's wait within the threshold plus a few periods, and not after the
// communication timeout. The stopped rank is then continued, and the job ends cleanly.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "comm_test_util.h"

namespace piper::comm::testing {
namespace {

constexpr double kSilenceS = 1.0;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

HeartbeatOptions fast() {
  HeartbeatOptions o;
  o.silence_s = kSilenceS;
  o.period_s = kSilenceS / 16;
  return o;
}

// Rank 1 spins on the CPU (no MPI call) for 3 s while the others wait for it in a barrier: no verdict.
TEST(Heartbeat, BusyRankIsNotDeclaredStopped) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  auto hb = w->start_heartbeat(fast());
  ASSERT_TRUE(hb.ok()) << hb.status().to_string();
  ASSERT_NE(*hb, nullptr);
  if (w->rank() == 1) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile double x = 0;
    while (seconds_since(t0) < 3 * kSilenceS) x = x + 1e-9;
  }
  auto b = w->barrier();
  ASSERT_TRUE(b.ok());
  Status s = w->wait(*b, kTestTimeoutS);
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(peer_liveness().ok()) << peer_liveness().to_string();
  hb->reset();
  auto end = w->barrier();
  ASSERT_TRUE(end.ok());
  ASSERT_TRUE(w->wait(*end, kTestTimeoutS).ok());
}

// Rank 1 stops itself; the others' barrier fails naming it within about the threshold, then rank 0 continues it.
TEST(Heartbeat, StoppedRankIsNamedWithinTheThreshold) {
  auto w = world();
  ASSERT_NE(w, nullptr);
  const int me = w->rank();
  const int32_t pid = static_cast<int32_t>(getpid());
  std::vector<int32_t> pids(static_cast<size_t>(w->size()));
  auto g = w->all_gather(&pid, pids.data(), sizeof(pid));
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(w->wait(*g, kTestTimeoutS).ok());
  // The ranks that stay up agree among themselves that all of them saw the verdict before rank 1 is continued.
  std::vector<int> others;
  for (int r = 0; r < w->size(); ++r) {
    if (r != 1) others.push_back(r);
  }
  auto up = w->split(me == 1 ? std::vector<int>{1} : others, me == 1 ? "stopped" : "up");
  ASSERT_TRUE(up.ok()) << up.status().to_string();
  auto hb = w->start_heartbeat(fast());
  ASSERT_TRUE(hb.ok()) << hb.status().to_string();
  // Everyone hears everyone once before rank 1 stops (a peer is judged only after its first beat).
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * fast().period_s));
  auto ready = w->barrier();
  ASSERT_TRUE(ready.ok());
  ASSERT_TRUE(w->wait(*ready, kTestTimeoutS).ok());
  if (me == 1) raise(SIGSTOP);
  auto b = w->barrier();
  ASSERT_TRUE(b.ok());
  if (me != 1) {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = w->wait(*b, kTestTimeoutS);
    const double waited_s = seconds_since(t0);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
    EXPECT_NE(s.message().find("rank 1 stopped responding (no heartbeat for"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("barrier on group 'world'"), std::string::npos) << s.message();
    EXPECT_LT(waited_s, kSilenceS + 2.0) << s.message();
    std::printf("rank %d named the stopped rank after %.2f s: %s\n", me, waited_s, s.message().c_str());
  }
  // Everyone but rank 1 has its verdict; rank 0 then continues rank 1 and everyone stops beating.
  hb->reset();
  if (me != 1) {
    auto agreed = (*up)->barrier();
    ASSERT_TRUE(agreed.ok());
    ASSERT_TRUE((*up)->wait(*agreed, kTestTimeoutS).ok());
  }
  if (me == 0) {
    ASSERT_EQ(kill(pids[1], SIGCONT), 0);
  }
  ASSERT_TRUE(w->wait(*b, kTestTimeoutS).ok());
  EXPECT_TRUE(peer_liveness().ok());
}

}  // namespace
}  // namespace piper::comm::testing
