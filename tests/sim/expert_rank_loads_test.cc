// SimOptions::expert_loads (sim/expert_rank_loads.h): a simulation of every rank prices each ep rank's experts from
// its own measured share of the routed tokens, time and memory. Checked against the same plan simulated balanced:
// a rank at load 1 is the balanced rank to the byte and the second; at load 0 its experts buffers and compute are
// gone; at load 2 its experts buffers are twice the balanced ones. The representative simulation prices the busiest.
#include "piper/sim/expert_rank_loads.h"

#include <gtest/gtest.h>

#include <string>

#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::sim {
namespace {

struct Scene {
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
  Strategy strategy;
};

// dp=8 over ep=4: ranks r and r + 4 are ep rank r.
Scene tiny_moe_ep4() {
  Scene s;
  s.model = load_model("tiny-moe").value();
  s.cluster = load_cluster("dgx-h100", 1).value();
  s.train.seq_len = 128;
  s.strategy = Strategy::parse("dp=8,ep=4,microbatches=1,mbs=2").value();
  s.train.global_batch = s.strategy.global_batch();
  return s;
}

// tiny-moe's MoE layers 1..3: ep rank r at loads[r] in every layer.
balance::RankLoads loads_of(const std::vector<double>& per_rank) {
  balance::RankLoads l;
  l.ep = static_cast<int>(per_rank.size());
  for (int layer = 1; layer <= 3; ++layer) {
    l.layers.push_back(layer);
    l.factor.push_back(per_rank);
  }
  return l;
}

// The bytes of the plan's experts stash of one pipeline rank (one microbatch's, all live at the end of its
// forward), and of the working set of the last MoE layer's experts backward, the first to run.
int64_t experts_stash_bytes(const compile::Program& prog) {
  int64_t sum = 0;
  for (const auto& [id, b] : experts_buffers(prog)) sum += b.backward ? 0 : b.bytes;
  return sum;
}
int64_t last_experts_working_set(const compile::Program& prog) {
  for (const auto& [id, b] : experts_buffers(prog))
    if (b.backward && b.layer == 3) return b.bytes;
  return 0;
}

TEST(ExpertRankLoadsTest, EachRankPricedFromItsOwnShare) {
  const Scene s = tiny_moe_ep4();
  SimOptions full;
  full.full = true;
  full.plan_hash = false;
  const SimReport balanced = simulate(s.model, s.cluster, s.train, s.strategy, {}, full).value();
  SimOptions loaded = full;
  loaded.expert_loads.loads = loads_of({2.0, 1.0, 0.0, 1.0});
  const SimReport r = simulate(s.model, s.cluster, s.train, s.strategy, {}, loaded).value();
  ASSERT_EQ(r.sim.ranks.size(), 8u);
  const compile::Program& prog = balanced.compiled.plan.program(0);
  const auto buffers = experts_buffers(prog);
  EXPECT_EQ(buffers.size(), 6u);  // 3 MoE layers x 1 microbatch: the stash and the backward's working set
  const int64_t stash = experts_stash_bytes(prog), working = last_experts_working_set(prog);
  ASSERT_GT(stash, 0);
  ASSERT_GT(working, 0);
  const int64_t base = balanced.sim.ranks[1].peak_bytes;
  EXPECT_EQ(r.sim.ranks[1].peak_bytes, base);  // load 1: the balanced rank
  EXPECT_EQ(r.sim.ranks[3].peak_bytes, base);
  // The peak is the last layer's experts backward, every experts stash live: load 2 holds them and that working set
  // twice; load 0 none of them (its peak moves to another task, whose own working set is at most that one).
  EXPECT_EQ(r.sim.ranks[0].peak_bytes, base + stash + working);
  EXPECT_LE(r.sim.ranks[2].peak_bytes, base - stash);
  EXPECT_GE(r.sim.ranks[2].peak_bytes, base - stash - working);
  // (busy time sums the intervals between events, which the other ranks' times move: equal up to rounding)
  EXPECT_NEAR(r.sim.ranks[1].busy_s, balanced.sim.ranks[1].busy_s, 1e-12 * balanced.sim.ranks[1].busy_s);
  EXPECT_GT(r.sim.ranks[0].busy_s, balanced.sim.ranks[0].busy_s);
  EXPECT_LT(r.sim.ranks[2].busy_s, balanced.sim.ranks[2].busy_s);
  EXPECT_GT(r.step_time_s, balanced.step_time_s);  // the others wait for rank 0 at the all-to-alls
}

TEST(ExpertRankLoadsTest, TheBusiestRankOfAFullSimulationIsTheRepresentativeOne) {
  const Scene s = tiny_moe_ep4();
  cost::Calibration busiest;
  busiest.expert_load_imbalance = 4.0;  // every layer: all tokens on ep rank 0
  SimOptions rep;
  rep.plan_hash = false;
  const SimReport one = simulate(s.model, s.cluster, s.train, s.strategy, busiest, rep).value();
  SimOptions full = rep;
  full.full = true;
  full.expert_loads.loads = loads_of({4.0, 0.0, 0.0, 0.0});
  full.expert_loads.plan_load = 4.0;  // simulate() sizes the plan's experts buffers for the calibration's load
  const SimReport all = simulate(s.model, s.cluster, s.train, s.strategy, busiest, full).value();
  ASSERT_EQ(one.sim.ranks.size(), 1u);
  EXPECT_EQ(all.sim.ranks[0].peak_bytes, one.sim.ranks[0].peak_bytes);
  EXPECT_DOUBLE_EQ(all.sim.ranks[0].busy_s, one.sim.ranks[0].busy_s);
  EXPECT_LT(all.sim.ranks[1].peak_bytes, one.sim.ranks[0].peak_bytes);
  // Balanced experts: the representative rank's buffers are a quarter of the busiest one's.
  const SimReport flat = simulate(s.model, s.cluster, s.train, s.strategy, {}, rep).value();
  // The stash is all per routed row; the working set's per-token part (dout, the residual's gradient) is not.
  const compile::Program& flat_prog = flat.compiled.plan.program(0);
  const int64_t more_working =
      last_experts_working_set(one.compiled.plan.program(0)) - last_experts_working_set(flat_prog);
  EXPECT_GT(more_working, 0);
  EXPECT_NEAR(static_cast<double>(one.sim.ranks[0].peak_bytes - flat.sim.ranks[0].peak_bytes),
              3.0 * experts_stash_bytes(flat_prog) + more_working, 8.0);
}

TEST(ExpertRankLoadsTest, LoadStepsAreTheStepsFromTheFirstEvenlySpaced) {
  ExpertRankLoads l;
  EXPECT_TRUE(load_steps(l).empty());  // off
  l.loads = loads_of({1, 1, 1, 1});
  EXPECT_TRUE(load_steps(l).empty());  // no per-step loads
  l.loads.step_factor.assign(5, l.loads.factor);
  EXPECT_EQ(load_steps(l), (std::vector<size_t>{0, 1, 2, 3, 4}));
  l.first_step = 1;
  EXPECT_EQ(load_steps(l), (std::vector<size_t>{1, 2, 3, 4}));
  l.first_step = 5;
  EXPECT_TRUE(load_steps(l).empty());
  l.first_step = 1;
  l.loads.step_factor.assign(1 + 2 * kMaxLoadSteps, l.loads.factor);
  const std::vector<size_t> spaced = load_steps(l);
  ASSERT_EQ(spaced.size(), kMaxLoadSteps);
  for (size_t k = 0; k < spaced.size(); ++k) EXPECT_EQ(spaced[k], 1 + 2 * k);
}

// Two steps whose busiest rank changes: the run's mean loads are balanced, but each step waits for its busiest rank
// at every all-to-all. Simulated step by step, the time is the mean of the two steps' own simulations, above the
// mean loads' (here balanced); memory and the timeline stay the mean loads' simulation's.
TEST(ExpertRankLoadsTest, PerStepLoadsTimeEachStepFromItsOwnBusiestRank) {
  const Scene s = tiny_moe_ep4();
  SimOptions mean;
  mean.full = true;
  mean.plan_hash = false;
  mean.expert_loads.loads = loads_of({1.0, 1.0, 1.0, 1.0});
  const SimReport balanced = simulate(s.model, s.cluster, s.train, s.strategy, {}, mean).value();
  EXPECT_TRUE(balanced.sim.load_step_times_s.empty());
  SimOptions each_step = mean;
  const std::vector<std::vector<double>> first(3, {2.0, 0.0, 1.0, 1.0}), second(3, {0.0, 2.0, 1.0, 1.0});
  each_step.expert_loads.loads.step_factor = {first, second};
  const SimReport per_step = simulate(s.model, s.cluster, s.train, s.strategy, {}, each_step).value();
  SimOptions mean_only = each_step;  // first_step past the last: the mean loads alone, peaks from the busiest step
  mean_only.expert_loads.first_step = 2;
  const SimReport mean_loads = simulate(s.model, s.cluster, s.train, s.strategy, {}, mean_only).value();
  EXPECT_TRUE(mean_loads.sim.load_step_times_s.empty());
  EXPECT_DOUBLE_EQ(mean_loads.step_time_s, balanced.step_time_s);
  SimOptions one = mean;
  one.expert_loads.loads = loads_of({2.0, 0.0, 1.0, 1.0});
  const SimReport step0 = simulate(s.model, s.cluster, s.train, s.strategy, {}, one).value();
  one.expert_loads.loads = loads_of({0.0, 2.0, 1.0, 1.0});
  const SimReport step1 = simulate(s.model, s.cluster, s.train, s.strategy, {}, one).value();
  ASSERT_EQ(per_step.sim.load_step_times_s.size(), 2u);
  EXPECT_DOUBLE_EQ(per_step.sim.load_step_times_s[0], step0.step_time_s);
  EXPECT_DOUBLE_EQ(per_step.sim.load_step_times_s[1], step1.step_time_s);
  EXPECT_DOUBLE_EQ(per_step.step_time_s, 0.5 * (step0.step_time_s + step1.step_time_s));
  EXPECT_GT(per_step.step_time_s, balanced.step_time_s);
  for (size_t r = 0; r < per_step.sim.ranks.size(); ++r) {
    EXPECT_NEAR(per_step.sim.ranks[r].busy_s, 0.5 * (step0.sim.ranks[r].busy_s + step1.sim.ranks[r].busy_s),
                1e-12 * per_step.step_time_s)
        << r;
    EXPECT_EQ(per_step.sim.ranks[r].peak_bytes, mean_loads.sim.ranks[r].peak_bytes) << r;
  }
  // From the second step on (train's own loads leave the first out, as its measured time does): that step alone.
  each_step.expert_loads.first_step = 1;
  const SimReport from_second = simulate(s.model, s.cluster, s.train, s.strategy, {}, each_step).value();
  EXPECT_DOUBLE_EQ(from_second.step_time_s, step1.step_time_s);
}

TEST(ExpertRankLoadsTest, RefusesLoadsItCannotApply) {
  const Scene s = tiny_moe_ep4();
  SimOptions o;
  o.expert_loads.loads = loads_of({1, 1, 1, 1});
  auto rep = simulate(s.model, s.cluster, s.train, s.strategy, {}, o);  // representative ranks
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.status().message().find("need every rank simulated"), std::string::npos) << rep.status().message();
  o.full = true;
  o.expert_loads.loads = loads_of({1, 1});
  auto ep = simulate(s.model, s.cluster, s.train, s.strategy, {}, o);
  ASSERT_FALSE(ep.ok());
  EXPECT_NE(ep.status().message().find("ep=2, the plan has ep=4"), std::string::npos) << ep.status().message();
  o.expert_loads.loads = loads_of({1, 1, 1, 1});
  o.expert_loads.loads.step_factor = {{{1, 1, 1, 1}, {1, 1, 1}, {1, 1, 1, 1}}};  // layer 2 lacks a rank
  auto shape = simulate(s.model, s.cluster, s.train, s.strategy, {}, o);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("step 0 are not one factor per ep rank"), std::string::npos)
      << shape.status().message();
}

}  // namespace
}  // namespace piper::sim
