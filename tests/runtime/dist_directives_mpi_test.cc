// `piper train --directives`: the trainer runs a directive list as it is (TrainOptions::directives).
//   - The directives a strategy emits for the CPU runtime train to the strategy's losses bit for bit (same plan).
//   - A schedule registered in C++ is named in a strategy and trains to one rank's losses.
//   - Each hand-written file in examples/ trains to one rank's losses (1e-5 relative, as the parity tests).
// Run by CTest under mpiexec with --gtest_filter per case (tests/runtime/CMakeLists.txt).
#include <gtest/gtest.h>

#include "../strategy/reversed_gpipe.h"

#include <cmath>
#include <string>

#include "dist_test_util.h"
#include "piper/comm/mpi/mpi_communicator.h"
#include "piper/compile/strategy_directives.h"
#include "piper/compile/target.h"
#include "piper/strategy/schedules/schedule.h"

namespace piper::runtime::testing {
namespace {

constexpr int kSteps = 5;
constexpr double kRelTol = 1e-5;
constexpr double kLr = 1e-3;

std::vector<double> losses(TrainOptions o, bool on_world) {
  if (on_world) {
    auto world = comm::mpi_world();
    EXPECT_TRUE(world.ok());
    o.ranks = (*world)->size();
    o.world = world->get();
    // The world outlives the trainer: mpi_world() hands out views of MPI_COMM_WORLD.
    auto t = Trainer::create(o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    if (!t.ok()) return {};
    std::vector<double> out;
    for (const TrainStepStats& s : train_steps(**t, kSteps)) out.push_back(s.loss);
    return out;
  }
  auto t = Trainer::create(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return {};
  std::vector<double> out;
  for (const TrainStepStats& s : train_steps(**t, kSteps)) out.push_back(s.loss);
  return out;
}

// `strategy`'s directives for the CPU runtime (what `piper compile --target cpu-runtime --emit-directives` writes),
// or for the megatron target (the default's: what the simulator runs).
TrainOptions emitted(const std::string& strategy, bool megatron = false) {
  TrainOptions o = tiny_moe_options("", kLr);
  Strategy s = Strategy::parse(strategy).value();
  compile::DirectiveOptions d;
  const compile::Target target = megatron ? compile::megatron_target() : compile::cpu_runtime_target();
  d.vocab_parallel = target.vocab_parallel;
  d.overlap_param_gather = target.overlap_param_gather;
  o.directives = compile::strategy_directives(s, o.model, d).value();
  o.mesh = compile::strategy_mesh(s, o.model).value();
  o.global_batch = s.global_batch();
  return o;
}

void expect_bitwise(const std::string& strategy, bool megatron = false) {
  const std::vector<double> want = losses(tiny_moe_options(strategy, kLr), true);
  const std::vector<double> got = losses(emitted(strategy, megatron), true);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(got, want) << strategy;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - ref[i]) / std::abs(ref[i]), kRelTol)
        << what << " step " << i + 1 << ": " << got[i] << " vs one rank " << ref[i];
  }
}

TEST(Directives, EmittedPp2OneFOneBTrainsLikeTheStrategy) {
  expect_bitwise("pp=2,schedule=1f1b,microbatches=4,mbs=1");
}
TEST(Directives, EmittedDp2Zero1TrainsLikeTheStrategy) { expect_bitwise("dp=2,zero=1,microbatches=2,mbs=1"); }
TEST(Directives, EmittedDualPipeVEpZero1TrainsLikeTheStrategy) {
  expect_bitwise("dp=2,pp=2,ep=2,zero=1,schedule=dualpipev,microbatches=4,mbs=1");
}
// The megatron target's file of a tp strategy (`shard tp` on embed and head: vocabulary parallelism) trains.
TEST(Directives, EmittedMegatronTp2TrainsLikeTheStrategy) { expect_bitwise("tp=2,sp=1,microbatches=2,mbs=1", true); }

TEST(Directives, RegisteredScheduleTrainsLikeOneRank) {
  piper::testing::register_reversed_gpipe();
  const std::vector<double> ref = losses(tiny_moe_options("microbatches=4,mbs=1", kLr), false);
  const std::string s = "pp=2,schedule=test-reversed-gpipe,microbatches=4,mbs=1";
  expect_near(losses(tiny_moe_options(s, kLr), true), ref, s);
}

// examples/NAME.json on `mesh` against one rank with the same microbatches (mbs 1).
void expect_example(const std::string& name, const std::string& mesh_text, int microbatches) {
  TrainOptions o = tiny_moe_options("", kLr);
  auto d = ir::load_directives_file(std::string(PIPER_SOURCE_DIR) + "/examples/" + name + ".json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  o.directives = *d;
  ir::MeshInfo mesh;
  for (const std::string& kv : {std::string("pp"), std::string("vpp"), std::string("dp"), std::string("ep")}) {
    const size_t at = mesh_text.find(kv + "=");
    if (at == std::string::npos || (at > 0 && mesh_text[at - 1] != ',')) continue;
    const int v = std::stoi(mesh_text.substr(at + kv.size() + 1));
    (kv == "pp" ? mesh.pp : kv == "vpp" ? mesh.vpp : kv == "dp" ? mesh.dp : mesh.ep) = v;
  }
  o.mesh = mesh;
  o.global_batch = static_cast<int64_t>(mesh.dp) * microbatches;
  const std::vector<double> ref =
      losses(tiny_moe_options("microbatches=" + std::to_string(o.global_batch) + ",mbs=1", kLr), false);
  expect_near(losses(o, true), ref, name);
}

TEST(Directives, ExampleOneFOneBEpOverlap) { expect_example("1f1b_ep_overlap", "pp=2,dp=2,ep=2", 4); }
TEST(Directives, ExampleVShape) { expect_example("v_shape", "pp=2,vpp=2", 4); }
TEST(Directives, ExampleUnevenZeroBubble) { expect_example("uneven_zero_bubble", "pp=2", 4); }
TEST(Directives, ExampleAfPipeOneToThree) { expect_example("af_pipe_1to3", "pp=4,vpp=2", 4); }

}  // namespace
}  // namespace piper::runtime::testing
