// The one-line summary of a failed multi-rank job (comm/launch.h) and PIPER_HEARTBEAT_S (comm/heartbeat.h).
#include <gtest/gtest.h>

#include <cstdlib>

#include "piper/comm/communicator.h"
#include "piper/comm/heartbeat.h"
#include "piper/comm/launch.h"

namespace piper::comm {
namespace {

TEST(JobFailureSummary, NamesTheKilledRankAndTheReporters) {
  const std::vector<std::string> lines = {
      "piper: fault injection: rank 1 kills (SIGKILL) itself at pp_send in step 5 (PIPER_FAULT)",
      "piper: error: rank 2: executor: send to rank 3 on rank 2: made no progress",
      "mpirun noticed that process rank 1 with PID 4242 on node box exited on signal 9 (Killed).",
  };
  const std::string s = summarize_job_failure(lines, 4, 137);
  EXPECT_NE(s.find("the 4-rank job failed (mpirun exit status 137)"), std::string::npos) << s;
  EXPECT_NE(s.find("injected fault: rank 1 kills (SIGKILL) itself at pp_send in step 5"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 1 was killed by signal 9 (Killed)"), std::string::npos) << s;
  EXPECT_NE(s.find("rank 2 reported errors, first rank 2: executor: send to rank 3"), std::string::npos) << s;
}

TEST(JobFailureSummary, NamesTheStoppedRankFromTheHeartbeatErrors) {
  const std::vector<std::string> lines = {
      "piper: error: rank 3: executor: head.ar on rank 3: rank 1 stopped responding (no heartbeat for 4.1 s; "
      "PIPER_HEARTBEAT_S=4.0 s): it is stopped",
      "piper: error: rank 0: rank 1 stopped responding (no heartbeat for 4.2 s; PIPER_HEARTBEAT_S=4.0 s)",
  };
  const std::string s = summarize_job_failure(lines, 4, 1);
  EXPECT_NE(s.find("rank 1 stopped responding (no heartbeat for 4.1 s)"), std::string::npos) << s;
  EXPECT_NE(s.find("ranks 0, 3 reported errors, first rank 3:"), std::string::npos) << s;
  EXPECT_EQ(s.find("killed"), std::string::npos) << s;
}

TEST(JobFailureSummary, SaysWhenNoRankReported) {
  const std::string s = summarize_job_failure({"some launcher noise"}, 2, 1);
  EXPECT_NE(s.find("no rank reported an error before mpirun stopped the job"), std::string::npos) << s;
}

TEST(JobFailureSummary, ElidesLongErrors) {
  const std::string s = summarize_job_failure({"piper: error: rank 0: " + std::string(100000, 'x')}, 2, 1);
  EXPECT_LT(s.size(), 600u);
}

TEST(HeartbeatOptions, DefaultRangeAndOff) {
  unsetenv("PIPER_HEARTBEAT_S");
  Result<HeartbeatOptions> d = heartbeat_options_from_env();
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->silence_s, 4.0);
  EXPECT_EQ(d->period_s, 0.25);
  setenv("PIPER_HEARTBEAT_S", "2", 1);
  Result<HeartbeatOptions> two = heartbeat_options_from_env();
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->silence_s, 2.0);
  EXPECT_EQ(two->period_s, 0.125);
  setenv("PIPER_HEARTBEAT_S", "0", 1);
  Result<HeartbeatOptions> off = heartbeat_options_from_env();
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->silence_s, 0.0);
  for (const char* bad : {"0.5", "-1", "nan", "inf", "3601", "soon"}) {
    setenv("PIPER_HEARTBEAT_S", bad, 1);
    Result<HeartbeatOptions> r = heartbeat_options_from_env();
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string("PIPER_HEARTBEAT_S='") + bad + "'"), std::string::npos);
    EXPECT_NE(r.status().message().find("in [1, 3600], or 0"), std::string::npos) << r.status().message();
  }
  unsetenv("PIPER_HEARTBEAT_S");
}

TEST(CommTimeout, CheckedFromTheEnvironment) {
  unsetenv("PIPER_COMM_TIMEOUT_S");
  ASSERT_TRUE(timeout_from_env().ok());
  EXPECT_EQ(*timeout_from_env(), 300.0);
  setenv("PIPER_COMM_TIMEOUT_S", "2.5", 1);
  ASSERT_TRUE(timeout_from_env().ok());
  EXPECT_EQ(*timeout_from_env(), 2.5);
  for (const char* bad : {"0", "-3", "nan", "1e7", "ten"}) {
    setenv("PIPER_COMM_TIMEOUT_S", bad, 1);
    Result<double> r = timeout_from_env();
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string("PIPER_COMM_TIMEOUT_S='") + bad + "' must be"), std::string::npos)
        << r.status().message();
  }
  unsetenv("PIPER_COMM_TIMEOUT_S");
}

TEST(HeartbeatVerdict, NamesTheSilentRankUntilCleared) {
  ASSERT_TRUE(peer_liveness().ok());
  report_silent_peer(3, 4.25, 4);
  Status s = peer_liveness();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("rank 3 stopped responding (no heartbeat for 4.2 s; PIPER_HEARTBEAT_S=4.0 s)"),
            std::string::npos)
      << s.message();
  report_silent_peer(5, 9, 4);  // the first verdict stays
  EXPECT_NE(peer_liveness().message().find("rank 3 "), std::string::npos);
  clear_silent_peer();
  EXPECT_TRUE(peer_liveness().ok());
}

}  // namespace
}  // namespace piper::comm
