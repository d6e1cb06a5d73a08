// simulate() executes the compiler's rank layout (tp innermost, ep inside dp, then pp); a strategy whose mesh
// order is a different layout is refused with a message naming the order, instead of being simulated as if it
// were the default one (the planner then keeps that plan's closed-form place: plan/rescore.cc).
#include <gtest/gtest.h>

#include <string>

#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::sim {
namespace {

Result<SimReport> run(const std::string& strategy) {
  auto model = load_model("gpt-1.7b");
  auto cluster = load_cluster("dgx-a100", 4);
  auto s = Strategy::parse(strategy);
  EXPECT_TRUE(model.ok() && cluster.ok() && s.ok());
  TrainSpec train;
  train.seq_len = 2048;
  return simulate(*model, *cluster, train, *s, cost::Calibration{});
}

TEST(SimulateOrderTest, AnotherLayoutIsRefusedByName) {
  auto r = run("dp=8,tp=2,pp=2,order=tp-pp-dp-ep");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("order=tp-pp-dp-ep"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("piper estimate"), std::string::npos) << r.status().message();
}

TEST(SimulateOrderTest, OrdersThatDifferOnlyInSizeOneAxesAreTheCompiledLayout) {
  auto def = run("dp=8,tp=4");
  auto same = run("dp=8,tp=4,order=tp-pp-ep-dp");  // pp = ep = 1: the same ranks in the same places
  ASSERT_TRUE(def.ok() && same.ok()) << (def.ok() ? same.status().message() : def.status().message());
  EXPECT_EQ(def->step_time_s, same->step_time_s);
  EXPECT_FALSE(run("dp=8,tp=4,order=pp-ep-dp-tp").ok());  // tp outside dp: another layout
}

}  // namespace
}  // namespace piper::sim
