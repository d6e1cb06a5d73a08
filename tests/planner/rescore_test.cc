// planner::rescore_with_simulator: the best plans re-ordered by simulated step time, the local search on
// simulated times, budgets, and bad inputs.
#include "piper/planner/rescore.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "piper/base/check.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::planner {
namespace {

struct Case {
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
};

Case load_case(const std::string& model, const std::string& cluster, int nodes, int64_t global_batch, int seq_len) {
  auto m = load_model(model);
  auto c = load_cluster(cluster, nodes);
  PIPER_CHECK(m.ok() && c.ok(), "test presets must load");
  TrainSpec t;
  t.global_batch = global_batch;
  t.seq_len = seq_len;
  return {*m, *c, t};
}

Case tiny_moe() { return load_case("tiny-moe", "local-cpu", 1, 8, 128); }

TEST(RescoreTest, NeighboursDifferFromTheStrategyAndAreDistinct) {
  auto s = Strategy::parse("dp=2,tp=1,pp=1,ep=2,zero=1,recompute=none,schedule=1f1b,microbatches=2,mbs=2");
  ASSERT_TRUE(s.ok());
  auto n = neighbours(*s);
  ASSERT_FALSE(n.empty());
  for (size_t i = 0; i < n.size(); ++i) {
    EXPECT_FALSE(n[i] == *s) << n[i].to_string();
    for (size_t j = i + 1; j < n.size(); ++j) EXPECT_FALSE(n[i] == n[j]) << n[i].to_string();
    EXPECT_EQ(n[i].global_batch(), s->global_batch()) << n[i].to_string();
  }
  auto has = [&](const std::string& needle) {
    return std::any_of(n.begin(), n.end(), [&](const Strategy& x) { return x.to_string() == needle; });
  };
  Strategy halo = *s;
  halo.a2a = "halo";
  EXPECT_TRUE(has(halo.to_string()));
  Strategy bigger = *s;
  bigger.mbs = 4;
  bigger.microbatches = 1;
  EXPECT_TRUE(has(bigger.to_string()));
}

// A fake simulator that prefers exactly one plan the closed form ranks last: the list must follow it.
TEST(RescoreTest, OrderFollowsTheSimulatedStepTime) {
  Case c = tiny_moe();
  SearchOptions o;
  o.top_k = 4;
  o.verify = false;
  auto closed = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(closed.ok()) << closed.status().message();
  ASSERT_EQ(closed->top.size(), 4u);
  const std::string favourite = closed->top.back().strategy.to_string();
  o.simulate_top = 4;
  o.simulator = [&](const Strategy& s, const TrainSpec&) -> Result<double> {
    return s.to_string() == favourite ? 0.001 : 1.0 + static_cast<double>(s.to_string().size()) * 1e-6;
  };
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->top.size(), 4u);
  EXPECT_EQ(r->top.front().strategy.to_string(), favourite);
  EXPECT_EQ(r->stats.simulated, 4);
  for (size_t i = 1; i < r->top.size(); ++i) {
    ASSERT_TRUE(r->top[i].simulated);
    EXPECT_LE(r->top[i - 1].sim_step_time_s, r->top[i].sim_step_time_s);
  }
}

// The local search walks to a neighbour the fake simulator likes better, and only simulates what fits.
TEST(RescoreTest, LocalSearchFindsTheFasterNeighbour) {
  Case c = tiny_moe();
  SearchOptions o;
  o.top_k = 3;
  o.verify = true;  // with the fake verifier below
  o.simulate_top = 1;
  o.local_search_steps = 40;
  // The fake's ratios of simulated to closed-form step time break the stopping rule's assumption (rescore.h
  // SimRatioBound): a plan twice as fast as the closed form says. Walk without the bound.
  o.rescore_bound = false;
  SearchOptions closed_form = o;
  closed_form.simulate_top = 0;
  closed_form.local_search_steps = 0;
  auto closed = search(c.model, c.cluster, c.train, closed_form);
  ASSERT_TRUE(closed.ok() && !closed->top.empty());
  const int z0 = closed->top.front().strategy.zero;
  std::mutex mu;
  std::vector<std::string> asked;
  o.simulator = [&](const Strategy& s, const TrainSpec&) -> Result<double> {
    std::lock_guard<std::mutex> lock(mu);
    asked.push_back(s.to_string());
    return s.zero != z0 ? 0.5 : 1.0;  // any other ZeRO stage is "faster"
  };
  o.verifier = [](const Strategy&, const TrainSpec&) {
    Verification v;
    v.ok = true;
    return v;
  };
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->top.empty());
  EXPECT_NE(r->top.front().strategy.zero, z0) << r->top.front().strategy.to_string();
  EXPECT_EQ(r->top.front().sim_step_time_s, 0.5);
  EXPECT_EQ(r->top.front().origin, "local-search");
  EXPECT_TRUE(r->top.front().verified);
  EXPECT_GE(r->stats.local_search_improved, 1);
  EXPECT_GE(r->stats.local_search_tried, 1);
  EXPECT_LE(r->stats.local_search_tried, 40);
  EXPECT_EQ(r->stats.simulated, static_cast<int64_t>(asked.size()));
  EXPECT_LE(r->top.size(), 3u);
}

