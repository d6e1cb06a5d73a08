// Measured expert loads: the tokens each routed expert of each MoE layer received over a training run, recorded by
// `piper train --record-expert-loads FILE` and read by `piper estimate|simulate --expert-loads FILE`, which price
// the busiest expert-parallel rank from it instead of assuming balanced experts (docs/balance.md).
//
// File (JSON): {"format": "piper-expert-loads", "version": 2, "model": "tiny-moe", "num_experts": 8, "steps": 20,
//               "layers": [{"layer": 0, "tokens": [812, 640, ...]}, ...],
//               "busiest_steps": [{"ep": 2, "ranks": [{"step": 5, "tokens": [2011, 1876, ...]}, ...]}, ...]}
// tokens[e] is the count of (token, expert) routings to logical expert e summed over `steps` steps; placement
// independent (a migration changes which rank serves an expert, not what the router sends it). busiest_steps
// (version 2; a version-1 file has none): for every ep that divides num_experts (2 <= ep <= kMaxRecordedEp), the
// experts placed contiguously, each ep rank's step with the most routed rows summed over the MoE layers and its
// rows per layer in that step: what the rank's peak memory comes from, as a rank's experts keep every routed row
// of a step until its backward, while its time follows the mean over steps. step_tokens (version 2, optional):
// every step's tokens per layer and expert, [step][i][e], kept while steps x layers x experts <= kMaxStepTokens;
// from them a pipeline rank's busiest step over its own MoE layers is found (busiest_steps' is over all of them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"

namespace piper::balance {

struct LayerLoads {
  int layer = 0;                // the model's layer index
  std::vector<int64_t> tokens;  // [num_experts]
};

// The largest ep whose busiest steps a file records (bounds the file: the ranks of every recorded ep, at most 2,046
// for 2^16 experts, times the layers).
inline constexpr int kMaxRecordedEp = 1024;
// The most per-step counts a file keeps (steps x MoE layers x experts; 8 MiB of JSON at most): a longer run drops
// step_tokens and keeps busiest_steps only.
inline constexpr int64_t kMaxStepTokens = int64_t{1} << 20;
// The most routings one layer may count over a run (2^50: 10^15, eight times a 15T-token run at top-8), so that a
// rank's rows summed over kMaxLayers layers stay exact in int64.
inline constexpr int64_t kMaxLayerTokens = int64_t{1} << 50;

struct BusiestStep {
  int64_t step = 0;             // 1-based, of the run's steps
  std::vector<int64_t> tokens;  // [i]: the rank's routed rows in MoE layer layers[i] during that step
};

struct BusiestSteps {
  int ep = 2;
  std::vector<BusiestStep> ranks;  // [ep rank]; ep rank r holds experts [r E/ep, (r+1) E/ep)
};

struct ExpertLoads {
  std::string model;  // the model the run trained (checked against the model it is applied to)
  int num_experts = 0;
  int64_t steps = 0;
  std::vector<LayerLoads> layers;     // MoE layers, increasing layer index
  std::vector<BusiestSteps> busiest;  // increasing ep; empty from a version-1 file (memory then follows the mean)
  // [step][i][e]: every step's tokens, while steps x layers x experts <= kMaxStepTokens (else empty, and
  // step_tokens_dropped while recording: not written, not read).
  std::vector<std::vector<std::vector<int64_t>>> step_tokens;
  bool step_tokens_dropped = false;

  Json to_json() const;
  // Adds one step's loads (layer -> tokens per expert, as runtime::TrainStepStats::expert_tokens).
  Status add_step(const std::vector<std::pair<int, std::vector<int64_t>>>& step);
};

// Parses and checks a loads file's JSON (`what` names it in errors): format and version, 1 <= num_experts <=
// kMaxExperts, at most kMaxLayers layers in increasing order, non-negative counts, not all zero.
Result<ExpertLoads> parse_expert_loads(const std::string& text, const std::string& what);
Result<ExpertLoads> load_expert_loads(const std::string& path);
// Written whole or not at all (temporary + rename).
Status save_expert_loads(const std::string& path, const ExpertLoads& loads);

// Per MoE layer and ep rank: the rank's routed tokens over the mean rank's (1 = its share at perfect balance), the
// experts placed contiguously over `ep` ranks (ep rank r holds experts [r E/ep, (r+1) E/ep), as the compiler places
// them; a migration's placement is not in the file, which counts tokens per logical expert). What a simulation of
// every rank prices each rank's experts from, time and memory (sim/plan_exec.h SimOptions::expert_loads).
struct RankLoads {
  int ep = 1;
  std::vector<int> layers;                  // the file's MoE layers (model layer index), increasing
  std::vector<std::vector<double>> factor;  // [i][r]: layer layers[i], ep rank r; a layer that routed nothing: all 1
  // [i][r]: the same in rank r's busiest step (its rows that step over the mean rank's rows per step): what its
  // peak memory is priced from. Equal to `factor` when the file records no busiest steps (version 1); empty (a
  // RankLoads built by hand): `factor`.
  std::vector<std::vector<double>> peak;
  // [s][i][r]: the same in step s (from step_tokens; empty without).
  std::vector<std::vector<std::vector<double>>> step_factor;
  // The factor of ep rank `r` (0 <= r < ep) in model layer `layer`; 1 for a layer the file does not list.
  double of(int layer, int r) const;
  double peak_of(int layer, int r) const;
  // Each of `held`'s layers' factor of ep rank r in its busiest step over `held` (a pipeline rank's own MoE layers:
  // the step with the most rows summed over them), from step_factor; without it peak_of each (the busiest step over
  // every layer). Layers the file does not list: 1.
  std::vector<double> peak_over(const std::vector<int>& held, int r) const;
  // The largest factor of any rank in `layer` (1 for a layer the file does not list).
  double busiest(int layer) const;
  // These loads with step s's factors (step_factor[s]) as `factor`: what a simulation of that one step prices each
  // rank's experts' time from; peak and step_factor stay (peak memory is the busiest step's either way).
  // s < step_factor.size().
  RankLoads at_step(size_t s) const;
};

// Errors: ep < 1 or ep not dividing num_experts (named, with the fix).
Result<RankLoads> contiguous_rank_loads(const ExpertLoads& loads, int ep);

// The busiest ep rank's tokens over the mean rank's, with the experts placed contiguously over `ep` ranks
// (num_experts / ep each, as the compiler places them), averaged over layers: a step's expert time is the sum over
// layers of each layer's busiest rank, so the mean of the per-layer ratios is the one scalar that prices it
// (cost::Calibration::expert_load_imbalance). 1 at ep = 1. ep must divide num_experts.
Result<double> contiguous_imbalance(const ExpertLoads& loads, int ep);
// The same from `loads`' rank loads already computed (contiguous_rank_loads(loads, ranks.ep)).
double contiguous_imbalance(const ExpertLoads& loads, const RankLoads& ranks);

// The rows an ep rank's experts hold at its peak over the mean rank's, for the rank that holds the most: the
// largest over ranks of the mean over routed layers of RankLoads::peak (a rank keeps the activations of every MoE
// layer it holds, so its own layers' mean, not each layer's busiest rank, sizes it). What the closed form and a
// plan compiled for a representative rank size the experts' buffers with (cost::Calibration::expert_memory_load).
// 1 at ep = 1. ep must divide num_experts.
Result<double> contiguous_memory_load(const ExpertLoads& loads, int ep);
double contiguous_memory_load(const ExpertLoads& loads, const RankLoads& ranks);

}  // namespace piper::balance
