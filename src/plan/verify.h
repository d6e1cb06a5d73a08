// Verification of planned strategies by the compiler: a plan the closed-form model likes must also lower to
// per-rank programs that the plan verifier accepts (sends match receives, no deadlock, every rank's peak live
// bytes within the capacity). compile::compile_strategy does the work; this wrapper times it and keeps the
// verdict. Thread-safety: verify_strategy may run concurrently (it shares no state).
#pragma once

#include <memory>
#include <string>

#include "piper/compile/compile.h"
#include "piper/cost/device_model.h"
#include "piper/spec/cluster_spec.h"

#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::plan {

struct Verification {
  bool ok = false;
  std::string message;             // the compiler's error when !ok
  double seconds = 0;              // wall time of the compile
  double compiled_peak_bytes = 0;  // the verifier's largest per-rank peak (0 when it failed before measuring)
  // Rejected by the memory screen (below) from two small compiles, without compiling every microbatch.
  bool screened = false;
};

// The memory screen. A plan with many microbatches is first compiled with two small microbatch counts,
// m1 = 2*pp*vpp and m2 = 2*m1 (same strategy otherwise, global batch dp*mbs*m). When both give the same peak on
// every pipeline rank (a steady-state schedule: 1F1B, ZB-H1, DualPipeV, interleaved keep a bounded number of
// microbatches in flight, so the peak is reached within the first m1 and stays the same for any larger count)
// and that peak exceeds the capacity, the plan is rejected with the verifier's own message from the m2 compile,
// which is the message the full compile gives. Otherwise (peaks that grow with m, such as GPipe's; a plan that
// fits; any compile error) the full plan is compiled as before, so a plan is never accepted by the screen and
// every accepted plan's compile is the full one. Only used when m > m1 + m2 (the screen is cheaper than the
// full compile; compile time grows with the microbatch count). tests/plan/verify_screen_test.cc compares the
// verdicts, messages and peaks with and without it.
struct VerifyOptions {
  bool memory_screen = true;
};

// `train` must carry the strategy's micro batch size and the global batch. capacity_bytes <= 0: no memory check.
Verification verify_strategy(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                             double capacity_bytes, const VerifyOptions& options = {});

// The same verdict from the compile the simulator runs (sim::compile_for_simulation: the plan with this cluster's
// cost annotations; the annotations do not change what the verifier checks, tests/plan/verify_reuse_test.cc). On
// success *compiled holds the result, so the planner's re-scoring simulates it without compiling it again.
Verification verify_strategy_for_simulation(const ModelSpec& model, const ClusterSpec& cluster,
                                            const TrainSpec& train, const Strategy& strategy,
                                            const cost::Calibration& calibration, double capacity_bytes,
                                            std::shared_ptr<compile::CompileResult>* compiled,
                                            const VerifyOptions& options = {});

}  // namespace piper::plan