// The real simulator on this machine's cluster: every returned plan verifies and is simulated, best first.
TEST(RescoreTest, RealSimulatorOnTinyMoe) {
  Case c = tiny_moe();
  SearchOptions o;
  o.top_k = 3;
  o.simulate_top = 3;
  o.local_search_steps = 4;
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->top.empty());
  EXPECT_GE(r->stats.simulated, 3);
  for (size_t i = 0; i < r->top.size(); ++i) {
    const Plan& p = r->top[i];
    EXPECT_TRUE(p.verified) << p.strategy.to_string();
    ASSERT_TRUE(p.simulated) << p.strategy.to_string() << ": " << p.sim_error;
    EXPECT_GT(p.sim_step_time_s, 0);
    if (i > 0) {
      EXPECT_LE(r->top[i - 1].sim_step_time_s, p.sim_step_time_s);
    }
  }
  const Json j = r->top.front().to_json();
  EXPECT_TRUE(j["simulated"].get<bool>());
  EXPECT_GT(j["simulated_step_time_s"].get<double>(), 0);
  EXPECT_GE(r->stats.to_json()["simulated"].get<int64_t>(), 3);
}

TEST(SimRatioBoundTest, SmallestRatioTimesTheClosedForm) {
  SimRatioBound b;
  EXPECT_FALSE(b.known());
  EXPECT_EQ(b.lower_bound_s(10.0), 0.0);  // nothing observed: nothing is ruled out
  EXPECT_TRUE(b.may_beat(1e9, 1e-9));
  b.observe(2.0, 3.0);  // 1.5
  b.observe(4.0, 8.0);  // 2.0
  b.observe(0.0, 5.0);  // no closed form: ignored
  b.observe(3.0, -1.0);
  ASSERT_TRUE(b.known());
  EXPECT_DOUBLE_EQ(b.min_ratio(), 1.5);
  EXPECT_DOUBLE_EQ(b.lower_bound_s(10.0), 15.0);
  EXPECT_TRUE(b.may_beat(9.99, 15.0));
  EXPECT_FALSE(b.may_beat(10.0, 15.0));  // a tie cannot beat the best
  b.observe(10.0, 12.0);                 // 1.2: the bound only ever loosens
  EXPECT_DOUBLE_EQ(b.min_ratio(), 1.2);
}

// The closed form of every neighbour of `s` that the local search would simulate (validates, fits), by strategy.
std::map<std::string, double> fitting_neighbour_closed_forms(const Case& c, const Strategy& s, const SearchOptions& o) {
  std::map<std::string, double> out;
  for (const Strategy& n : neighbours(s)) {
    TrainSpec t = c.train;
    t.micro_batch_size = n.mbs;
    if (!n.validate_for(c.model, t, c.cluster.world_size()).ok()) continue;
    auto cm = cost::CostModel::create(c.model, c.cluster, t, o.calibration);
    PIPER_CHECK(cm.ok(), "tiny-moe's cost model");
    auto e = cm->estimate(n);
    if (!e.ok() || !e->fits || e->memory.total() > o.memory_fraction * c.cluster.device.memory_bytes) continue;
    out[n.to_string()] = e->step_time_s;
  }
  return out;
}

