// Checkpoints across strategies (label mpi): tiny-moe trains 3 steps under strategy A (on the MPI world, or alone
// on rank 0), saves, and strategy B (on the world, or alone on every rank) resumes and trains 3 more. B's losses
// must equal steps 4..6 of an uninterrupted one-rank run within 1e-5 relative, and bit for bit when A == B (the
// same reduction order). A and B include tensor-parallel runs (tp=2 with sp). Run by CTest under mpiexec -n 2 or 4 with
// --gtest_filter (tests/runtime/CMakeLists.txt).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include "dist_test_util.h"
#include "piper/base/check.h"
#include "piper/comm/mpi/mpi_communicator.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/runtime/checkpoint/checkpoint.h"
#include "piper/runtime/trainer.h"
#include "piper/spec/model_loader.h"

namespace piper::runtime::testing {
namespace {

constexpr int kSteps = 3;
constexpr double kRelTol = 1e-5;
const char* const kOneRank = "microbatches=4,mbs=1";

// Expert balance knobs of every run of one test: a routing skew (imbalanced loads) and, on expert-parallel runs,
// live migration every window steps.
struct Balance {
  double skew = 0;
  int migrate_window = 0;  // 0 = off
};
Balance g_balance;
// What the last save wrote and the last resume adopted (expert-parallel runs).
std::map<int, std::vector<int>> g_saved_placement, g_resumed_placement;
int g_migrations = 0;

// Trains `strategy` for `steps` on `world` (nullptr: alone), resuming from / saving to a root when given.
std::vector<double> train(const std::string& strategy, comm::Communicator* world, int steps, const std::string& resume,
                          const std::string& save) {
  TrainOptions o = tiny_moe_options(strategy, 3e-3);
  o.ranks = world != nullptr ? world->size() : 1;
  o.world = world;
  o.model_options.router_skew = g_balance.skew;
  const bool expert_parallel = strategy.find("ep=") != std::string::npos;
  if (g_balance.migrate_window > 0 && expert_parallel) {
    o.migration.enabled = true;
    o.migration.window_steps = g_balance.migrate_window;
    o.migration.horizon_steps = 100;  // tiny-moe's moves pay only when counted over many steps
  }
  auto t = Trainer::create(o);
  EXPECT_TRUE(t.ok()) << strategy << ": " << t.status().to_string();
  if (!t.ok()) return {};
  if (!resume.empty()) {
    Status s = (*t)->resume(resume);
    EXPECT_TRUE(s.ok()) << strategy << ": " << s.to_string();
    if (!s.ok()) return {};
    EXPECT_EQ((*t)->steps_done(), kSteps);
    g_resumed_placement = (*t)->executor().expert_placement();
  }
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) {
    auto s = (*t)->step();
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return {};
    out.push_back(s->loss);
    if (s->migrated_experts > 0) ++g_migrations;
  }
  if (!save.empty()) {
    Status s = (*t)->save(save);
    EXPECT_TRUE(s.ok()) << strategy << ": " << s.to_string();
    g_saved_placement = (*t)->executor().expert_placement();
  }
  return out;
}

int ranks_of(const std::string& strategy) { return strategy == kOneRank ? 1 : 0; }

// Whether `rank` holds experts under `strategy` on the world: all but af-pipe's attention ranks.
bool holds_experts(const std::string& strategy, int rank) {
  auto s = Strategy::parse(strategy);
  PIPER_CHECK_OK(s.status());
  return !s->disaggregate || rank >= s->attn_ranks;
}

// A, saved after kSteps, resumed under B for kSteps more; against the uninterrupted one-rank run.
void expect_resume(const std::string& a, const std::string& b, bool bitwise = false) {
  auto world = comm::mpi_world();
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  comm::Communicator* w = world->get();
  // One directory for all ranks: rank 0's.
  const std::string mine =
      (std::filesystem::temp_directory_path() / ("piper_ckpt_mpi_" + std::to_string(::getpid()))).string();
  auto dirs = all_gather_strings(w, mine, 60);
  ASSERT_TRUE(dirs.ok()) << dirs.status().to_string();
  const std::string root = (*dirs)[0];

  const std::vector<double> ref =
      bitwise ? train(b, w, 2 * kSteps, "", "") : train(kOneRank, nullptr, 2 * kSteps, "", "");
  ASSERT_EQ(ref.size(), 2u * kSteps);
  if (ranks_of(a) == 1) {
    if (w->rank() == 0) train(a, nullptr, kSteps, "", root);
  } else {
    train(a, w, kSteps, "", root);
  }
  auto h = w->barrier();
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(w->wait(*h, 60).ok());
  // The index records the writer's placement table (expert-parallel writers), as the writer held it.
  auto reader = CheckpointReader::open(root);
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  const std::map<int, std::vector<int>> written = (*reader)->meta().expert_placement;
  if (ranks_of(a) == 0 && holds_experts(a, w->rank())) {
    EXPECT_EQ(written, g_saved_placement);
  }
  const std::vector<double> got = train(b, ranks_of(b) == 1 ? nullptr : w, kSteps, root, "");
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
  double worst = 0;
  for (int i = 0; i < kSteps; ++i) {
    const double want = ref[static_cast<size_t>(kSteps + i)];
    const double rel = std::abs(got[static_cast<size_t>(i)] - want) / std::abs(want);
    worst = std::max(worst, rel);
    if (bitwise) {
      EXPECT_EQ(got[static_cast<size_t>(i)], want) << "step " << kSteps + i + 1 << ": " << a << " -> " << b;
    } else {
      EXPECT_LE(rel, kRelTol) << "step " << kSteps + i + 1 << ": " << a << " -> " << b << " loss "
                              << got[static_cast<size_t>(i)] << " vs " << want;
    }
  }
  h = w->barrier();
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(w->wait(*h, 60).ok());
  // An expert-parallel reader adopts the written table (loading every slot's logical expert).
  if (!written.empty() && b.find("ep=") != std::string::npos && holds_experts(b, w->rank())) {
    EXPECT_EQ(g_resumed_placement, written);
  }
  if (w->rank() == 0) {
    std::filesystem::remove_all(root);
    std::printf("resume %s -> %s: steps %d..%d, max relative difference %.3g%s\n", a.c_str(), b.c_str(), kSteps + 1,
                2 * kSteps, worst, bitwise ? " (bitwise check)" : "");
  }
}

// 2 ranks.
TEST(Resume, SameStrategyIsBitwise) {
  expect_resume("dp=2,zero=1,microbatches=2,mbs=1", "dp=2,zero=1,microbatches=2,mbs=1", true);
}
TEST(Resume, Pp2ToDp2) { expect_resume("pp=2,schedule=1f1b,microbatches=4,mbs=1", "dp=2,microbatches=2,mbs=1"); }
TEST(Resume, Dp2Zero1ToPp2) {
  expect_resume("dp=2,zero=1,microbatches=2,mbs=1", "pp=2,schedule=zb-h1,microbatches=4,mbs=1");
}
TEST(Resume, OneRankToDp2Zero2) { expect_resume(kOneRank, "dp=2,zero=2,microbatches=2,mbs=1"); }
TEST(Resume, Dp2Zero2ToOneRank) { expect_resume("dp=2,zero=2,microbatches=2,mbs=1", kOneRank); }
// ZeRO-3: parameters and moments are saved as flat shards of each tensor and loaded into another layout.
TEST(Resume, Dp2Zero3ToPp2) {
  expect_resume("dp=2,zero=3,microbatches=2,mbs=1", "pp=2,schedule=zb-h1,microbatches=4,mbs=1");
}
TEST(Resume, OneRankToDp2Zero3) { expect_resume(kOneRank, "dp=2,zero=3,microbatches=2,mbs=1"); }
TEST(Resume, SameZero3IsBitwise) {
  expect_resume("dp=2,zero=3,microbatches=2,mbs=1", "dp=2,zero=3,microbatches=2,mbs=1", true);
}

// Tensor parallelism (tp=2 with sequence parallelism): slices saved by their place in the whole tensor (w_qkv
// as its Q, K and V row blocks), loaded whole by one rank, and the reverse; ZeRO-1 moment ranges into tp slices.
const char* const kTp2 = "tp=2,sp=1,microbatches=4,mbs=1";
TEST(Resume, Tp2ToOneRank) { expect_resume(kTp2, kOneRank); }
TEST(Resume, OneRankToTp2) { expect_resume(kOneRank, kTp2); }
TEST(Resume, Dp2Zero1ToTp2) { expect_resume("dp=2,zero=1,microbatches=2,mbs=1", kTp2); }
TEST(Resume, Tp2SameIsBitwise) { expect_resume(kTp2, kTp2, true); }

// 4 ranks.
TEST(Resume4, OneRankToDp2Pp2) { expect_resume(kOneRank, "dp=2,pp=2,schedule=1f1b,microbatches=2,mbs=1"); }
TEST(Resume4, Pp4ToOneRank) { expect_resume("pp=4,schedule=1f1b,microbatches=4,mbs=1", kOneRank); }
// Expert parallelism: every expert is saved under its logical index, so ep checkpoints load under any strategy.
TEST(Resume, Ep2ToOneRank) { expect_resume("dp=2,ep=2,a2a=flat,microbatches=2,mbs=1", kOneRank); }
TEST(Resume, OneRankToEp2) { expect_resume(kOneRank, "dp=2,ep=2,a2a=flat,microbatches=2,mbs=1"); }
// MoE parallel folding with tp x ep (fold=1): the tensor ranks of a replica hold different experts, whose ZeRO-1
// moments are sharded over the plan's edp groups; saved and loaded by their logical index as unfolded.
const char* const kFoldedTpEp = "dp=2,tp=2,sp=1,ep=2,fold=1,zero=1,a2a=flat,microbatches=2,mbs=1";
TEST(Resume4, FoldedTpEpToOneRank) { expect_resume(kFoldedTpEp, kOneRank); }
TEST(Resume4, OneRankToFoldedTpEp) { expect_resume(kOneRank, kFoldedTpEp); }
// af-pipe (2 attention + 2 FFN ranks, experts over ep=2 on the FFN side): the FFN ranks save their expert slices
// under the logical index like any expert-parallel run, so the checkpoint loads as one rank's, as plain ep=4, and
// as itself (bit for bit).
const char* const kAfPipeEp2 = "dp=2,ep=2,pp=1,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=2,microbatches=2,mbs=1";
TEST(Resume4, AfPipeEp2ToOneRank) { expect_resume(kAfPipeEp2, kOneRank); }
TEST(Resume4, OneRankToAfPipeEp2) { expect_resume(kOneRank, kAfPipeEp2); }
TEST(Resume4, AfPipeEp2ToEp4) { expect_resume(kAfPipeEp2, "dp=4,ep=4,a2a=flat,microbatches=1,mbs=1"); }
TEST(Resume4, AfPipeEp2SameIsBitwise) { expect_resume(kAfPipeEp2, kAfPipeEp2, true); }
// Expert tensor parallelism: each rank saves its slice of its experts' intermediate units (a box of the whole
// [num_experts, F, h] and [num_experts, h, F] tensors) and its ZeRO-1 shard of their moments; one rank, or tp x ep
// with whole experts (etp=1), resumes from it, and back.
const char* const kTpEpEtp2 = "dp=2,tp=2,sp=1,ep=2,etp=2,zero=1,a2a=flat,microbatches=2,mbs=1";
const char* const kTpEpEtp1 = "dp=2,tp=2,sp=1,ep=2,zero=1,a2a=flat,microbatches=2,mbs=1";
TEST(Resume4, Etp2ToOneRank) { expect_resume(kTpEpEtp2, kOneRank); }
TEST(Resume4, OneRankToEtp2) { expect_resume(kOneRank, kTpEpEtp2); }
TEST(Resume4, Etp2ToEtp1) { expect_resume(kTpEpEtp2, kTpEpEtp1); }
TEST(Resume4, Etp1ToEtp2) { expect_resume(kTpEpEtp1, kTpEpEtp2); }
// ... and without expert parallelism (ep=1): every rank holds a half-width slice of every expert.
TEST(Resume4, Etp2Ep1ToOneRank) { expect_resume("dp=2,tp=2,sp=1,etp=2,zero=1,microbatches=2,mbs=1", kOneRank); }
TEST(Resume4, Ep2ToEp4) {
  expect_resume("dp=4,ep=2,a2a=flat,microbatches=1,mbs=1", "dp=4,ep=4,a2a=flat,microbatches=1,mbs=1");
}

// A checkpoint written after experts migrated (skewed routing, a plan after every step) records the moved table;
// resuming under ep=4 adopts it, under one rank ignores it, and both continue with the uninterrupted losses.
// This is what a rank failing in a later migration falls back to: no expert is lost or duplicated.
bool is_identity(const std::map<int, std::vector<int>>& table) {
  for (const auto& [layer, slots] : table) {
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s] != static_cast<int>(s)) return false;
    }
  }
  return true;
}
void expect_migrated_resume(const std::string& b) {
  g_balance = Balance{0.3, 1};
  g_migrations = 0;
  g_saved_placement.clear();
  expect_resume("dp=4,ep=4,a2a=flat,microbatches=1,mbs=1", b);
  EXPECT_GE(g_migrations, 1) << "no migration before the save";
  EXPECT_FALSE(g_saved_placement.empty());
  EXPECT_FALSE(is_identity(g_saved_placement)) << "the checkpoint was written with the initial placement";
  g_balance = Balance{};
}
TEST(Resume4, MigratedEp4ToEp4) { expect_migrated_resume("dp=4,ep=4,a2a=flat,microbatches=1,mbs=1"); }
TEST(Resume4, MigratedEp4ToOneRank) { expect_migrated_resume(kOneRank); }

TEST(Resume4, Dp2Pp2Zero1ToPp4) {
  expect_resume("dp=2,pp=2,zero=1,schedule=1f1b,microbatches=2,mbs=1", "pp=4,schedule=zb-h1,microbatches=4,mbs=1");
}
TEST(Resume4, Dp2Tp2ToPp2Tp2) {
  expect_resume("dp=2,tp=2,sp=1,microbatches=2,mbs=1", "pp=2,tp=2,sp=1,schedule=1f1b,microbatches=4,mbs=1");
}

}  // namespace
}  // namespace piper::runtime::testing
