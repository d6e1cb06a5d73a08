// af-pipe's NIC split (Strategy::attn_ports, ffn_ports; cost/nic_split.h) in the simulator and the closed form:
// the natural split prices exactly as no split, moving ports away from a group whose NICs carry the exchange slows
// the step by the bandwidth it loses, and the closed form follows the simulator.
#include <gtest/gtest.h>

#include <string>

#include "piper/cost/estimate.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::sim {
namespace {

struct Steps {
  double sim = 0, est = 0;
  SimResult detail;
};

// deepseek-moe-16b on 4 H800 nodes (8 GPUs and 8 NICs each), seq 4096.
Steps run(const std::string& strategy) {
  Steps out;
  auto m = load_model("deepseek-moe-16b");
  auto c = load_cluster("h800", 4);
  auto s = Strategy::parse(strategy);
  EXPECT_TRUE(m.ok() && c.ok() && s.ok()) << strategy;
  if (!m.ok() || !c.ok() || !s.ok()) return out;
  TrainSpec t;
  t.seq_len = 4096;
  t.global_batch = s->dp * s->microbatches * s->mbs;
  t.micro_batch_size = s->mbs;
  auto r = simulate(*m, *c, t, *s);
  EXPECT_TRUE(r.ok()) << strategy << ": " << r.status().to_string();
  auto cm = cost::CostModel::create(*m, *c, t);
  EXPECT_TRUE(cm.ok());
  if (!r.ok() || !cm.ok()) return out;
  auto e = cm->estimate(*s);
  EXPECT_TRUE(e.ok()) << strategy << ": " << e.status().to_string();
  if (!e.ok()) return out;
  out.sim = r->step_time_s;
  out.est = e->step_time_s;
  out.detail = r->sim;
  return out;
}

const std::string kEven = "dp=16,ep=16,zero=1,schedule=af-pipe,microbatches=8,disagg=1,attn_ranks=16,ffn_ranks=16";

TEST(AfNicSplit, NaturalSplitIsNoSplit) {
  const Steps none = run(kEven);
  const Steps natural = run(kEven + ",attn_ports=16,ffn_ports=16");
  ASSERT_GT(none.sim, 0);
  EXPECT_EQ(natural.sim, none.sim);
  EXPECT_EQ(natural.est, none.est);
}

TEST(AfNicSplit, TakingPortsFromAGroupSlowsItsExchange) {
  const Steps even = run(kEven);
  const Steps less_attn = run(kEven + ",attn_ports=8,ffn_ports=24");
  const Steps less_ffn = run(kEven + ",attn_ports=24,ffn_ports=8");
  ASSERT_GT(even.sim, 0);
  // Both groups send and receive the same bytes per rank, so halving either side's ports slows the step, and the
  // two directions price alike.
  EXPECT_GT(less_attn.sim, even.sim);
  EXPECT_GT(less_ffn.sim, even.sim);
  EXPECT_NEAR(less_attn.sim / less_ffn.sim, 1.0, 0.05);
  EXPECT_GT(less_attn.est, even.est);
  // One attention pipeline rank: the combine is routed (top_k rows), which the closed form's serial round trip
  // over-charges (afpipe_closed_form_test.cc): 1.16 since session 23.
  for (const Steps* s : {&even, &less_attn, &less_ffn}) EXPECT_NEAR(s->est / s->sim, 1.0, 0.2);
}

}  // namespace
}  // namespace piper::sim