// A simulator that is the closed form times 1.5 for every plan: the bound is exact, so no neighbour whose closed
// form is not below the best's is simulated, and the answer is the one found without the bound.
TEST(RescoreTest, BoundStopsTheLocalSearchWhenNoNeighbourCanWin) {
  Case c = tiny_moe();
  SearchOptions o;
  o.top_k = 3;
  o.verify = false;
  o.simulate_top = 2;
  o.local_search_steps = 40;
  o.simulator = [&](const Strategy& s, const TrainSpec& t) -> Result<double> {
    PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(c.model, c.cluster, t, o.calibration));
    PIPER_ASSIGN_OR_RETURN(cost::Estimate e, cm.estimate(s));
    return 1.5 * e.step_time_s;
  };
  auto on = search(c.model, c.cluster, c.train, o);
  o.rescore_bound = false;
  auto off = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(on.ok() && off.ok());
  ASSERT_FALSE(on->top.empty());
  const Plan& best = on->top.front();
  EXPECT_DOUBLE_EQ(on->stats.sim_ratio_min, 1.5);
  int below = 0;  // neighbours the exact bound lets through
  for (const auto& [name, closed] : fitting_neighbour_closed_forms(c, best.strategy, o)) {
    below += 1.5 * closed < best.sim_step_time_s ? 1 : 0;
  }
  EXPECT_EQ(on->stats.local_search_tried, below);
  EXPECT_GE(on->stats.local_search_ruled_out, 1);
  EXPECT_GT(off->stats.local_search_tried, on->stats.local_search_tried);
  EXPECT_EQ(off->stats.local_search_ruled_out, 0);
  EXPECT_EQ(on->top.front().strategy, off->top.front().strategy);
  EXPECT_EQ(on->top.front().sim_step_time_s, off->top.front().sim_step_time_s);
  EXPECT_EQ(on->stats.to_json()["local_search_ruled_out"].get<int64_t>(), on->stats.local_search_ruled_out);
}

// Where a plan that the closed form ranks later wins: the top plans' ratios are 1 (b) and above (a); the
// neighbour of `a` with the second-slowest closed form simulates at its closed form (ratio 1 = the bound's) and
// beats `a`: it is simulated and becomes #1. The slowest neighbour cannot beat `a` by the bound and is not
// simulated; while its ratio is >= 1 that loses nothing, and one that breaks the assumption (ratio < 0.5,
// BoundDropsOnlyAPlanThatBreaksItsAssumption) is the documented limit: only --no-rescore-bound finds it.
struct LaterWinner {
  Case c = tiny_moe();
  SearchOptions o;
  Strategy a, slowest, winner;
  double best_s = 0;
  std::map<std::string, double> sim;
  double slow_s = 0;  // every other plan

  LaterWinner() {
    o.top_k = 3;
    o.verify = false;
    auto closed = search(c.model, c.cluster, c.train, o);
    PIPER_CHECK(closed.ok() && !closed->top.empty(), "tiny-moe plans");
    a = closed->top.front().strategy;
    const double c_a = closed->top.front().estimate.step_time_s;
    std::vector<std::pair<double, std::string>> by_closed;
    for (const auto& [name, cf] : fitting_neighbour_closed_forms(c, a, o)) by_closed.push_back({cf, name});
    std::sort(by_closed.begin(), by_closed.end());
    PIPER_CHECK(!by_closed.empty(), "tiny-moe's best plan has fitting neighbours");
    const auto [c_k, k] = by_closed.back();
    size_t i = by_closed.size() - 1;
    while (i > 0 && by_closed[i].first >= c_k) --i;
    const auto [c_w, w] = by_closed[i];
    PIPER_CHECK(c_w < c_k && c_w >= c_a, "two neighbour closed forms, none below the best's");
    best_s = 0.5 * (c_w + c_k);  // a's simulated step: between the two
    slow_s = 4 * c_k;
    winner = *Strategy::parse(w);
    slowest = *Strategy::parse(k);
    sim[a.to_string()] = best_s;
    sim[w] = c_w;
    sim[k] = 2 * c_k;
  }
  SearchResult start() const {
    SearchResult r;
    Plan pa;
    pa.strategy = a;
    TrainSpec t = c.train;
    t.micro_batch_size = a.mbs;
    pa.estimate = *cost::CostModel::create(c.model, c.cluster, t, o.calibration)->estimate(a);
    Plan pb = pa;  // the ratio-1 plan, slow by both measures; no neighbour of anything the walk reaches
    pb.strategy.microbatches *= 1000;
    pb.estimate.step_time_s = slow_s;
    r.top = {pa, pb};
    return r;
  }
  SearchResult run(bool bound) {
    SearchOptions ro = o;
    ro.simulate_top = 2;
    ro.local_search_steps = 100;
    ro.rescore_bound = bound;
    const SearchResult first = start();
    const std::string b = first.top[1].strategy.to_string();
    ro.simulator = [this, b](const Strategy& s, const TrainSpec&) -> Result<double> {
      if (s.to_string() == b) return slow_s;  // ratio 1
      auto it = sim.find(s.to_string());
      return it == sim.end() ? slow_s : it->second;
    };
    SearchResult r = first;
    rescore_with_simulator(c.model, c.cluster, c.train, ro, 2, &r);
    return r;
  }
};

