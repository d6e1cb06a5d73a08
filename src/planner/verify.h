// Verification of planned strategies by the compiler: a plan the closed-form model likes must also lower to
// per-rank programs that the plan verifier accepts (sends match receives, no deadlock, every rank's peak live
// bytes within the capacity). compile::compile_strategy does the work; this wrapper times it and keeps the
// verdict. Thread-safety: verify_strategy may run concurrently (it shares no state).
#pragma once

#include <limits>
#include <memory>
#include <string>

#include "piper/compile/compile.h"
#include "piper/cost/device_model.h"
#include "piper/spec/cluster_spec.h"

#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::planner {

struct Verification {
  bool ok = false;
  std::string message;             // the compiler's error when !ok
  double seconds = 0;              // wall time of the compile
  double compiled_peak_bytes = 0;  // the verifier's largest per-rank peak (0 when it failed before measuring)
  // Decided by the memory screen (below) from two small compiles, without compiling every microbatch.
  bool screened = false;
  // Screened and accepted: the full compile's wall time extrapolated from the larger screen compile (compile time
  // grows linearly with the microbatch count); re-scoring does not start a simulation it cannot compile in time.
  double full_compile_estimate_s = 0;
};

// The memory screen. A plan with many microbatches is first compiled with two small microbatch counts,
// m1 = 2*pp*vpp and m2 = 2*m1 (same strategy otherwise, global batch dp*mbs*m). When both give the same peak on
// every pipeline rank (a steady-state schedule: 1F1B, ZB-H1, DualPipeV, interleaved and ZeRO-3 keep a bounded
// number of microbatches in flight, so the peak is reached within the first m1 and is the same for any larger
// count), the verifier's verdict on the m2 compile is the plan's: a rejection carries the message the full
// compile gives and an acceptance its peak (accept_steady; the m2 program is the full one's with fewer
// steady-state repetitions, so sends, receives and dependencies match alike). Otherwise (peaks that grow with
// m, such as GPipe's; any compile error) the full plan is compiled as before. Only used when m > m1 + m2 (the
// screen is then cheaper than the full compile, whose time grows with the microbatch count).
// tests/planner/verify_screen_test.cc compares the verdicts, messages and peaks with and without it.
struct VerifyOptions {
  bool memory_screen = true;
  bool accept_steady = true;  // false: only rejections are screened, every accepted plan is compiled in full
  // verify_strategy_for_simulation: a plan that fits is still compiled in full (and kept) when its estimated full
  // compile (the m1 compile's time x m/m1, then the m2 compile's) takes at most this many seconds, without the m2
  // compile when the first estimate allows it; otherwise it is returned, screened, without a compile.
  double max_full_compile_s = std::numeric_limits<double>::infinity();
};

// `train` must carry the strategy's micro batch size and the global batch. capacity_bytes <= 0: no memory check.
Verification verify_strategy(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                             double capacity_bytes, const VerifyOptions& options = {});

// The same verdict from the compile the simulator runs (sim::compile_for_simulation: the plan with this cluster's
// cost annotations; the annotations do not change what the verifier checks, tests/planner/verify_reuse_test.cc). On
// success *compiled holds the result, so the planner's re-scoring simulates it without compiling it again, except
// for a plan the memory screen accepted whose full compile would take over options.max_full_compile_s.
Verification verify_strategy_for_simulation(const ModelSpec& model, const ClusterSpec& cluster,
                                            const TrainSpec& train, const Strategy& strategy,
                                            const cost::Calibration& calibration, double capacity_bytes,
                                            std::shared_ptr<compile::CompileResult>* compiled,
                                            const VerifyOptions& options = {});

}  // namespace piper::planner
