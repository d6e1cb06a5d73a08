#include "synthetic_loads.h"

#include <cmath>
#include <numeric>

namespace piper::balance::testing {
namespace {

std::vector<int> permutation(int n, uint64_t seed) {
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  Lcg rng(seed);
  for (int i = n - 1; i > 0; --i) {
    const int j = static_cast<int>(rng.uniform() * (i + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

}  // namespace

double Lcg::uniform() {
  state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
  return static_cast<double>(state_ >> 11) / static_cast<double>(1ULL << 53);
}

std::vector<int64_t> uniform_loads(int num_experts, int64_t tokens_per_expert) {
  return std::vector<int64_t>(num_experts, tokens_per_expert);
}

std::vector<int64_t> zipf_loads(int num_experts, int64_t total_tokens, double s, uint64_t seed) {
  const std::vector<int> perm = permutation(num_experts, seed);
  double h = 0;
  for (int i = 0; i < num_experts; ++i) h += 1.0 / std::pow(i + 1, s);
  std::vector<int64_t> loads(num_experts);
  for (int e = 0; e < num_experts; ++e) {
    loads[e] = static_cast<int64_t>(static_cast<double>(total_tokens) / std::pow(perm[e] + 1, s) / h);
  }
  return loads;
}

std::vector<int64_t> one_hot_loads(int num_experts, int64_t base_tokens, int hot_expert, int64_t hot_tokens) {
  std::vector<int64_t> loads(num_experts, base_tokens);
  loads[hot_expert] = hot_tokens;
  return loads;
}

std::vector<std::vector<int64_t>> drifting_zipf_trace(int num_experts, int num_steps, int64_t total_tokens, double s,
                                                      double drift_per_step, double noise, uint64_t seed) {
  const std::vector<int> perm = permutation(num_experts, seed);
  Lcg rng(seed + 1);
  std::vector<std::vector<int64_t>> trace(num_steps, std::vector<int64_t>(num_experts));
  for (int t = 0; t < num_steps; ++t) {
    std::vector<double> w(num_experts);
    double sum = 0;
    for (int e = 0; e < num_experts; ++e) {
      const double p = std::fmod(perm[e] + drift_per_step * t, static_cast<double>(num_experts));
      w[e] = (1.0 + noise * (2 * rng.uniform() - 1)) / std::pow(1.0 + p, s);
      sum += w[e];
    }
    for (int e = 0; e < num_experts; ++e) {
      trace[t][e] = static_cast<int64_t>(static_cast<double>(total_tokens) * w[e] / sum);
    }
  }
  return trace;
}

}  // namespace piper::balance::testing