TEST(RescoreTest, BoundKeepsALaterWinner) {
  LaterWinner w;
  SearchResult r = w.run(true);
  ASSERT_FALSE(r.top.empty());
  EXPECT_DOUBLE_EQ(r.stats.sim_ratio_min, 1.0);
  EXPECT_EQ(r.top.front().strategy, w.winner) << r.top.front().strategy.to_string();
  EXPECT_EQ(r.top.front().origin, "local-search");
  EXPECT_LT(r.top.front().sim_step_time_s, w.best_s);
  EXPECT_GE(r.stats.local_search_ruled_out, 1);
  for (const Plan& p : r.top) EXPECT_FALSE(p.strategy == w.slowest);
  SearchResult all = w.run(false);  // the same answer, with more simulations
  EXPECT_EQ(all.top.front().strategy, w.winner);
  EXPECT_GT(all.stats.local_search_tried, r.stats.local_search_tried);
}

TEST(RescoreTest, BoundDropsOnlyAPlanThatBreaksItsAssumption) {
  LaterWinner w;
  const std::string k = w.slowest.to_string();
  w.sim[k] = 0.5 * w.sim[w.winner.to_string()];  // simulated/closed form below 0.5: far below every ratio seen
  SearchResult r = w.run(true);
  EXPECT_EQ(r.top.front().strategy, w.winner);
  SearchResult all = w.run(false);
  EXPECT_EQ(all.top.front().strategy, w.slowest);
}

// A plan whose mesh order the simulator does not execute is marked with the simulator's message and counted as a
// failed run without taking a simulation slot: on one thread the plan after it runs in the first batch.
TEST(RescoreTest, ClosedFormOnlyOrderIsRefusedWithTheSimulatorsMessage) {
  Case c = load_case("tiny-moe", "h800", 1, 8, 128);  // 8 ranks: dp=8 holds ep=2 groups, so the order matters
  auto a = Strategy::parse("dp=8,tp=1,pp=1,ep=2,zero=1,recompute=none,schedule=1f1b,microbatches=1,mbs=1");
  auto refused =
      Strategy::parse("dp=8,tp=1,pp=1,ep=2,zero=1,recompute=none,schedule=1f1b,microbatches=1,mbs=1,order=tp-dp-ep-pp");
  ASSERT_TRUE(a.ok() && refused.ok());
  ASSERT_FALSE(sim::check_simulated_order(*refused).ok());
  SearchOptions o;
  o.top_k = 2;
  o.verify = false;
  o.simulate_top = 2;
  int batches = 0;  // one progress line per batch: the refusal takes no slot, so one thread runs one batch
  o.progress = [&](const std::string&) { ++batches; };
  SearchResult r;
  Plan p;
  p.strategy = *refused;
  r.top.push_back(p);
  p.strategy = *a;
  r.top.push_back(p);
  rescore_with_simulator(c.model, c.cluster, c.train, o, 1, &r);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_TRUE(r.top[0].simulated) << r.top[0].sim_error;
  EXPECT_EQ(r.top[0].strategy, *a);
  EXPECT_FALSE(r.top[1].simulated);
  EXPECT_EQ(r.top[1].sim_error, sim::check_simulated_order(*refused).message());
  EXPECT_NE(r.top[1].sim_error.find("priced by the closed form only"), std::string::npos) << r.top[1].sim_error;
  EXPECT_EQ(r.stats.simulated, 2);
  EXPECT_EQ(r.stats.simulate_failed, 1);
  EXPECT_EQ(batches, 1);
}

TEST(RescoreTest, ZeroBudgetStartsNothing) {
  Case c = tiny_moe();
  SearchOptions o;
  o.top_k = 2;
  o.verify = false;
  o.simulate_top = 2;
  o.simulate_budget_s = 0;
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stats.simulated, 0);
  EXPECT_TRUE(r->stats.simulate_budget_hit);
  for (const Plan& p : r->top) EXPECT_FALSE(p.simulated);
}

