#include "piper/plan/verify.h"

#include <algorithm>
#include <chrono>

#include "piper/compile/compile.h"
#include "piper/sim/simulate.h"

namespace piper::plan {

namespace {

Verification verdict(const Result<compile::CompileResult>& result, std::chrono::steady_clock::time_point start) {
  Verification v;
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok()) {
    v.message = result.status().message();
    return v;
  }
  v.ok = true;
  for (int64_t b : result->stats.peak_bytes)
    v.compiled_peak_bytes = std::max(v.compiled_peak_bytes, static_cast<double>(b));
  return v;
}

int64_t capacity(double capacity_bytes) { return capacity_bytes > 0 ? static_cast<int64_t>(capacity_bytes) : 0; }

}  // namespace

Verification verify_strategy(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                             double capacity_bytes) {
  const auto start = std::chrono::steady_clock::now();
  compile::CompileOptions options;
  options.capacity_bytes = capacity(capacity_bytes);
  return verdict(compile::compile_strategy(model, train, strategy, options), start);
}

Verification verify_strategy_for_simulation(const ModelSpec& model, const ClusterSpec& cluster,
                                            const TrainSpec& train, const Strategy& strategy,
                                            const cost::Calibration& calibration, double capacity_bytes,
                                            std::shared_ptr<compile::CompileResult>* compiled) {
  const auto start = std::chrono::steady_clock::now();
  auto result = sim::compile_for_simulation(model, cluster, train, strategy, calibration, sim::SimOptions{},
                                            capacity(capacity_bytes));
  Verification v = verdict(result, start);
  if (v.ok) *compiled = std::make_shared<compile::CompileResult>(std::move(result).value());
  return v;
}

}  // namespace piper::plan
