#include "piper/runtime/support.h"

#include <algorithm>

#include "piper/base/strings.h"

namespace piper::runtime {

RuntimeSupport runtime_support() {
  RuntimeSupport s;
  // Every pipeline schedule the compiler lowers runs (tests/runtime/dist_parity_mpi_test.cc, trainer_test.cc).
  s.schedules = {"1f1b", "gpipe", "interleaved", "zb-h1", "dualpipev"};
  s.zero = {0, 1, 2, 3};
  s.recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  // tp=2 with sequence parallelism (executor_tp.cc): tp2, dp2 x tp2, pp2 x tp2 (1f1b) and dp2 x tp2 with
  // zero=1 and 3 (tests/runtime/dist_parity_mpi_test.cc).
  s.max_tp = 2;
  // Expert all-to-all, flat or HALO (executor_ep.cc): ep=2 and 4 over dp, dp4 x ep2, pp2 x ep2 (1f1b) with zero=0
  // and 3 (dist_ep_mpi_test.cc, dist_parity_mpi_test.cc); zero=2 and 3 with dp4 x ep2 by hand (docs/runtime.md).
  s.max_ep = 4;
  // af-pipe (M2N, executor_m2n.cc): attention data parallel, experts parallel over ep on the FFN ranks; tested
  // with zero=0, tp=1 and no recomputation (tests/runtime/dist_m2n_mpi_test.cc), so only that is declared.
  s.disaggregate = true;
  return s;
}

Status check_runnable(const Strategy& strategy) {
  const RuntimeSupport s = runtime_support();
  const std::string what = "strategy " + strategy.to_string() + ": ";
  if (!strategy.recompute_modules.empty()) {
    return unimplemented(what + "recompute_modules=" + join(strategy.recompute_modules, "+") +
                         " (Megatron's module recomputation) is modelled by estimate and simulate only; the runtime "
                         "keeps these activations: drop recompute_modules, or use recompute=selective or full");
  }
  if (strategy.disaggregate && !s.disaggregate) {
    return unimplemented(what + "the runtime does not execute disaggregated attention/FFN (af-pipe) yet");
  }
  if (strategy.disaggregate) {
    if (strategy.tp != 1 || strategy.zero != 0 || strategy.recompute != Recompute::kNone) {
      return unimplemented(what + "the runtime runs af-pipe with tp=1, zero=0 and no recomputation today (got tp=" +
                           std::to_string(strategy.tp) + ", zero=" + std::to_string(strategy.zero) +
                           ", recompute=" + to_string(strategy.recompute) + ")");
    }
    return ok_status();  // ep shards the experts over the FFN ranks (executor_m2n.cc)
  }
  if (strategy.tp_overlap) {
    return unimplemented(what + "tp_overlap=1 is modelled by estimate and simulate only; drop tp_overlap");
  }
  if (std::find(s.schedules.begin(), s.schedules.end(), strategy.schedule) == s.schedules.end()) {
    return unimplemented(what + "the runtime does not run schedule " + strategy.schedule + " yet; it runs " +
                         join(s.schedules, ", "));
  }
  if (strategy.tp > s.max_tp) {
    return unimplemented(what + "tp=" + std::to_string(strategy.tp) +
                         ": the runtime runs tp <= " + std::to_string(s.max_tp) + " today");
  }
  if (strategy.ep > s.max_ep) {
    return unimplemented(what + "ep=" + std::to_string(strategy.ep) +
                         ": the runtime runs ep <= " + std::to_string(s.max_ep) + " today");
  }
  if (strategy.tp > 1) {
    if (!strategy.sp || strategy.etp != 1) {
      return unimplemented(what + "the runtime runs tp>1 with sequence parallelism and unsliced experts (sp=1, " +
                           "etp=1) today (got sp=" + std::to_string(strategy.sp ? 1 : 0) +
                           ", etp=" + std::to_string(strategy.etp) + ")");
    }
    if (strategy.ep > 1) {
      return unimplemented(what + "tp>1 with ep>1 is not executed yet: use tp or ep, not both");
    }
  }
  if (strategy.tp > 1 || strategy.ep > 1) {
    const std::string dim = strategy.tp > 1 ? "tp=" + std::to_string(strategy.tp) : "ep=" + std::to_string(strategy.ep);
    if (strategy.schedule != "1f1b") {
      return unimplemented(what + dim + " is run with schedule 1f1b only today (got " + strategy.schedule + ")");
    }
    if (strategy.tp > 1 && strategy.pp > 1 && strategy.zero > 0) {
      return unimplemented(
          what + "tp>1 with pp>1 is run with zero=0 only today (got zero=" + std::to_string(strategy.zero) + ")");
    }
    if (strategy.ep > 1 && strategy.a2a != "flat" && strategy.a2a != "halo") {
      return unimplemented(what + "ep>1 runs with a2a=flat or a2a=halo (got a2a=" + strategy.a2a + ")");
    }
  }
  if (std::find(s.zero.begin(), s.zero.end(), strategy.zero) == s.zero.end()) {
    std::vector<std::string> z;
    for (int v : s.zero) z.push_back(std::to_string(v));
    return unimplemented(what + "zero=" + std::to_string(strategy.zero) + ": the runtime runs zero in {" +
                         join(z, ", ") + "}");
  }
  if (std::find(s.recompute.begin(), s.recompute.end(), strategy.recompute) == s.recompute.end()) {
    return unimplemented(what + "recompute=" + to_string(strategy.recompute) + " is not executed yet");
  }
  return ok_status();
}

}  // namespace piper::runtime
