#include "piper/plan/verify.h"

#include <algorithm>
#include <chrono>

#include "piper/compile/compile.h"

namespace piper::plan {

Verification verify_strategy(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                             double capacity_bytes) {
  const auto start = std::chrono::steady_clock::now();
  compile::CompileOptions options;
  options.capacity_bytes = capacity_bytes > 0 ? static_cast<int64_t>(capacity_bytes) : 0;
  auto result = compile::compile_strategy(model, train, strategy, options);
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

}  // namespace piper::plan
