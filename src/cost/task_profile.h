// What a model's task profile (Calibration::task_profiles, measured by `piper calibrate --model M`) makes of its
// task prices: each task kind's measured / priced ratio, at the tokens of the microbatch being priced.
//
// The profile times model M's own tasks as the runtime runs them on one rank alone with t kernel threads (the
// runtime's per-task clock, every step after the first) beside their price from the same file's device figures.
// A strategy's task of key K ("attn.F", "experts.BW", "update") on a rank with t threads is then priced at its
// roofline price times measured / priced of K at t threads, interpolated linearly in log(tokens) between the
// profile's microbatch sizes and held at the nearest one outside them. What the scale cannot carry: the tokens of
// a routed expert's calls under ep (the profile ran every expert on one rank) and how sharing cores with other
// ranks slows a task (core_sharing prices that).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "piper/cost/device_model.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/part.h"

namespace piper::cost {

struct TaskScales {
  std::array<std::array<double, 3>, kNumParts> chunk{};  // by chunk part (spec/part.h), F, B, W
  double update = 1;
  bool applied = false;  // a profile matched the model, seq and threads
  TaskScales();
  // A priced part's scale for task k (0 F, 1 B, 2 W): a cost part that is no chunk (the attention's norms and
  // core) takes its chunk's, the attention's.
  double of(Part part, int k) const;
};

// The profile of `model` at `seq` (its name, parameter count and seq), or nullptr.
const Calibration::TaskProfile* find_task_profile(const Calibration& c, const ModelSpec& model, int64_t seq);

// The scales for a microbatch of `tokens` on a rank of c.rank_threads threads; all 1 (applied false) without a
// matching profile or points at that thread count. A key without points keeps 1; a B or W without its own points
// takes its chunk's BW.
TaskScales task_scales(const Calibration& c, const ModelSpec& model, int64_t seq, double tokens);

// For the reports: "task prices scaled by the measured profile of M (seq S, t thread(s), N points)", or why they
// are not ("" when the calibration has no profiles at all).
std::string task_profile_note(const Calibration& c, const ModelSpec& model, int64_t seq);

}  // namespace piper::cost
