// Expert parallelism in the distributed runtime: tiny-moe with its experts sharded over the ep group (dispatch
// and combine all-to-alls, flat or HALO) gives the same losses as the single-rank reference, step by step,
// within 1e-5 relative, and the runtime's per-step expert load (tokens each expert received) equals the
// single-rank counts exactly. Rank 0 runs the reference and shares it; all ranks check.
// Run by CTest under mpiexec with --gtest_filter per strategy (tests/runtime/CMakeLists.txt).
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

constexpr int kSteps = 20;
constexpr double kRelTol = 1e-5;
constexpr int64_t kGlobalBatch = 4;  // sequences per step in every strategy below
// lr 3e-3 (the 10-step tests') spikes at step 17 on this tiny batch and amplifies reduction-order rounding past
// 1e-5 for every data-parallel strategy (dp=2 alone: 2.0e-5). 1e-3 trained smoothly for 20 steps on an AVX-512
// machine, but spikes at step 6 (gradient norm 3.4 -> 9.2, as tensor parallelism did there: dist_parity_mpi_test.cc
// kTpLr) on an AVX2 one (OpenBLAS's Haswell kernels), where an expert GEMM over rows gathered from two ranks rounds
// differently from one rank's (2.5e-8 through step 5) and a near-tied token then changes experts: 2.1e-4 at step 6
// (session 38). 5e-4 stays within 2.9e-8 over the 20 steps there.
constexpr double kLr = 5e-4;

TrainOptions options(const std::string& strategy) { return tiny_moe_options(strategy, kLr); }

