// Compile DeepSeek-V3 for 1,024 ranks (pp=16, ep=64, dp=64, 1F1B, 32 microbatches) and print the time of
// each compile step, next to a baseline measured in the same run: the same model and schedule on 16 ranks
// (dp=1, no expert parallelism). Program templates make the 1,024-rank compile cost about the same.
// Each configuration is compiled kRepeats times; the fastest run is printed (the machine is shared).
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "piper/base/check.h"
#include "piper/compile/compile.h"
#include "piper/spec/model_loader.h"

namespace {

using piper::Strategy;

constexpr int kRepeats = 3;

double run(const piper::ModelSpec& model, const std::string& text) {
  auto s = Strategy::parse(text);
  PIPER_CHECK_OK(s.status());
  piper::TrainSpec train;
  train.micro_batch_size = 1;
  train.seq_len = 4096;
  train.global_batch = s->global_batch();
  piper::compile::CompileOptions options;
  options.verify_each_pass = false;
  double best = 1e30;
  std::vector<std::pair<std::string, double>> best_steps;
  piper::Result<piper::compile::CompileResult> r = piper::internal_error("not run");
  for (int i = 0; i < kRepeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    r = piper::compile::compile_strategy(model, train, *s, options);
    double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    PIPER_CHECK_OK(r.status());
    if (total < best) {
      best = total;
      best_steps = r->step_seconds;
    }
  }
  std::printf("%s\n  world %d ranks, %zu program templates, %zu graph nodes, %zu instructions\n", text.c_str(),
              r->plan.world_size, r->plan.templates.size(), r->graph.num_nodes(), r->stats.instructions);
  for (const auto& [step, sec] : best_steps) std::printf("  %-7s %8.3f s\n", step.c_str(), sec);
  std::printf("  total   %8.3f s (best of %d)\n", best, kRepeats);
  return best;
}

}  // namespace

int main() {
  auto model = piper::load_model("deepseek-v3");
  PIPER_CHECK_OK(model.status());
  double base = run(*model, "dp=1,pp=16,ep=1,zero=0,schedule=1f1b,microbatches=32");
  double big = run(*model, "dp=64,pp=16,ep=64,zero=1,schedule=1f1b,microbatches=32");
  std::printf("1,024-rank compile / 16-rank baseline: %.2fx\n", big / base);
  return 0;
}
