// Estimates per second on one core, over a realistic planner sweep: DeepSeek-V3 on 256 H800 nodes (2048
// GPUs) and Mixtral-8x7B on 8 DGX-H100 nodes, every (tp, pp, ep, zero, recompute, schedule, microbatches)
// combination that validates. Baseline in the same run: Strategy::validate_for alone (the cheapest thing a
// planner must do per candidate), so the ratio shows what the cost model adds on top.
#include <algorithm>
#include <chrono>
#include <string>
#include <cstdio>
#include <vector>

#include "piper/cost/estimate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<piper::Strategy> sweep(const piper::cost::CostModel& cm) {
  std::vector<piper::Strategy> out;
  const int world = cm.cluster().world_size();
  const char* schedules[] = {"1f1b", "gpipe", "interleaved", "zb-h1", "dualpipev"};
  for (int tp : {1, 2, 4, 8}) {
    for (int pp : {1, 2, 4, 8, 16}) {
      if (world % (tp * pp) != 0) continue;
      const int dp = world / (tp * pp);
      for (int ep : {1, 2, 4, 8, 16, 32, 64}) {
        for (int zero = 0; zero <= 3; ++zero) {
          for (auto rc : {piper::Recompute::kNone, piper::Recompute::kSelective, piper::Recompute::kFull}) {
            for (const char* sched : schedules) {
              for (int m : {2 * pp, 4 * pp}) {
                piper::Strategy s;
                s.dp = dp;
                s.tp = tp;
                s.pp = pp;
                s.ep = ep;
                s.zero = zero;
                s.sp = tp > 1;
                s.recompute = rc;
                s.schedule = sched;
                s.vpp = std::string(sched) == "interleaved" ? 2 : 1;
                s.microbatches = m;
                s.a2a = ep >= 16 ? "halo" : "flat";
                if (s.validate_for(cm.model(), cm.train(), world).ok()) out.push_back(s);
              }
            }
          }
        }
      }
    }
  }
  return out;
}

double per_second(size_t n, Clock::duration d) { return n / std::chrono::duration<double>(d).count(); }

int run(const char* model, const char* cluster, int nodes) {
  auto m = piper::load_model(model);
  auto c = piper::load_cluster(cluster, nodes);
  if (!m.ok() || !c.ok()) {
    std::fprintf(stderr, "cost_bench: %s\n", (!m.ok() ? m.status() : c.status()).to_string().c_str());
    return 1;
  }
  piper::TrainSpec train;
  train.seq_len = 4096;
  auto cm = piper::cost::CostModel::create(*m, *c, train);
  if (!cm.ok()) {
    std::fprintf(stderr, "cost_bench: %s\n", cm.status().to_string().c_str());
    return 1;
  }
  std::vector<piper::Strategy> strategies = sweep(*cm);
  if (strategies.empty()) return 1;
  const int reps = std::max<size_t>(1, 400000 / strategies.size());
  piper::cost::Estimate e;
  double sink = 0;
  int fits = 0;
  auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) {
    for (const auto& s : strategies) sink += s.validate_for(cm->model(), cm->train(), cm->cluster().world_size()).ok();
  }
  auto t1 = Clock::now();
  for (int r = 0; r < reps; ++r) {
    for (const auto& s : strategies) {
      if (!cm->estimate(s, &e).ok()) return 1;
      sink += e.step_time_s;
      fits += r == 0 && e.fits;
    }
  }
  auto t2 = Clock::now();
  const size_t n = strategies.size() * reps;
  const double base = per_second(n, t1 - t0), rate = per_second(n, t2 - t1);
  std::printf("%-14s %-10s %4d nodes: %5zu strategies (%d fit), %zu estimates: %.0f estimates/s "
              "(%.2fx the 100,000/s target; validate-only baseline %.0f/s, estimate costs %.1fx it)%s\n",
              model, cluster, nodes, strategies.size(), fits, n, rate, rate / 1e5, base, base / rate,
              sink < 0 ? "" : "");
  return rate >= 1e5 ? 0 : 2;
}

}  // namespace

int main() {
  int rc = run("deepseek-v3", "h800", 256);
  rc |= run("mixtral-8x7b", "dgx-h100", 8);
  return rc;
}
