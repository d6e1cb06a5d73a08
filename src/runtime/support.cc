#include "piper/runtime/support.h"

#include <algorithm>

#include "piper/base/strings.h"

namespace piper::runtime {

RuntimeSupport runtime_support() {
  RuntimeSupport s;
  // Every pipeline schedule the compiler lowers runs, with tp and with ep, at every ZeRO stage
  // (tests/runtime/dist_parity_mpi_test.cc: Pp2*, Pp2Ep2*, Pp2Tp2*, Dp2Pp2Tp2Zero1; trainer_test.cc).
  s.schedules = {"1f1b", "gpipe", "interleaved", "zb-h1", "dualpipev"};
  s.zero = {0, 1, 2, 3};
  s.recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  // No runtime bound on tp or ep: tp (with sequence parallelism, exec/executor_tp.cc) must divide the heads and ep
  // the experts, which Strategy::validate_for checks; tp splits the embedding and the head by vocabulary rows too
  // and must divide vocab_size (the runtime does not pad it: Trainer::create names the fix, make_tp_slice). Tested:
  // tp=2 and 4 (Parity.Tp4), ep=2, 4 and 8 (Parity.Ep8), tp x ep with every ZeRO stage and schedule (Parity.*Tp2Ep2*),
  // folded or not (Parity.*Fold*: ep=2 and 4 over tp*dp, ZeRO 0-3, dualpipev).
  s.max_tp = 0;
  s.max_ep = 0;
  // af-pipe (M2N, executor_m2n.cc) with every ZeRO stage and recomputation, equal or uneven attention:FFN splits
  // (dist_m2n_mpi_test.cc: 2:2, 4:4, 1:3, 2:1, 4:2), and with tp (sequence parallel; each rank exchanges its token
  // slice with the other side's ranks of its tp coordinate, Plan::m2n_peers): 2:2 and 2:4 at tp=2, and
  // dp=2 x tp=2 x ep=2 with ZeRO-3 (AfPipeParity.Tp2*, Dp2Tp2Ep2Zero3).
  s.disaggregate = true;
  return s;
}

Status check_runnable(const Strategy& strategy) {
  const RuntimeSupport s = runtime_support();
  const std::string what = "strategy " + strategy.to_string() + ": ";
  // recompute_modules (Megatron's module recomputation) runs: the router drops its norm output ("layernorm") and
  // the experts their activation output ("moe_act") after F and recompute them in the backward
  // (model/chunks/router.cc, experts.cc; Parity.RecomputeModules*, dist_parity_mpi_test.cc).
  if (strategy.disaggregate && !s.disaggregate) {
    return unimplemented(what + "the runtime does not execute disaggregated attention/FFN (af-pipe) yet");
  }
  if (strategy.disaggregate) {
    // ep shards the experts over the FFN ranks of each tp coordinate; tp slices the tokens (sequence parallelism)
    // on both sides, and the FFN ranks sum their experts' gradients over tp (executor_m2n.cc, executor_tp.cc).
    return ok_status();
  }
  // tp_overlap=1 runs the compiler's pieces: ring steps of the all-gather, row pieces of the first and last GEMMs,
  // row blocks of the reduce-scatter (exec/executor_tp_overlap.cc; Parity.Tp2Overlap*, dist_parity_mpi_test.cc).
  // A schedule registered with register_schedule runs as the compiler lowers it (dist_directives_mpi_test.cc).
  if (strategy.schedule_kind() != ScheduleKind::kCustom &&
      std::find(s.schedules.begin(), s.schedules.end(), strategy.schedule) == s.schedules.end()) {
    return unimplemented(what + "the runtime does not run schedule " + strategy.schedule + " yet; it runs " +
                         join(s.schedules, ", "));
  }
  // fold=1 (MoE parallel folding) runs with tp x ep: the runtime takes the expert groups from the plan
  // (Plan::group_ranks, DistContext) and reduces the experts over its edp group (Parity.*Fold*).
  // Expert tensor parallelism (etp > 1, unfolded: Strategy::validate refuses fold=1 with it, and validate_for sp=0
  // with tp on a MoE model) runs with ep > 1 and with ep = 1: the experts are sliced over the plan's etp group,
  // which gathers and reduce-scatters their rows (exec/executor_ep_etp.cc; Parity.*Etp2*, dist_parity_mpi_test.cc).
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
