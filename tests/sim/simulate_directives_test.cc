// simulate_directives(): a directive list compiled and simulated as it is. The directives a strategy emits
// simulate to that strategy's step time exactly (same plan), and a schedule registered in C++ is a strategy's
// `schedule=` like a built-in one: simulated, refused by the closed form with a pointer to simulate.
#include <gtest/gtest.h>

#include "../strategy/reversed_gpipe.h"

#include <string>

#include "piper/compile/directive_strategy.h"
#include "piper/compile/strategy_directives.h"
#include "piper/cost/estimate.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/schedules/schedule.h"
#include "piper/strategy/strategy.h"

namespace piper::sim {
namespace {

struct Fixture {
  ModelSpec model = load_model("tiny-moe").value();
  ClusterSpec cluster = load_cluster("dgx-h100", 1).value();
  TrainSpec train;
  Fixture() { train.seq_len = 128; }
};

// The strategy's directives written to JSON and read back (what `compile --emit-directives` writes and
// `simulate --directives` reads), resolved and simulated, against simulate(strategy).
void expect_same_step(const std::string& text) {
  SCOPED_TRACE(text);
  Fixture u;
  Strategy s = Strategy::parse(text).value();
  auto mesh = compile::strategy_mesh(s, u.model);
  auto emitted = compile::strategy_directives(s, u.model);
  ASSERT_TRUE(mesh.ok() && emitted.ok());
  auto read = ir::directives_from_json(Json::parse(ir::directives_to_json(*emitted).dump(1)), "test");
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  auto resolved = compile::strategy_of_directives(u.model, *mesh, *read, s.mbs);
  ASSERT_TRUE(resolved.ok()) << resolved.status().to_string();
  EXPECT_TRUE(resolved->recognised);
  EXPECT_EQ(resolved->target, "megatron");
  EXPECT_EQ(resolved->strategy.to_string(), s.to_string());
  auto want = simulate(u.model, u.cluster, u.train, s);
  auto got = simulate_directives(u.model, u.cluster, u.train, *mesh, *read, resolved->strategy);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_NEAR(got->step_time_s, want->step_time_s, 1e-9 * want->step_time_s);
  EXPECT_EQ(got->plan_hash, want->plan_hash);
  EXPECT_EQ(got->peak_memory_max_bytes, want->peak_memory_max_bytes);
}

TEST(SimulateDirectivesTest, OneFOneBWithEpAndZero1) { expect_same_step("dp=4,ep=4,pp=2,zero=1,microbatches=4"); }
// The NIC split travels in the disaggregate directive (attn_ports, ffn_ports) and back into the strategy.
TEST(SimulateDirectivesTest, AfPipeWithItsNicSplit) {
  expect_same_step("dp=4,ep=4,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=4,ffn_ranks=4,attn_ports=4,"
                   "ffn_ports=4");
}
TEST(SimulateDirectivesTest, InterleavedWithEpAndZero2) {
  expect_same_step("dp=4,ep=2,pp=2,vpp=2,schedule=interleaved,zero=2,microbatches=4");
}
TEST(SimulateDirectivesTest, ZbH1WithEpAndZero3) {
  expect_same_step("dp=4,ep=4,pp=2,schedule=zb-h1,zero=3,microbatches=4");
}
TEST(SimulateDirectivesTest, DualPipeVWithEpAndZero1) {
  expect_same_step("dp=4,ep=4,pp=2,schedule=dualpipev,zero=1,microbatches=4");
}
TEST(SimulateDirectivesTest, EpOverlapAndTpWithRecompute) {
  expect_same_step("dp=8,ep=8,ep_overlap=1,microbatches=2");
  expect_same_step("dp=2,tp=2,pp=2,sp=1,recompute=selective,microbatches=4");
}

// A hand-edited list (1f1b's rows with the steady F and BW pairs merged into may-overlap slots) is not any
// strategy's: it is priced by the strategy with its settings and simulated with its own order.
TEST(SimulateDirectivesTest, AnEditedListIsPricedNotRecognised) {
  Fixture u;
  Strategy s = Strategy::parse("dp=4,ep=4,pp=2,zero=1,microbatches=4").value();
  auto mesh = compile::strategy_mesh(s, u.model).value();
  auto d = compile::strategy_directives(s, u.model).value();
  for (ir::Directive& x : d) {
    auto* o = std::get_if<ir::OrderDirective>(&x.body);
    if (o == nullptr || o->slots.size() < 4) continue;
    // rank r: slots F F? ... ; merge slot 1 and 2 (a forward and a backward of different microbatches) on rank 0.
    if (o->rank != 0) continue;
    auto& a = o->slots[1];
    a.insert(a.end(), o->slots[2].begin(), o->slots[2].end());
    o->slots.erase(o->slots.begin() + 2);
  }
  auto resolved = compile::strategy_of_directives(u.model, mesh, d, 1);
  ASSERT_TRUE(resolved.ok()) << resolved.status().to_string();
  EXPECT_FALSE(resolved->recognised);
  EXPECT_EQ(resolved->strategy.zero, 1);
  EXPECT_EQ(resolved->strategy.ep, 4);
  auto got = simulate_directives(u.model, u.cluster, u.train, mesh, d, resolved->strategy);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_GT(got->step_time_s, 0);
}


TEST(SimulateDirectivesTest, ARegisteredScheduleIsAStrategysSchedule) {
  piper::testing::register_reversed_gpipe();
  Fixture u;
  auto s = Strategy::parse("dp=4,ep=4,pp=2,zero=1,schedule=test-reversed-gpipe,microbatches=4");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->schedule_kind(), ScheduleKind::kCustom);
  auto r = simulate(u.model, u.cluster, u.train, *s);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto gpipe = simulate(u.model, u.cluster, u.train,
                        Strategy::parse("dp=4,ep=4,pp=2,zero=1,schedule=gpipe,microbatches=4").value());
  ASSERT_TRUE(gpipe.ok());
  EXPECT_NE(r->plan_hash, gpipe->plan_hash);  // its own order, not gpipe's
  EXPECT_GT(r->step_time_s, 0);
  // Its directives are recognised as the strategy's.
  auto mesh = compile::strategy_mesh(*s, u.model).value();
  auto resolved = compile::strategy_of_directives(u.model, mesh, compile::strategy_directives(*s, u.model).value(), 1);
  ASSERT_TRUE(resolved.ok());
  EXPECT_TRUE(resolved->recognised);
  EXPECT_EQ(resolved->strategy.schedule, "test-reversed-gpipe");
  // The closed form says it cannot price it and points to simulate.
  TrainSpec train = u.train;
  train.micro_batch_size = 1;
  auto cm = cost::CostModel::create(u.model, u.cluster, train, {});
  ASSERT_TRUE(cm.ok());
  auto e = cm->estimate(*s);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("piper simulate"), std::string::npos) << e.status().message();
  // An unknown name lists the registered ones.
  auto bad = Strategy::parse("schedule=test-reversed-gpip");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("test-reversed-gpipe"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("register_schedule"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace piper::sim
