// The simulator executes disaggregated attention/FFN (af-pipe) plans: an m2n to or from the experts spreads the
// sender's rows over the ep ranks of its block on the other side (CommTemplates::m2n, add_m2n), other m2n are
// point-to-point; the representative simulation equals the full one.
#include <gtest/gtest.h>

#include "piper/base/check.h"
#include "piper/compile/compile.h"
#include "piper/sim/comm_templates.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "test_clusters.h"

namespace piper::sim {
namespace {

Strategy strategy(const std::string& text) {
  auto s = Strategy::parse(text);
  PIPER_CHECK_OK(s.status());
  return *s;
}

constexpr const char* kAf = "dp=4,ep=2,pp=1,schedule=af-pipe,disagg=1,attn_ranks=4,ffn_ranks=4,microbatches=2";

TEST(SimAfPipe, RoutedM2nSpreadsOverTheEpBlock) {
  ModelSpec m = load_model("tiny-moe").value();
  Strategy s = strategy(kAf);
  TrainSpec t;
  t.seq_len = 128;
  t.global_batch = s.global_batch();
  auto compiled = compile::compile_strategy(m, t, s);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  Network net = Network::build(testing::make_cluster(2, 4, 100e9, 2, 5e9, 2e-6, 5e-6)).value();
  for (bool reduced : {false, true}) {
    auto tmpl = CommTemplates::create(net, compiled->plan, reduced);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
    // Attention rank 1 (dp 1, ep block {0, 1}) to the FFN pipeline rank: half its payload to FFN ranks 4 and 5.
    auto a = tmpl->m2n(1, 1);
    ASSERT_TRUE(a.ok()) << a.status().message();
    auto p = tmpl->p2p(1, 5);
    ASSERT_TRUE(p.ok()) << p.status().message();
    if (!reduced) {
      ASSERT_EQ((*a)->flows.size(), 2u);
      for (const auto& f : (*a)->flows) EXPECT_DOUBLE_EQ(f.bytes, 0.5);
      ASSERT_EQ((*p)->flows.size(), 1u);
      EXPECT_DOUBLE_EQ((*p)->flows[0].bytes, 1.0);
    }
  }
}

TEST(SimAfPipe, RepresentativeRanksEqualTheFullSimulation) {
  ModelSpec m = load_model("tiny-moe").value();
  ClusterSpec c = testing::make_cluster(2, 4, 100e9, 2, 5e9, 2e-6, 5e-6);
  c.device = load_cluster("dgx-h100", 1).value().device;
  Strategy s = strategy(kAf);
  TrainSpec t;
  t.seq_len = 512;
  SimOptions reduced, full;
  full.full = true;
  auto a = simulate(m, c, t, s, {}, reduced);
  auto b = simulate(m, c, t, s, {}, full);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(a->sim.ranks.size(), 2u);  // one attention, one FFN representative
  EXPECT_EQ(b->sim.ranks.size(), 8u);
  EXPECT_GT(a->step_time_s, 0);
  EXPECT_NEAR(a->step_time_s, b->step_time_s, 1e-6 * b->step_time_s);
  for (const RankStats& k : b->sim.ranks) {
    const RankStats& rep = a->sim.ranks[static_cast<size_t>(k.pp_rank)];
    EXPECT_GT(k.busy_s, 0) << "rank " << k.rank;
    EXPECT_EQ(k.peak_bytes, rep.peak_bytes) << "rank " << k.rank;
  }
}

}  // namespace
}  // namespace piper::sim
