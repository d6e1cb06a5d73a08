// The independent check of the per-layer pricing (issue 33): one transformer layer priced with Piper's per-task
// costs (cost/layer_cost.h part_cost + cost/device_model.h DeviceModel, the pricing the closed form and the
// simulator share) and the tensor-parallel collectives (cost/network.h), compared with measured forward and
// backward times of one layer (Korthikanti et al., MLSys'23, arXiv:2205.05198, Table 4: the 22B model on A100).
// No pipeline, schedule, data parallelism or optimizer: what the step-time tables cannot separate from the
// composition of the step. Rows are reported by `make fidelity` and checked by layer_fidelity_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fidelity_rows.h"
#include "piper/base/status.h"
#include "piper/cost/device_model.h"

namespace piper::fidelity {

// What the layer's backward re-runs, as the source ran it. kAttentionCore: the paper's selective recomputation
// (QK^T, softmax, softmax dropout, attention over V; not the QKV and output projections, which Piper's
// Recompute::kSelective also re-runs). kFull: the whole forward, its tensor-parallel collectives included.
enum class LayerRecompute { kNone, kAttentionCore, kFull };

struct LayerRow {
  std::string name;
  std::string source;
  std::string model;    // inline JSON
  std::string cluster;  // preset name
  int64_t seq_len = 0;
  int64_t mbs = 0;
  int tp = 1;
  bool sp = false;
  LayerRecompute recompute = LayerRecompute::kNone;
  double published_forward_ms = 0, published_backward_ms = 0;
  double lo = 0, hi = 0;  // band for predicted / published, on forward, backward and their sum
  RowStatus status = RowStatus::kRegression;
  std::string note;  // why a gap is what it is
  cost::Calibration calibration;
};

struct LayerResult {
  double compute_forward_s = 0, compute_backward_s = 0;  // per-task pricing alone
  double tp_forward_s = 0, tp_backward_s = 0;            // tensor-parallel collectives, not overlapped
  double forward_s() const { return compute_forward_s + tp_forward_s; }
  double backward_s() const { return compute_backward_s + tp_backward_s; }
  // Forward of the QKV and output projections: what Piper's Recompute::kSelective re-runs in the backward on top of
  // the paper's selective recomputation (which re-runs the attention core only).
  double attention_projections_forward_s = 0;
  double forward_ratio = 0, backward_ratio = 0, combined_ratio = 0;  // predicted / published
  double lo = 0, hi = 0;
  bool in_band() const;  // all three ratios within [lo, hi]
};

// Korthikanti et al. Table 4: the five per-layer experiments on the 22B model (Table 3: tp 8, micro batch 4).
std::vector<LayerRow> korthikanti_layer_rows();

Result<LayerResult> evaluate_layer(const LayerRow& row);

}  // namespace piper::fidelity
