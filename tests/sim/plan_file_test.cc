// The Plan is the whole contract: a plan written to a file and read back (`piper compile --emit-plan`,
// compile/plan_io.h) simulates, without its graph, to the step time of the plan as compiled.
#include <gtest/gtest.h>

#include <string>

#include "piper/compile/plan_io.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::sim {
namespace {

void expect_round_trip(const std::string& text) {
  SCOPED_TRACE(text);
  ModelSpec model = load_model("tiny-moe").value();
  ClusterSpec cluster = load_cluster("dgx-h100", 1).value();
  TrainSpec train;
  train.seq_len = 256;
  Strategy s = Strategy::parse(text).value();
  auto compiled = compile_for_simulation(model, cluster, train, s, {}, {}, 0);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  // One file per test case: CTest runs the cases as parallel processes, and a shared name let one case read
  // another's half-written plan.
  const std::string path = std::string(PIPER_BINARY_DIR) + "/plan_file_test_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
  ASSERT_TRUE(compile::write_plan_file(path, compiled->plan).ok());
  auto loaded = compile::load_plan_file(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  compile::CompileResult plan_only;  // no graph: the simulator reads only the plan
  plan_only.plan = std::move(loaded).value();
  auto want = simulate_compiled(std::move(compiled).value(), model, cluster, train, s);
  auto got = simulate_compiled(std::move(plan_only), model, cluster, train, s);
  ASSERT_TRUE(want.ok()) << want.status().message();
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_GT(want->step_time_s, 0);
  EXPECT_NEAR(got->step_time_s, want->step_time_s, 1e-12);
  EXPECT_EQ(got->plan_hash, want->plan_hash);
  EXPECT_EQ(got->peak_memory_max_bytes, want->peak_memory_max_bytes);
  EXPECT_EQ(got->sim.instructions, want->sim.instructions);
}

TEST(PlanFileTest, OneFOneB) { expect_round_trip("dp=2,tp=2,sp=1,pp=2,schedule=1f1b,microbatches=4"); }
TEST(PlanFileTest, DualPipeVWithEp) { expect_round_trip("dp=4,ep=4,pp=2,schedule=dualpipev,zero=1,microbatches=4"); }
TEST(PlanFileTest, Zero3) { expect_round_trip("dp=4,ep=2,pp=2,zero=3,microbatches=4"); }
TEST(PlanFileTest, AfPipe) {
  expect_round_trip("dp=4,ep=2,pp=1,schedule=af-pipe,disagg=1,attn_ranks=4,ffn_ranks=4,microbatches=2");
}

}  // namespace
}  // namespace piper::sim
