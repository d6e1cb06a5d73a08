// What a model's task profile (Calibration::task_profiles, measured by `piper calibrate --model M`) makes of its
// task prices: each task kind's measured / priced ratio, at the tokens of the microbatch being priced.
//
// The profile times model M's own tasks as the runtime runs them on one rank alone with t kernel threads (the
// runtime's per-task clock, every step after the first) beside their price from the same file's device figures.
// A strategy's task of key K ("attn.F", "experts.BW", "update") on a rank with t threads is then priced at its
// price times measured / priced of K at t threads, interpolated linearly in log(tokens) between the profile's
// microbatch sizes and held at the nearest one outside them; a B or W without points of its own takes its chunk's
// BW (fused B + W), a key without points keeps its price. It applies where the rank's thread count is known
// (Calibration::rank_threads: `piper train`, `plan --local-ranks`, `--strategy auto`), to the simulator and the
// closed form alike (CostModel::task_scales). What the scale cannot carry: the rows of a routed expert's calls
// under ep (the profile ran every expert on one rank) and how sharing cores with other ranks slows a task
// (core_sharing prices that).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "piper/cost/device_model.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/part.h"

namespace piper::cost {

struct TaskScales {
  std::array<std::array<double, 3>, kNumParts> chunk{};  // by chunk part (spec/part.h), F, B, W
  double update = 1;
  TaskScales();
  // A priced part's scale for task k (0 F, 1 B, 2 W): a cost part that is no chunk (the attention's norms and
  // core) takes its chunk's, the attention's.
  double of(Part part, int k) const;
};

// One model's profile at one thread count, prepared once (a CostModel holds one): each key's points as
// (log tokens, measured / priced), ascending.
class TaskProfileTable {
 public:
  TaskProfileTable() = default;  // none: every scale 1
  // The profile of `model` at `seq` (its name, parameter count and seq) at c.rank_threads; none when nothing
  // matches.
  static TaskProfileTable find(const Calibration& c, const ModelSpec& model, int64_t seq);
  bool applies() const { return applies_; }
  TaskScales at(double tokens) const;

 private:
  using Curve = std::vector<std::pair<double, double>>;
  static constexpr int kBW = 3;
  std::array<std::array<Curve, 4>, kNumParts> chunk_;  // F, B, W, BW
  Curve update_;
  bool applies_ = false;
};

// For the reports: "task prices scaled by the measured profile of M (seq S, t thread(s), N points)", or why they
// are not ("" when the calibration has no profiles at all); and the core sharing of its own once applied.
std::string task_profile_note(const Calibration& c, const ModelSpec& model, int64_t seq);

// The core sharing measured with the model's own steps (Calibration::TaskProfile::sharing) replaces c's (the
// synthetic GEMM's) when c has a profile of `model` at `seq` (its name, parameter count and seq) that measured one:
// the simulator's pool and the closed form's static share then slow the model's tasks as running together slowed
// them. Whether it did.
bool apply_model_sharing(Calibration* c, const ModelSpec& model, int64_t seq);

}  // namespace piper::cost
