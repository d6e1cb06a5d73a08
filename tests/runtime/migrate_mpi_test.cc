// Live expert migration (label mpi, 4 ranks): tiny-moe with routing skewed towards the low experts (so ep rank 0
// receives most tokens), ep=4, trained 50 steps with migration off and on. Migration changes where an expert
// lives, never what it computes: the losses agree step by step (relative difference <= 1e-5; the test prints
// whether they are bitwise equal) and so do the per-expert loads, which count every routed row (the step's tokens
// x top_k per MoE layer); at least one migration happens and it lowers the imbalance. Also dp=4 ep=2 with ZeRO and
// dp2 x tp2 x ep2 folded and unfolded (15 steps each). Run by CTest under mpiexec -n 4 (tests/runtime/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "dist_test_util.h"
#include "piper/comm/mpi/mpi_communicator.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/trainer.h"
#include "piper/spec/model_loader.h"

namespace piper::runtime::testing {
namespace {

constexpr int kSteps = 50;
constexpr double kRelTol = 1e-5;
constexpr double kSkew = 0.15;  // on softmax scores of ~1/8 per expert: experts 0 and 1 win most selections
constexpr int kWindow = 5;
const char* const kEp4 = "dp=4,ep=4,a2a=flat,microbatches=1,mbs=1";

TrainOptions options(comm::Communicator* world, bool migrate, const std::string& strategy = kEp4, int steps = kSteps) {
  TrainOptions o = tiny_moe_options(strategy, 1e-3);
  o.ranks = world->size();
  o.world = world;
  o.model_options.router_skew = kSkew;
  o.migration.enabled = migrate;
  o.migration.window_steps = kWindow;
  // tiny-moe's experts are cheap to compute and dear to move (weights, gradients and moments): count the
  // saving over the rest of the run, not just the next window, so that the planner's moves pay.
  o.migration.horizon_steps = steps;
  return o;
}

// `o` trained `steps` steps; the final expert placement and the tokens of one step (the global batch's).
std::vector<TrainStepStats> run(const TrainOptions& o, int steps, std::map<int, std::vector<int>>* placement,
                                int64_t* tokens_per_step) {
  auto t = Trainer::create(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return {};
  std::vector<TrainStepStats> out = train_steps(**t, steps);
  *placement = (*t)->executor().expert_placement();
  *tokens_per_step = (*t)->tokens_per_step();
  return out;
}

double mean_imbalance(const std::vector<TrainStepStats>& s, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += s[i].imbalance;
  return sum / static_cast<double>(end - begin);
}

// `strategy` trained `steps` steps with migration off and on (see the file comment).
void expect_same_losses(const std::string& strategy, int steps) {
  auto world = comm::mpi_world();
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  comm::Communicator* w = world->get();
  std::map<int, std::vector<int>> fixed, moved;
  const TrainOptions o_off = options(w, false, strategy, steps);
  const double o_clip = o_off.optimizer.grad_clip;
  const int top_k = o_off.model.moe.top_k;
  int64_t tokens = 0;
  const std::vector<TrainStepStats> off = run(o_off, steps, &fixed, &tokens);
  const std::vector<TrainStepStats> on = run(options(w, true, strategy, steps), steps, &moved, &tokens);
  ASSERT_EQ(off.size(), static_cast<size_t>(steps));
  ASSERT_EQ(on.size(), static_cast<size_t>(steps));
  double worst = 0;
  bool bitwise = true;
  int migrations = 0, experts = 0, norms_equal = 0, clipped = 0;
  double seconds = 0;
  for (size_t i = 0; i < on.size(); ++i) {
    const double rel = std::abs(on[i].loss - off[i].loss) / std::abs(off[i].loss);
    if (std::getenv("PIPER_TEST_VERBOSE") && w->rank() == 0) {
      std::printf("step %zu loss %.9f / %.9f imbalance %.3f / %.3f moved %d\n", i + 1, off[i].loss, on[i].loss,
                  off[i].imbalance, on[i].imbalance, on[i].migrated_experts);
    }
    worst = std::max(worst, rel);
    bitwise = bitwise && on[i].loss == off[i].loss;
    // The global norm sums per-rank parts, which migration regroups: reported, not required to be bitwise.
    norms_equal += on[i].grad_norm == off[i].grad_norm;
    clipped += off[i].grad_norm > o_clip;
    EXPECT_LE(rel, kRelTol) << "step " << i + 1 << ": loss with migration " << on[i].loss << " vs without "
                            << off[i].loss;
    // The same routing decisions: the loads per logical expert are equal, wherever the experts live.
    EXPECT_EQ(on[i].expert_tokens, off[i].expert_tokens) << "step " << i + 1;
    // The whole load: every token of the step routed to top_k experts in each MoE layer (no capacity limit), so
    // the planner sees every row (under sequence parallelism each tensor rank counts its own slice).
    for (const auto& [layer, load] : on[i].expert_tokens) {
      int64_t rows = 0;
      for (int64_t v : load) rows += v;
      EXPECT_EQ(rows, tokens * top_k) << "step " << i + 1 << ", layer " << layer;
    }
    EXPECT_EQ(off[i].migrated_experts, 0);
    if (on[i].migrated_experts > 0) {
      ++migrations;
      experts += on[i].migrated_experts;
      seconds += on[i].migration_seconds;
      EXPECT_EQ((i + 1) % kWindow, 0u) << "migrations happen only at window boundaries";
      EXPECT_LT(on[i].window_imbalance_after, on[i].window_imbalance_before);
    }
  }
  EXPECT_GE(migrations, 1) << "the skewed routing never triggered a migration";
  EXPECT_NE(moved, fixed) << "the placement table is still the initial one";
  // Before the first plan both runs see the same imbalance; afterwards migration lowers it.
  const double skewed = mean_imbalance(off, steps - 10, steps);
  const double balanced = mean_imbalance(on, steps - 10, steps);
  EXPECT_GT(mean_imbalance(off, 0, kWindow), 1.5) << "the skew did not make the loads imbalanced";
  EXPECT_LT(balanced, skewed);
  if (w->rank() == 0) {
    std::printf(
        "migration %s, skew %.2f, %d steps: %d migration(s), %d expert(s) moved, %.1f ms; imbalance over "
        "the last 10 steps %.3f without vs %.3f with; losses max relative difference %.3g (%s); gradient "
        "norms bitwise equal on %d of %d steps (clipped on %d)\n",
        strategy.c_str(), kSkew, steps, migrations, experts, seconds * 1e3, skewed, balanced, worst,
        bitwise ? "bitwise equal" : "not bitwise", norms_equal, steps, clipped);
  }
}

TEST(Migrate, Ep4SkewedRoutingSameLossesWithAndWithoutMigration) { expect_same_losses(kEp4, kSteps); }

// Two replicas of each expert (dp=4, ep=2) with ZeRO: the experts' moments (zero=1) and values (zero=3) are
// sharded over the replicas; a migration gathers them whole, moves the experts, and each replica keeps its shard.
TEST(Migrate, ZeroShardedExpertsSameLossesWithAndWithoutMigration) {
  expect_same_losses("dp=4,ep=2,zero=1,a2a=flat,microbatches=1,mbs=1", 15);
  expect_same_losses("dp=4,ep=2,zero=3,a2a=flat,microbatches=1,mbs=1", 15);
}

// MoE parallel folding with tp x ep: the ep groups are the tensor groups (dp2 x tp2 x ep2, fold=1), each tensor
// rank routes its own sequence slice, and the experts' ZeRO-1 shards span the plan's edp groups: every ep group
// makes the same move, each edp replica keeps its shard.
TEST(Migrate, FoldedTpEpSameLossesWithAndWithoutMigration) {
  expect_same_losses("dp=2,tp=2,sp=1,ep=2,fold=1,zero=1,a2a=flat,microbatches=1,mbs=1", 15);
}

// tp x ep unfolded (dp2 x tp2 x ep2, fold=0, sp=1): the ep groups span the two replicas at each tensor coordinate
// and both hold the same experts; the experts' ZeRO-1 shards span edp x tp (here the tensor group). Each tensor
// rank routes and counts its own sequence slice, so the planner sees every row (counted on tp rank 0 alone, this
// test fails on the routed rows: 32 of 64 per layer); both ep groups make the same move.
TEST(Migrate, UnfoldedTpEpSameLossesWithAndWithoutMigration) {
  expect_same_losses("dp=2,tp=2,sp=1,ep=2,zero=1,a2a=flat,microbatches=1,mbs=1", 15);
}

// Expert tensor parallelism (dp2 x tp2 x ep2, etp=2): each rank holds a slice of its experts; an ep group (one
// tensor coordinate, so one slice) moves its slices as whole experts are moved, and both ep groups make the same
// move (the load counts each gathered row once, on etp rank 0).
TEST(Migrate, EtpSameLossesWithAndWithoutMigration) {
  expect_same_losses("dp=2,tp=2,sp=1,ep=2,etp=2,zero=1,a2a=flat,microbatches=1,mbs=1", 15);
}

TEST(Migrate, BadOptionsAreRejected) {
  auto world = comm::mpi_world();
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  TrainOptions o = options(world->get(), true);
  o.strategy = "dp=4,microbatches=1,mbs=1";  // ep=1: nothing to migrate between
  auto t = Trainer::create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("has ep=1"), std::string::npos) << t.status().message();
  o = options(world->get(), true);
  o.migration.window_steps = 0;
  t = Trainer::create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("--migrate-window must be >= 1"), std::string::npos) << t.status().message();
  o = options(world->get(), true);
  o.migration.threshold = 0.5;
  t = Trainer::create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("--migrate-threshold"), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace piper::runtime::testing
