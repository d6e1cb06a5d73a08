// Planner speed on DeepSeek-V3-like layouts: 256 routed experts per layer over EP 8/32/64 (4 slots per rank at
// EP 64), 58 MoE layers, Zipf(0.8) loads with a different popularity order per layer. Prints the planner's and
// greedy repacking's wall time per layer (best of 3), the experts each moves and the max/mean each reaches.
// Not a test: no assertion on time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "piper/balance/greedy_repack.h"
#include "piper/balance/planner.h"

namespace {

using namespace piper::balance;

std::vector<int64_t> zipf(int experts, int64_t total, double s, uint64_t seed) {
  std::vector<int> perm(experts);
  std::iota(perm.begin(), perm.end(), 0);
  uint64_t x = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (int i = experts - 1; i > 0; --i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    std::swap(perm[i], perm[(x >> 33) % static_cast<uint64_t>(i + 1)]);
  }
  double h = 0;
  for (int i = 0; i < experts; ++i) h += 1 / std::pow(i + 1, s);
  std::vector<int64_t> loads(experts);
  for (int e = 0; e < experts; ++e) loads[e] = static_cast<int64_t>(total / std::pow(perm[e] + 1, s) / h);
  return loads;
}

template <typename F>
double best_of_3_s(F f) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  const int kExperts = 256, kLayers = 58;
  MigrationCost cost;  // cheap moves: the planner climbs as far as it is allowed to
  cost.bytes_per_expert = 1e6;
  cost.link_bw_bytes_per_s = 1e12;
  cost.steps_next_window = 100;
  cost.time_per_token_s = 1e-6;
  std::printf("%4s %14s %14s %8s %12s %12s %12s %12s\n", "ep", "planner_ms/lyr", "greedy_ms/lyr", "ratio", "moved_plan",
              "moved_greedy", "imb_plan", "imb_greedy");
  for (int ep : {8, 32, 64}) {
    const ExpertPlacement cur = ExpertPlacement::contiguous(kExperts, ep, kExperts / ep, ep).value();
    std::vector<std::vector<int64_t>> loads;
    for (int l = 0; l < kLayers; ++l) loads.push_back(zipf(kExperts, 4096 * 8 * ep, 0.8, l + 1));
    int moved_plan = 0, moved_greedy = 0;
    double imb_plan = 0, imb_greedy = 0;
    const double t_plan = best_of_3_s([&] {
      moved_plan = 0;
      imb_plan = 0;
      for (const auto& ld : loads) {
        MigrationPlan p = plan_migration(ld, 1, cur, cost).value();
        moved_plan += static_cast<int>(p.moves.size());
        imb_plan += p.imbalance_after;
      }
    });
    const double t_greedy = best_of_3_s([&] {
      moved_greedy = 0;
      imb_greedy = 0;
      for (const auto& ld : loads) {
        ExpertPlacement g = greedy_repack(ld, cur).value();
        moved_greedy += count_moved_experts(cur, g);
        imb_greedy += imbalance(rank_tokens(g, ld).value());
      }
    });
    std::printf("%4d %14.3f %14.3f %8.1f %12d %12d %12.3f %12.3f\n", ep, t_plan / kLayers * 1e3,
                t_greedy / kLayers * 1e3, t_plan / t_greedy, moved_plan, moved_greedy, imb_plan / kLayers,
                imb_greedy / kLayers);
  }
  return 0;
}
