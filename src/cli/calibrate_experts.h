// `piper calibrate`'s experts stage: the runtime's routed-expert kernels as its experts chunk calls them
// (runtime/model/chunks/experts.cc: permute_forward, expert_swiglu_forward and unpermute_forward forward;
// unpermute_backward_input, expert_swiglu_backward_input and permute_backward_input for the input gradient;
// expert_swiglu_backward_weight for the weight gradient) at one thread, on layers of kExperts SwiGLU experts whose
// weights (and weight gradients) are cycled through more memory than the last-level cache holds, so that every
// call finds its expert's weights gone, as a step does when it comes back to an expert a microbatch later. Each
// layer is timed at three row counts per expert (32, 128, 512: a microbatch of one, four and sixteen sequences of
// 128 tokens on tiny-moe), and what it takes beyond the device model's price of the same layer (cost::part_cost
// for Part::kExperts on the calibrated one-thread device: roofline plus pointwise traffic) is divided by its
// experts and fitted by least squares as a + b x rows per expert: the intercept a, the cost of one expert call that
// no FLOP or byte count prices, becomes cost::Calibration::expert_call_{forward,backward_input,backward_weight}_s,
// the slope b (what each row costs beyond the GEMM curve: the rows and the SwiGLU's intermediates outgrow the
// core's cache) expert_row_*_s, each clamped at 0.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "piper/base/status.h"
#include "piper/cost/device_model.h"

namespace piper::cli {

// One row count: per layer of `experts` expert calls, each task's measured and priced seconds.
struct ExpertRowsPoint {
  int64_t rows_per_expert = 0;
  double measured_s[3] = {0, 0, 0};  // forward, input gradient, weight gradient: one call of the layer each
  double priced_s[3] = {0, 0, 0};    // the model's price of the same layer (without the per-call cost)
  // (measured - priced) / experts: the time per expert call beyond the price
  double excess_per_call_s[3] = {0, 0, 0};
};

struct ExpertFit {
  int64_t hidden = 0, width = 0, experts = 0, top_k = 0;
  int64_t layers = 0;                   // layers of weights cycled through
  double weight_bytes = 0;              // their weights (the weight gradient's task cycles as many gradient bytes too)
  std::vector<ExpertRowsPoint> points;  // one per row count, ascending
  // Per task, the least-squares line (fitted_a + fitted_b x rows per expert) and the line with both >= 0 that the
  // file keeps: a < 0 refits through the origin, b < 0 keeps the mean with slope 0.
  double call_s[3] = {0, 0, 0};     // the file's expert_call_*_s
  double per_row_s[3] = {0, 0, 0};  // the file's expert_row_*_s
  double fitted_a[3] = {0, 0, 0}, fitted_b[3] = {0, 0, 0};
};

// Names of the three tasks as the report and --json write them.
extern const char* const kExpertTaskNames[3];

// Times the kernels with `time_call` (seconds per call of its argument; each call runs one layer and moves on to
// the next layer's weights) and fits against `device` (the calibrated one-thread device model). An error when a
// call never ran undisturbed (infinite time) or a fitted figure exceeds what a calibration file accepts.
Result<ExpertFit> measure_experts(const cost::DeviceModel& device,
                                  const std::function<double(const std::function<void()>&)>& time_call);

}  // namespace piper::cli
