// The memory screen (VerifyOptions::memory_screen): a plan decided from two small compiles gets the verdict,
// message and peak the full compile gives; plans whose peak grows with the microbatch count (GPipe) are compiled in
// full.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "piper/planner/verify.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::planner {
namespace {

struct ScreenCase {
  std::string strategy;
  bool steady;  // peak independent of the microbatch count: the screen decides a rejection
};

// DeepSeek-V2-Lite on 16 ranks with 64 microbatches, one case per schedule family and ZeRO-3.
std::vector<ScreenCase> screen_cases() {
  const std::string mesh = "dp=4,tp=1,pp=4,ep=4,etp=1,sp=0,mbs=1,a2a=flat,microbatches=64,";
  return {{mesh + "vpp=1,zero=1,recompute=none,schedule=1f1b", true},
          {mesh + "vpp=1,zero=1,recompute=selective,schedule=zb-h1", true},
          {mesh + "vpp=1,zero=1,recompute=full,schedule=dualpipev", true},
          {mesh + "vpp=2,zero=1,recompute=none,schedule=interleaved", true},
          {mesh + "vpp=1,zero=3,recompute=none,schedule=1f1b", true},
          {mesh + "vpp=1,zero=1,recompute=none,schedule=gpipe", false}};
}

TEST(VerifyScreenTest, RejectionsMatchTheFullCompile) {
  auto model = load_model("deepseek-v2-lite");
  ASSERT_TRUE(model.ok());
  const VerifyOptions full{false};
  const VerifyOptions screen{true};
  for (const ScreenCase& c : screen_cases()) {
    auto s = Strategy::parse(c.strategy);
    ASSERT_TRUE(s.ok()) << c.strategy << ": " << s.status().message();
    TrainSpec t;
    t.seq_len = 1024;
    t.micro_batch_size = s->mbs;
    t.global_batch = s->global_batch();
    ASSERT_TRUE(s->validate_for(*model, t, s->world_size()).ok()) << c.strategy;
    const Verification unlimited = verify_strategy(*model, t, *s, 0, full);
    ASSERT_TRUE(unlimited.ok) << c.strategy << ": " << unlimited.message;
    // Just below the compiled peak: rejected by both paths, by the screen when the schedule is steady.
    const double below = unlimited.compiled_peak_bytes - (1 << 20);
    const Verification old_reject = verify_strategy(*model, t, *s, below, full);
    const Verification new_reject = verify_strategy(*model, t, *s, below, screen);
    EXPECT_FALSE(old_reject.ok) << c.strategy;
    EXPECT_FALSE(new_reject.ok) << c.strategy;
    EXPECT_EQ(new_reject.message, old_reject.message) << c.strategy;
    EXPECT_EQ(new_reject.compiled_peak_bytes, old_reject.compiled_peak_bytes) << c.strategy;
    EXPECT_FALSE(old_reject.screened) << c.strategy;
    EXPECT_EQ(new_reject.screened, c.steady) << c.strategy;
    // At the peak: accepted by both with the same peak, by the screen when the schedule is steady.
    const Verification old_accept = verify_strategy(*model, t, *s, unlimited.compiled_peak_bytes, full);
    const Verification new_accept = verify_strategy(*model, t, *s, unlimited.compiled_peak_bytes, screen);
    EXPECT_TRUE(old_accept.ok && new_accept.ok) << c.strategy << ": " << new_accept.message;
    EXPECT_EQ(new_accept.screened, c.steady) << c.strategy;
    EXPECT_EQ(new_accept.compiled_peak_bytes, old_accept.compiled_peak_bytes) << c.strategy;
    EXPECT_EQ(new_accept.full_compile_estimate_s > 0, c.steady) << c.strategy;
    // Rejections only: the accepted plan is compiled in full.
    VerifyOptions reject_only;
    reject_only.accept_steady = false;
    const Verification full_accept = verify_strategy(*model, t, *s, unlimited.compiled_peak_bytes, reject_only);
    EXPECT_TRUE(full_accept.ok && !full_accept.screened) << c.strategy;
    EXPECT_EQ(full_accept.compiled_peak_bytes, old_accept.compiled_peak_bytes) << c.strategy;
  }
}

TEST(VerifyScreenTest, FewMicrobatchesAreCompiledInFull) {
  auto model = load_model("deepseek-v2-lite");
  ASSERT_TRUE(model.ok());
  // pp=4: the screen compiles 8 and 16 microbatches, so 24 or fewer are compiled in full only.
  auto s = Strategy::parse(
      "dp=4,tp=1,pp=4,vpp=1,ep=4,etp=1,zero=1,sp=0,recompute=none,schedule=1f1b,"
      "microbatches=24,mbs=1,a2a=flat");
  ASSERT_TRUE(s.ok()) << s.status().message();
  TrainSpec t;
  t.seq_len = 1024;
  t.global_batch = s->global_batch();
  const Verification v = verify_strategy(*model, t, *s, 1.0, VerifyOptions{true});
  EXPECT_FALSE(v.ok);
  EXPECT_FALSE(v.screened);
  EXPECT_NE(v.message.find("at its peak"), std::string::npos) << v.message;
}

TEST(VerifyScreenTest, SimulationCompileIsKeptOnlyWhenItFitsTheBudget) {
  auto model = load_model("deepseek-v2-lite");
  auto cluster = load_cluster("h800", 2);
  ASSERT_TRUE(model.ok() && cluster.ok());
  auto s = Strategy::parse(screen_cases()[0].strategy);
  ASSERT_TRUE(s.ok());
  TrainSpec t;
  t.seq_len = 1024;
  t.global_batch = s->global_batch();
  const double capacity = 0.95 * static_cast<double>(cluster->device.memory_bytes);
  const Verification full = verify_strategy(*model, t, *s, capacity, VerifyOptions{false});
  ASSERT_TRUE(full.ok) << full.message;
  VerifyOptions o;
  std::shared_ptr<compile::CompileResult> compiled;
  const Verification kept = verify_strategy_for_simulation(*model, *cluster, t, *s, {}, capacity, &compiled, o);
  EXPECT_TRUE(kept.ok && !kept.screened && compiled != nullptr);
  EXPECT_EQ(kept.compiled_peak_bytes, full.compiled_peak_bytes);
  o.max_full_compile_s = 0;
  compiled.reset();
  const Verification skipped = verify_strategy_for_simulation(*model, *cluster, t, *s, {}, capacity, &compiled, o);
  EXPECT_TRUE(skipped.ok && skipped.screened);
  EXPECT_EQ(compiled, nullptr);
  EXPECT_EQ(skipped.compiled_peak_bytes, full.compiled_peak_bytes);
}

}  // namespace
}  // namespace piper::planner