// mem_ratio (optional): the rank's peak memory over the run / the resource model's for its stage.
std::vector<TrainStepStats> run(const TrainOptions& o, int steps, double* mem_ratio = nullptr) {
  auto t = Trainer::create(o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (!t.ok()) return {};
  std::vector<TrainStepStats> out = train_steps(**t, steps);
  if (mem_ratio != nullptr) {
    *mem_ratio = static_cast<double>((*t)->memory().peak_total_bytes) / (*t)->predicted_rank_memory().total();
  }
  return out;
}

// Rank 0's reference (losses and expert loads) on every rank, shaped like `got` (the same on every rank).
std::vector<TrainStepStats> share_reference(comm::Communicator& world, const std::vector<TrainStepStats>& mine,
                                            const std::vector<TrainStepStats>& got) {
  std::vector<double> flat;
  for (size_t i = 0; i < got.size(); ++i) {
    flat.push_back(world.rank() == 0 ? mine[i].loss : 0.0);
    for (const auto& [layer, tokens] : got[i].expert_tokens) {
      for (size_t e = 0; e < tokens.size(); ++e) {
        const auto it = world.rank() == 0 ? mine[i].expert_tokens.find(layer) : mine[i].expert_tokens.end();
        flat.push_back(it != mine[i].expert_tokens.end() && e < it->second.size() ? static_cast<double>(it->second[e])
                                                                                  : -1.0);
      }
    }
  }
  std::vector<double> all(flat.size() * static_cast<size_t>(world.size()));
  auto h = world.all_gather(flat.data(), all.data(), flat.size() * sizeof(double));
  EXPECT_TRUE(h.ok());
  if (!h.ok() || !world.wait(*h, 120).ok()) return {};
  std::vector<TrainStepStats> ref(got.size());
  size_t at = 0;  // rank 0's block comes first
  for (size_t i = 0; i < got.size(); ++i) {
    ref[i].loss = all[at++];
    for (const auto& [layer, tokens] : got[i].expert_tokens) {
      for (size_t e = 0; e < tokens.size(); ++e) ref[i].expert_tokens[layer].push_back(static_cast<int64_t>(all[at++]));
    }
  }
  return ref;
}

// `strategy` on the world (ranks_per_node world ranks per emulated node; 0 = default) against `reference` on
// one rank (rank 0 runs it while the others wait, so the cores are not shared by R references).
void expect_parity(const std::string& strategy, const std::string& reference, int ranks_per_node = 0) {
  auto world = comm::mpi_world();
  ASSERT_TRUE(world.ok()) << world.status().to_string();
  TrainOptions o = options(strategy);
  o.ranks = (*world)->size();
  o.world = world->get();
  o.ranks_per_node = ranks_per_node;
  double mem_ratio = 0;
  const std::vector<TrainStepStats> got = run(o, kSteps, &mem_ratio);
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
  // Peak memory within 10 % of the resource model's prediction for this rank's stage (as dist_parity_mpi_test).
  EXPECT_NEAR(mem_ratio, 1.0, 0.10) << strategy << " rank " << (*world)->rank() << ": peak memory / model";
  std::printf("parity %s rank %d: peak memory x%.3f of the model\n", strategy.c_str(), (*world)->rank(), mem_ratio);
  const std::vector<TrainStepStats> mine =
      (*world)->rank() == 0 ? run(options(reference), kSteps) : std::vector<TrainStepStats>(kSteps);
  ASSERT_EQ(mine.size(), static_cast<size_t>(kSteps));
  const std::vector<TrainStepStats> ref = share_reference(**world, mine, got);
  ASSERT_EQ(ref.size(), got.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double rel = std::abs(got[i].loss - ref[i].loss) / std::abs(ref[i].loss);
    worst = std::max(worst, rel);
    if (std::getenv("PIPER_TEST_VERBOSE") && (*world)->rank() == 0) {
      std::printf("step %zu loss %.9f ref %.9f rel %.3g\n", i + 1, got[i].loss, ref[i].loss, rel);
    }
    EXPECT_LE(rel, kRelTol) << "step " << i + 1 << ": " << strategy << " loss " << got[i].loss << " vs one rank "
                            << ref[i].loss;
    // The expert load is an integer count of the same routing decisions: equal, and every slot counted once.
    EXPECT_EQ(got[i].expert_tokens, ref[i].expert_tokens) << "step " << i + 1;
    ASSERT_FALSE(got[i].expert_tokens.empty());
    for (const auto& [layer, tokens] : got[i].expert_tokens) {
      int64_t sum = 0;
      for (int64_t v : tokens) sum += v;
      EXPECT_EQ(sum, kGlobalBatch * o.seq_len * o.model.moe.top_k) << "layer " << layer;
    }
  }
  if ((*world)->rank() == 0) {
    std::printf("parity %s: %d steps, loss %.6f -> %.6f, max relative difference %.3g\n", strategy.c_str(), kSteps,
                got.front().loss, got.back().loss, worst);
  }
}

TEST(EpParity, Ep2Flat) { expect_parity("dp=2,ep=2,a2a=flat,microbatches=2,mbs=1", "microbatches=4,mbs=1"); }
// Two emulated nodes of one rank: a token whose two experts sit on the other rank crosses once.
TEST(EpParity, Ep2Halo) { expect_parity("dp=2,ep=2,a2a=halo,microbatches=2,mbs=1", "microbatches=4,mbs=1", 1); }
TEST(EpParity, Ep4Flat) { expect_parity("dp=4,ep=4,a2a=flat,microbatches=1,mbs=1", "microbatches=4,mbs=1"); }
// Two emulated nodes of two ranks each.
TEST(EpParity, Ep4Halo) { expect_parity("dp=4,ep=4,a2a=halo,microbatches=1,mbs=1", "microbatches=4,mbs=1", 2); }
// Two expert-data-parallel replicas of each expert (dp=4, ep=2): expert gradients all-reduced over edp.
TEST(EpParity, Dp4Ep2) { expect_parity("dp=4,ep=2,a2a=flat,microbatches=1,mbs=1", "microbatches=4,mbs=1"); }

// Pipeline and expert parallelism: the combine's output crosses to the next stage, the gradient comes back into
// the combine's backward.
TEST(EpParity, Pp2Ep2) { expect_parity("pp=2,dp=2,ep=2,schedule=1f1b,microbatches=2,mbs=1", "microbatches=4,mbs=1"); }

// The experts chunk of ep rank 1 of 2 holds experts [4, 8) of tiny-moe's 8: the whole model's slices, bit for bit.
TEST(EpModel, ExpertShardIsSliceOfWholeModel) {
  const ModelSpec spec = load_model("tiny-moe").value();
  auto whole = Model::create(spec, {}, 1234, nullptr);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  ModelOptions shard_options;
  shard_options.expert_ranks = 2;
  shard_options.expert_rank = 1;
  auto shard = Model::create(spec, shard_options, 1234, nullptr);
  ASSERT_TRUE(shard.ok()) << shard.status().to_string();
  const int layer = 1;
  Chunk* a = (*whole)->find(layer, Part::kExperts);
  Chunk* b = (*shard)->find(layer, Part::kExperts);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(a->params().size(), b->params().size());
  for (size_t i = 0; i < a->params().size(); ++i) {
    const Tensor& full = a->params()[i].value;
    const Tensor& part = b->params()[i].value;
    ASSERT_EQ(part.numel() * 2, full.numel()) << a->params()[i].name;
    for (int64_t j = 0; j < part.numel(); ++j) ASSERT_EQ(part.data()[j], full.data()[full.numel() / 2 + j]);
  }
  // Anything but the experts chunk is whole.
  EXPECT_EQ((*shard)->find(layer, Part::kRouter)->params()[1].value.numel(),
            (*whole)->find(layer, Part::kRouter)->params()[1].value.numel());
  ModelOptions bad;
  bad.expert_ranks = 3;  // does not divide 8
  auto rejected = Model::create(spec, bad, 1234, nullptr);
  ASSERT_FALSE(rejected.ok());
  EXPECT_NE(rejected.status().message().find("pick ep dividing num_experts"), std::string::npos)
      << rejected.status().message();
}

// Bad HALO layouts fail at create() with the reason, on every rank, before any rank blocks.
TEST(EpErrors, RanksPerNodeMustDivideTheWorld) {
  auto world = comm::mpi_world();
  ASSERT_TRUE(world.ok());
  TrainOptions o = options("dp=2,ep=2,a2a=halo,microbatches=2,mbs=1");
  o.ranks = (*world)->size();
  o.world = world->get();
  o.ranks_per_node = 3;
  auto t = Trainer::create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("ranks per node 3 does not divide"), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace piper::runtime::testing
