#include "piper/planner/verify.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "piper/compile/compile.h"
#include "piper/sim/simulate.h"

namespace piper::planner {

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

// The strategy with m microbatches, compiled without a capacity; nullopt when it does not validate or compile.
std::optional<compile::CompileResult> compile_with_microbatches(const ModelSpec& model, const TrainSpec& train,
                                                                const Strategy& strategy, int m) {
  Strategy s = strategy;
  s.microbatches = m;
  TrainSpec t = train;
  t.global_batch = s.global_batch();
  if (!s.validate_for(model, t, s.world_size()).ok()) return std::nullopt;
  auto r = compile::compile_strategy(model, t, s, compile::CompileOptions{});
  if (!r.ok()) return std::nullopt;
  return std::move(r).value();
}

// VerifyOptions::memory_screen (verify.h): the full compile's verdict from two small compiles, or nullopt.
std::optional<Verification> screen_memory(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                                          int64_t capacity_bytes, const VerifyOptions& options,
                                          std::chrono::steady_clock::time_point start, bool for_simulation) {
  const int m1 = 2 * strategy.pp * std::max(1, strategy.vpp);
  const int m2 = 2 * m1;
  if (capacity_bytes <= 0 || strategy.microbatches <= m1 + m2) return std::nullopt;
  const auto small_start = std::chrono::steady_clock::now();
  auto small = compile_with_microbatches(model, train, strategy, m1);
  if (!small) return std::nullopt;
  const double small_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - small_start).count();
  int64_t peak = 0;
  for (int64_t b : small->stats.peak_bytes) peak = std::max(peak, b);
  if (peak <= capacity_bytes) {
    if (!options.accept_steady) return std::nullopt;  // only the full compile may accept
    // A plan that fits and will be compiled in full for the simulator anyway needs no second small compile.
    if (for_simulation && small_s * strategy.microbatches / m1 <= options.max_full_compile_s) return std::nullopt;
  }
  const auto large_start = std::chrono::steady_clock::now();
  auto large = compile_with_microbatches(model, train, strategy, m2);
  if (!large || large->stats.peak_bytes != small->stats.peak_bytes) return std::nullopt;  // not steady
  const double large_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - large_start).count();
  auto checked = compile::verify_plan(large->plan, capacity_bytes);
  Verification v;
  v.screened = true;
  if (checked.ok()) {
    v.ok = true;
    v.compiled_peak_bytes = static_cast<double>(peak);
    v.full_compile_estimate_s = large_s * strategy.microbatches / m2;
  } else {
    v.message = checked.status().with_context("compile: verify").message();
  }
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return v;
}

}  // namespace

Verification verify_strategy(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                             double capacity_bytes, const VerifyOptions& verify_options) {
  const auto start = std::chrono::steady_clock::now();
  if (verify_options.memory_screen) {
    if (auto v = screen_memory(model, train, strategy, capacity(capacity_bytes), verify_options, start, false)) {
      return *v;
    }
  }
  compile::CompileOptions options;
  options.capacity_bytes = capacity(capacity_bytes);
  return verdict(compile::compile_strategy(model, train, strategy, options), start);
}

Verification verify_strategy_for_simulation(const ModelSpec& model, const ClusterSpec& cluster,
                                            const TrainSpec& train, const Strategy& strategy,
                                            const cost::Calibration& calibration, double capacity_bytes,
                                            std::shared_ptr<compile::CompileResult>* compiled,
                                            const VerifyOptions& verify_options) {
  const auto start = std::chrono::steady_clock::now();
  if (verify_options.memory_screen) {
    auto v = screen_memory(model, train, strategy, capacity(capacity_bytes), verify_options, start, true);
    // A screened plan is compiled in full here only when re-scoring may simulate it within its budget.
    if (v && (!v->ok || v->full_compile_estimate_s > verify_options.max_full_compile_s)) return *v;
  }
  auto result = sim::compile_for_simulation(model, cluster, train, strategy, calibration, sim::SimOptions{},
                                            capacity(capacity_bytes));
  Verification v = verdict(result, start);
  if (v.ok) *compiled = std::make_shared<compile::CompileResult>(std::move(result).value());
  return v;
}

}  // namespace piper::planner
