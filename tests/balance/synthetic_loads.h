// Deterministic synthetic expert loads for the balance tests: uniform, Zipf, one hot expert, and a "recorded-like"
// trace (a Zipf popularity that drifts over the steps, with per-step noise). No global RNG: a fixed LCG.
#pragma once

#include <cstdint>
#include <vector>

namespace piper::balance::testing {

// Tiny deterministic generator (Knuth's MMIX LCG); uniform() is in [0, 1).
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed * 6364136223846793005ULL + 1442695040888963407ULL) {}
  double uniform();

 private:
  uint64_t state_;
};

std::vector<int64_t> uniform_loads(int num_experts, int64_t tokens_per_expert);
// Zipf(s) over experts: the i-th most popular expert gets total_tokens * (1/(i+1)^s) / H. Popularity order is a
// fixed pseudo-random permutation of the experts drawn from `seed` (so hot experts are not clustered by index).
std::vector<int64_t> zipf_loads(int num_experts, int64_t total_tokens, double s, uint64_t seed);
std::vector<int64_t> one_hot_loads(int num_experts, int64_t base_tokens, int hot_expert, int64_t hot_tokens);

// trace[step][expert]: expert e has popularity position p_e(t) = (perm(e) + drift_per_step * t) mod E and gets a
// share 1/(1+p)^s of total_tokens, times a per-step noise factor in [1 - noise, 1 + noise].
std::vector<std::vector<int64_t>> drifting_zipf_trace(int num_experts, int num_steps, int64_t total_tokens, double s,
                                                      double drift_per_step, double noise, uint64_t seed);

}  // namespace piper::balance::testing