// A simulation that runs past the budget is stopped at the deadline (not only "no new start"): DeepSeek-V3 on
// 16 H800 nodes with ZeRO-3 over dp=64 takes about 16 s to simulate on an idle core (docs/planner.md); with a
// 0.5 s budget it stops, the plan says why and keeps its closed-form place after the simulated one.
TEST(RescoreTest, BudgetStopsARunningSimulation) {
  auto m = load_model("deepseek-v3");
  auto cl = load_cluster("h800", 16);
  ASSERT_TRUE(m.ok() && cl.ok());
  TrainSpec t;
  t.global_batch = 960;
  t.seq_len = 4096;
  auto slow =
      Strategy::parse("dp=64,pp=2,ep=32,zero=3,recompute=full,schedule=dualpipev,microbatches=15,mbs=1,a2a=halo");
  ASSERT_TRUE(slow.ok()) << slow.status().message();
  SearchOptions o;
  o.top_k = 2;
  o.verify = false;
  o.simulate_top = 1;
  o.local_search_steps = 0;
  o.simulate_budget_s = 0.5;
  SearchResult r;
  Plan p;
  p.strategy = *slow;
  r.top.push_back(p);
  Plan q = p;  // beyond simulate_top: never simulated
  q.strategy.zero = 1;
  r.top.push_back(q);
  rescore_with_simulator(*m, *cl, t, o, 1, &r);
  ASSERT_EQ(r.top.size(), 2u);
  const Plan& first = r.top[0];
  EXPECT_FALSE(first.simulated);
  EXPECT_TRUE(first.sim_stopped);
  EXPECT_EQ(first.strategy, *slow);  // closed-form order kept
  EXPECT_NE(first.sim_error.find("not simulated: budget"), std::string::npos) << first.sim_error;
  EXPECT_EQ(r.stats.simulated, 1);
  EXPECT_EQ(r.stats.simulate_stopped, 1);
  EXPECT_EQ(r.stats.simulate_failed, 0);
  EXPECT_TRUE(r.stats.simulate_budget_hit);
  // Compile (about 0.1 s) + the budget + one clock check; far below the full simulation.
  EXPECT_LT(r.stats.simulate_time_s, 5.0);
  const Json j = first.to_json();
  EXPECT_TRUE(j["simulation_stopped_by_budget"].get<bool>());
  EXPECT_EQ(r.stats.to_json()["simulate_stopped"].get<int64_t>(), 1);
}

// A plan the memory screen accepted without a full compile (verify.h) is not compiled for simulation when its
// estimated full compile is longer than the budget left: it is stopped by the budget at once, the next plan runs.
TEST(RescoreTest, ScreenedPlanTooLargeToCompileInTheBudgetIsNotStarted) {
  Case c = tiny_moe();
  SearchOptions o;
  o.top_k = 2;
  o.simulate_top = 2;
  o.local_search_steps = 0;
  o.simulate_budget_s = 60;
  o.simulate_top = 0;  // verified, not yet simulated
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->top.size(), 2u);
  o.simulate_top = 2;
  SearchResult s;
  s.top = r->top;
  for (Plan& p : s.top) p.compiled.reset();
  s.top[0].verification.screened = true;
  s.top[0].verification.full_compile_estimate_s = 1e6;
  s.top[1].verification.screened = true;
  s.top[1].verification.full_compile_estimate_s = 1e-3;
  rescore_with_simulator(c.model, c.cluster, c.train, o, 1, &s);
  ASSERT_EQ(s.top.size(), 2u);
  const Plan& ran = s.top[0];  // the simulated plan moves first
  const Plan& skipped = s.top[1];
  EXPECT_TRUE(ran.simulated) << ran.sim_error;
  EXPECT_EQ(ran.strategy, r->top[1].strategy);
  EXPECT_FALSE(skipped.simulated);
  EXPECT_TRUE(skipped.sim_stopped);
  EXPECT_NE(skipped.sim_error.find("would take about"), std::string::npos) << skipped.sim_error;
  EXPECT_EQ(s.stats.simulate_stopped, 1);
  EXPECT_EQ(s.stats.simulate_failed, 0);
}

TEST(RescoreTest, BadOptionsAreRejectedByName) {
  Case c = tiny_moe();
  SearchOptions o;
  o.simulate_top = -1;
  auto r = search(c.model, c.cluster, c.train, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("simulate_top"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace piper::planner
