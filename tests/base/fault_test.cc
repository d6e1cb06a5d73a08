// PIPER_FAULT specs: the accepted forms and one refusal per field, each naming the bad value and the format.
#include "piper/base/fault.h"

#include <gtest/gtest.h>

namespace piper {
namespace {

TEST(FaultSpec, ParsesPointRankStepAndAction) {
  Result<FaultSpec> s = parse_fault_spec("pp_send:1:3");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->point, "pp_send");
  EXPECT_EQ(s->rank, 1);
  EXPECT_EQ(s->step, 3);
  EXPECT_EQ(s->action, FaultAction::kKill);
  Result<FaultSpec> stop = parse_fault_spec("ckpt_write:0:2:stop");
  ASSERT_TRUE(stop.ok()) << stop.status().to_string();
  EXPECT_EQ(stop->action, FaultAction::kStop);
  for (const char* p : kFaultPoints) EXPECT_TRUE(parse_fault_spec(std::string(p) + ":2:1:kill").ok()) << p;
}

struct Bad {
  const char* spec;
  const char* says;
};

TEST(FaultSpec, RefusesEachBadFieldByName) {
  const Bad cases[] = {
      {"pp_send", "has 1 field(s); expected PIPER_FAULT=POINT:RANK:STEP[:ACTION]"},
      {"pp_send:1:2:kill:now", "has 5 field(s)"},
      {"pp_recv:1:2", "unknown point 'pp_recv'; pick one of pp_send, ep_a2a, halo, migrate, ckpt_write"},
      {"halo:-1:2", "rank '-1' must be a world rank in [0, 1000000]"},
      {"halo:one:2", "rank 'one' must be a world rank"},
      {"halo:1:0", "step '0' must be a training step >= 1"},
      {"halo:1:2.5", "step '2.5' must be a training step >= 1"},
      {"halo:1:2:pause", "action 'pause' must be kill (SIGKILL) or stop (SIGSTOP)"},
  };
  for (const Bad& b : cases) {
    Result<FaultSpec> s = parse_fault_spec(b.spec);
    ASSERT_FALSE(s.ok()) << b.spec;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << b.spec;
    EXPECT_NE(s.status().message().find(b.says), std::string::npos) << b.spec << ": " << s.status().message();
  }
}

TEST(FaultSpec, ElidesLongValues) {
  Result<FaultSpec> s = parse_fault_spec(std::string(5000, 'x') + ":1:2");
  ASSERT_FALSE(s.ok());
  EXPECT_LT(s.status().message().size(), 300u) << s.status().message();
}

// Unarmed (PIPER_FAULT unset in the test environment): a fault point is a no-op.
TEST(FaultSpec, UnarmedPointsDoNothing) {
  ASSERT_TRUE(init_fault_injection().ok());
  set_fault_step(1);
  for (const char* p : kFaultPoints) fault_point(p);
  SUCCEED();
}

}  // namespace
}  // namespace piper
