// Verification of planned strategies by the compiler: a plan the closed-form model likes must also lower to
// per-rank programs that the plan verifier accepts (sends match receives, no deadlock, every rank's peak live
// bytes within the capacity). compile::compile_strategy does the work; this wrapper times it and keeps the
// verdict. Thread-safety: verify_strategy may run concurrently (it shares no state).
#pragma once

#include <cstdint>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
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
  // Taken from a VerifyCache (below): the verdict of an equivalent candidate; `seconds` is then the look-up's wall
  // time (including any wait for that candidate's compile), the other fields are that candidate's.
  bool cached = false;
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
  // Compile with CompileOptions::data_edges (Instruction::inputs/outputs, read by neither the verifier nor the
  // simulator): false is cheaper with the same verdicts and step times (SearchOptions::data_edges).
  bool data_edges = false;
};

class VerifyCache;

// `train` must carry the strategy's micro batch size and the global batch. capacity_bytes <= 0: no memory check.
Verification verify_strategy(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                             double capacity_bytes, const VerifyOptions& options = {});

// The same verdict from the compile the simulator runs (sim::compile_for_simulation: the plan with this cluster's
// cost annotations; the annotations do not change what the verifier checks, tests/planner/verify_reuse_test.cc). On
// success *compiled holds the result, so the planner's re-scoring simulates it without compiling it again, except
// for a plan the memory screen accepted whose full compile would take over options.max_full_compile_s.
// With a cache, the verdict verify_strategy would give is offered to it (VerifyCache::offer), so that candidates
// equivalent to this one are not compiled again.
Verification verify_strategy_for_simulation(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                            const Strategy& strategy, const cost::Calibration& calibration,
                                            double capacity_bytes, std::shared_ptr<compile::CompileResult>* compiled,
                                            const VerifyOptions& options = {}, VerifyCache* cache = nullptr);

// Verdicts shared between candidates the verifier cannot tell apart (SearchOptions::verify_cache).
//
// verify_strategy's verdict (ok, message, compiled peak, screened, the screen's full-compile estimate) is a function
// of what compile::compile_strategy and the memory screen read. They do not read Strategy::order (a rank layout:
// the compiled plan numbers pipeline ranks and runs one program template per pipeline rank); Strategy::a2a reaches
// only Instruction::algorithm, which the plan verifier does not read. The only place they enter is the screen's
// Strategy::validate_for of its two small variants, whose outcomes are part of the key. (Strategy::etp is part of
// the key: the compiler slices the experts over etp, which changes their state and activations.) So candidates
// that differ only in order and a2a (the search keeps such variants when their closed-form step times differ) get
// the same verdict, messages included;
// tests/planner/verify_cache_test.cc compares cached and uncached verdicts, half of them rejections.
//
// One cache serves one model and one TrainSpec apart from micro_batch_size (a search). Thread-safe: concurrent
// calls with the same key compile once; the others wait for that verdict.
class VerifyCache {
 public:
  // verify_strategy's verdict, computed once per key.
  Verification verify(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy, double capacity_bytes,
                      const VerifyOptions& options = {});
  int64_t hits() const;
  // Stores `verdict` under the strategy's key unless the key has one. The caller promises that it is the verdict
  // verify_strategy gives for these arguments (verify_strategy_for_simulation offers only such verdicts: the
  // screen's own, the full compile's where the screen does not decide, and a screened acceptance where it skipped
  // its second small compile and the full compile's per-rank peaks equal the first's; the compile time estimate is
  // then the full compile's measured time).
  void offer(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy, double capacity_bytes,
             const VerifyOptions& options, const Verification& verdict);

  // The key: the strategy with order and a2a reset, the train's mbs and global batch, the capacity, the options
  // that change the verdict, and whether the screen's small variants validate.
  static std::string key(const ModelSpec& model, const TrainSpec& train, const Strategy& strategy,
                         double capacity_bytes, const VerifyOptions& options);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_future<Verification>> verdicts_;
  int64_t hits_ = 0;
};

}  // namespace piper::planner
