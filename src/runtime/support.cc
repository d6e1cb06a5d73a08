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
  s.max_tp = 1;  // tensor-parallel collectives: not executed yet
  s.max_ep = 1;  // expert all-to-all (flat or HALO): not executed yet
  // af-pipe (M2N, executor_m2n.cc): attention data parallel, experts parallel over ep on the FFN ranks; tested
  // with zero=0, tp=1 and no recomputation (tests/runtime/dist_m2n_mpi_test.cc), so only that is declared.
  s.disaggregate = true;
  return s;
}

Status check_runnable(const Strategy& strategy) {
  const RuntimeSupport s = runtime_support();
  const std::string what = "strategy " + strategy.to_string() + ": ";
  if (strategy.disaggregate && !s.disaggregate) {
    return unimplemented(what + "the runtime does not execute disaggregated attention/FFN (af-pipe) yet");
  }
  if (strategy.disaggregate) {
    if (strategy.tp != 1 || strategy.zero != 0 || strategy.recompute != Recompute::kNone) {
      return unimplemented(what + "the runtime runs af-pipe with tp=1, zero=0 and no recomputation today (got tp=" +
                           std::to_string(strategy.tp) + ", zero=" +
                           std::to_string(strategy.zero) + ", recompute=" + to_string(strategy.recompute) + ")");
    }
    return ok_status();  // ep shards the experts over the FFN ranks (executor_m2n.cc)
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
