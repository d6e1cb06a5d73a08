// `piper calibrate`'s attention stage: the runtime's CPU attention core (kernels::attention_forward; then
// attention_probs and attention_backward_input, as the runtime's backward recomputes the probabilities) at one
// thread, against what the device model charges for its FLOPs at the calibrated GEMM rate. What it takes beyond
// them (the causal softmax over rows of scores, writing and reading the score square) becomes
// cost::Calibration::attention_score_bytes: bytes per score element at the calibrated bandwidth, the figure the
// model charges an attention that materialises its scores (cost/layer_cost.cc, Part::kAttentionCore: forward
// once, backward twice), fitted so that forward + backward together take the measured time. Two things the one
// figure folds in: the block-causal kernel executes more of the score square than the model's causal half (75 % at
// seq 128, 56 % at 512), so the per-score figure falls with the length (the file takes the mean of the two); and
// a fit of 0 (kernels no slower than their FLOPs' price) would make the model price the backward as a fused
// kernel's (2.5x the forward's FLOPs instead of 2x), which no measurement here has come near.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "piper/base/status.h"
#include "piper/cost/device_model.h"

namespace piper::cli {

struct AttentionShapePoint {
  int64_t seq = 0;
  double forward_s = 0, backward_s = 0;  // measured, one call each
  double flops_s = 0;                    // the model's price of their FLOPs (forward + backward)
  double bytes_per_score = 0;            // the fit at this length
};

struct AttentionFit {
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0;
  std::vector<AttentionShapePoint> points;  // one per sequence length
  double bytes_per_score = 0;               // their mean: the file's attention_score_bytes
};

// Times the kernels at each sequence length with `time_call` (seconds per call of its argument, the caller's
// timing of every other kernel) and fits the bytes against `device` (the calibrated one-thread device model).
Result<AttentionFit> measure_attention(const cost::DeviceModel& device,
                                       const std::function<double(const std::function<void()>&)>& time_call);

}  // namespace piper::cli
