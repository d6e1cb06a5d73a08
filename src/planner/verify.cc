#include "piper/planner/verify.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

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

double compile_seconds(const compile::CompileResult& r) {
  double s = 0;
  for (const auto& step : r.step_seconds) s += step.second;
  return s;
}

int screen_m1(const Strategy& s) { return 2 * s.pp * std::max(1, s.vpp); }

// The strategy with m microbatches and its TrainSpec (global batch dp*mbs*m); whether it validates.
bool screen_variant(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy, int m, Strategy* s,
                    TrainSpec* t) {
  *s = strategy;
  s->microbatches = m;
  *t = train;
  t->global_batch = s->global_batch();
  return s->validate_for(model, *t, s->world_size()).ok();
}

// The strategy with m microbatches, compiled without a capacity; nullopt when it does not validate or compile.
std::optional<compile::CompileResult> compile_with_microbatches(const ModelSpec& model, const TrainSpec& train,
                                                                const Strategy& strategy, int m, bool data_edges) {
  Strategy s;
  TrainSpec t;
  if (!screen_variant(model, train, strategy, m, &s, &t)) return std::nullopt;
  compile::CompileOptions options;
  options.data_edges = data_edges;
  auto r = compile::compile_strategy(model, t, s, options);
  if (!r.ok()) return std::nullopt;
  return std::move(r).value();
}

// What screen_memory saw when it left the decision to the full compile because the plan fits at m1 and will be
// compiled in full for the simulator (the second small compile was skipped): the m1 compile's peaks.
struct SkippedScreen {
  bool skipped = false;
  std::vector<int64_t> m1_peak_bytes;
};

// VerifyOptions::memory_screen (verify.h): the full compile's verdict from two small compiles, or nullopt.
std::optional<Verification> screen_memory(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                                          int64_t capacity_bytes, const VerifyOptions& options,
                                          std::chrono::steady_clock::time_point start, bool for_simulation,
                                          SkippedScreen* skipped = nullptr) {
  const int m1 = screen_m1(strategy);
  const int m2 = 2 * m1;
  if (capacity_bytes <= 0 || strategy.microbatches <= m1 + m2) return std::nullopt;
  const auto small_start = std::chrono::steady_clock::now();
  auto small = compile_with_microbatches(model, train, strategy, m1, options.data_edges);
  if (!small) return std::nullopt;
  const double small_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - small_start).count();
  int64_t peak = 0;
  for (int64_t b : small->stats.peak_bytes) peak = std::max(peak, b);
  if (peak <= capacity_bytes) {
    if (!options.accept_steady) return std::nullopt;  // only the full compile may accept
    // A plan that fits and will be compiled in full for the simulator anyway needs no second small compile.
    if (for_simulation && small_s * strategy.microbatches / m1 <= options.max_full_compile_s) {
      if (skipped) *skipped = SkippedScreen{true, small->stats.peak_bytes};
      return std::nullopt;
    }
  }
  const auto large_start = std::chrono::steady_clock::now();
  auto large = compile_with_microbatches(model, train, strategy, m2, options.data_edges);
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
  options.data_edges = verify_options.data_edges;
  return verdict(compile::compile_strategy(model, train, strategy, options), start);
}

Verification verify_strategy_for_simulation(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                            const Strategy& strategy, const cost::Calibration& calibration,
                                            double capacity_bytes, std::shared_ptr<compile::CompileResult>* compiled,
                                            const VerifyOptions& verify_options, VerifyCache* cache) {
  const auto start = std::chrono::steady_clock::now();
  std::optional<Verification> screened;
  SkippedScreen skipped;
  if (verify_options.memory_screen) {
    screened = screen_memory(model, train, strategy, capacity(capacity_bytes), verify_options, start, true, &skipped);
    // A screened plan is compiled in full here only when re-scoring may simulate it within its budget.
    if (screened && (!screened->ok || screened->full_compile_estimate_s > verify_options.max_full_compile_s)) {
      if (cache) cache->offer(model, train, strategy, capacity_bytes, verify_options, *screened);
      return *screened;
    }
  }
  sim::SimOptions sim_options;
  sim_options.data_edges = verify_options.data_edges;
  auto result =
      sim::compile_for_simulation(model, cluster, train, strategy, calibration, sim_options, capacity(capacity_bytes));
  Verification v = verdict(result, start);
  if (cache) {
    // What verify_strategy would have said (VerifyCache::offer, verify.h): the screen's verdict when it had one; the
    // full compile's when the screen did not apply; when the screen skipped its second compile for this one, a
    // screened acceptance if the full compile's peaks are the m1 compile's on every pipeline rank (else nothing).
    if (screened) {
      cache->offer(model, train, strategy, capacity_bytes, verify_options, *screened);
    } else if (!skipped.skipped) {
      cache->offer(model, train, strategy, capacity_bytes, verify_options, v);
    } else if (v.ok && result->stats.peak_bytes == skipped.m1_peak_bytes) {
      Verification steady = v;
      steady.screened = true;
      steady.full_compile_estimate_s = result->step_seconds.empty() ? v.seconds : compile_seconds(*result);
      cache->offer(model, train, strategy, capacity_bytes, verify_options, steady);
    }
  }
  if (v.ok) *compiled = std::make_shared<compile::CompileResult>(std::move(result).value());
  return v;
}

std::string VerifyCache::key(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                             double capacity_bytes, const VerifyOptions& options) {
  Strategy s = strategy;
  s.order = Strategy{}.order;
  s.a2a = "flat";
  std::string k = s.to_string() + "|mbs=" + std::to_string(train.micro_batch_size) +
                  "|global_batch=" + std::to_string(train.global_batch) +
                  "|capacity=" + std::to_string(capacity(capacity_bytes)) +
                  "|screen=" + (options.memory_screen ? "1" : "0") + (options.accept_steady ? "1" : "0");
  if (options.memory_screen) {  // screen_memory validates its two variants: the only reader of order and a2a
    Strategy v;
    TrainSpec t;
    const int m1 = screen_m1(strategy);
    k += "|valid=";
    k += screen_variant(model, train, strategy, m1, &v, &t) ? "1" : "0";
    k += screen_variant(model, train, strategy, 2 * m1, &v, &t) ? "1" : "0";
  }
  return k;
}

Verification VerifyCache::verify(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                                 double capacity_bytes, const VerifyOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::string k = key(model, train, strategy, capacity_bytes, options);
  std::promise<Verification> mine;
  std::shared_future<Verification> theirs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = verdicts_.find(k);
    if (it == verdicts_.end()) {
      verdicts_.emplace(k, mine.get_future().share());
    } else {
      theirs = it->second;
      ++hits_;
    }
  }
  if (!theirs.valid()) {
    Verification v = verify_strategy(model, train, strategy, capacity_bytes, options);
    mine.set_value(v);
    return v;
  }
  Verification v = theirs.get();
  v.cached = true;
  v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return v;
}

void VerifyCache::offer(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy, double capacity_bytes,
                        const VerifyOptions& options, const Verification& verdict) {
  const std::string k = key(model, train, strategy, capacity_bytes, options);
  std::lock_guard<std::mutex> lock(mu_);
  if (verdicts_.count(k) != 0) return;
  std::promise<Verification> p;
  p.set_value(verdict);
  verdicts_.emplace(k, p.get_future().share());
}

int64_t VerifyCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace piper::planner
