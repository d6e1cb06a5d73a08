// The closed-form resource estimate of one training step under a Strategy: memory per pipeline rank,
// compute, exposed communication, pipeline bubble, optimizer step, MFU and tokens/s.
//
// Build a CostModel once per (model, cluster, training setup, calibration); it precomputes everything that does
// not depend on the strategy. estimate() is then pure arithmetic over the strategy: O(pp * chunks) work, no
// heap allocation on success when the same Estimate is reused (its `ranks` vector keeps its capacity), so the
// planner can score well over 100,000 strategies per second on one core (bench/cost/).
// A strategy that is inconsistent with the model, batch or world size returns the validate_for() error (rule
// broken + fix); it never yields a number. Disaggregated (af-pipe) strategies have their own closed form
// (estimate_af.cc: the compiled plan's placement and m2n bytes, below). Thread-safety: a CostModel is immutable
// (but for its HALO memo, which is locked); estimate() may run concurrently.
//
// Step time (bottleneck rank: the largest per-microbatch compute), m microbatches:
//   compute      = m * (t_f + t_b)                     t_b includes W and any recomputed forward
//   exposed_comm = m * (TP collectives + EP all-to-all not hidden by the schedule) + pipeline P2P on the
//                  critical path + the part of the DP gradient/parameter sync not overlapped with compute
//   bubble       = pipeline_model.h with the communication-stretched t_f, t_b
//   optimizer    = bytes the optimizer touches on this rank's shard / achievable memory bandwidth
// af-pipe (disagg=1, estimate_af.cc): attention ranks and FFN ranks run their own layers' parts; per microbatch
// each rank is busy max(compute, its NIC's M2N + ZeRO traffic) (compute, send and receive run on their own
// streams); step = m * that on the slowest rank + the chain's fill + its gradient sync and optimizer step.
// MFU = training_flops_per_token (docs/counting.md: model FLOPs, no recomputation) * tokens/s
//       / (world size * peak FLOP/s of the compute dtype).
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/cost/device_model.h"
#include "piper/cost/layer_cost.h"
#include "piper/cost/model_state.h"
#include "piper/cost/network.h"
#include "piper/cost/task_profile.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::cost {

struct MemoryBreakdown {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
  double activations = 0;
  double buffers = 0;  // communication staging, ZeRO gather/bucket buffers, recompute scratch, workspace
  double total() const { return params + grads + optimizer + activations + buffers; }
};

struct TimeBreakdown {
  double compute_s = 0;
  double exposed_comm_s = 0;
  double bubble_s = 0;
  double optimizer_s = 0;
};

// Exposed communication per step by kind (sums to TimeBreakdown::exposed_comm_s).
struct CommBreakdown {
  double tp_s = 0;
  double ep_s = 0;
  double pp_s = 0;
  double dp_s = 0;
};

struct Estimate {
  bool fits = false;
  double step_time_s = 0;
  double mfu = 0;
  double tokens_per_s = 0;
  double tokens_per_step = 0;
  double device_memory_bytes = 0;
  int worst_rank = 0;                  // pipeline rank with the largest memory total
  int bottleneck_rank = 0;             // pipeline rank with the largest compute per microbatch
  MemoryBreakdown memory;              // of worst_rank
  std::vector<MemoryBreakdown> ranks;  // per pipeline rank (every dp/tp/ep coordinate of a stage is alike)
  TimeBreakdown time;
  CommBreakdown comm;
  // One microbatch on the bottleneck rank (inputs of the bubble formula).
  double t_f_s = 0, t_b_s = 0, t_w_s = 0;

  Json to_json() const;
};

class CostModel {
 public:
  // Validates the inputs (model, cluster, train, byte convention) once.
  static Result<CostModel> create(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                                  const Calibration& calibration = {});

  // Fills *out. Errors: the strategy's validate_for() message, or Unimplemented for what has no closed form (a
  // registered schedule; af-pipe with tp > 1).
  Status estimate(const Strategy& strategy, Estimate* out) const;
  Result<Estimate> estimate(const Strategy& strategy) const;

  const ModelSpec& model() const { return model_; }
  const ClusterSpec& cluster() const { return cluster_; }
  const TrainSpec& train() const { return train_; }
  const PartTable& parts() const { return table_; }
  const Network& network() const { return net_; }
  // The device at the block GEMMs' format (TrainSpec::gemm_dtype: fp8 under fp8/mxfp8), and the one every other
  // part runs at (the parameters' dtype: the attention core, router, embedding, head and norms stay in bf16).
  const DeviceModel& device() const { return device_; }
  const DeviceModel& device_for(Part part) const;
  // Bytes one token's hidden state takes in the MoE dispatch (TrainSpec::dispatch_bytes) and in the combine and
  // the backward all-to-alls (TrainSpec::comm_bytes): DeepSeek-V3 dispatches fp8 and combines bf16.
  double dispatch_bytes_per_token() const { return table_.hidden * train_.dispatch_bytes(); }
  double combine_bytes_per_token() const { return table_.hidden * train_.comm_bytes(); }
  const ByteConvention& bytes() const { return bytes_; }
  const Calibration& calibration() const { return calibration_; }
  // HALO all-to-all times are memoised per (EP group shape, link model, tokens) by default: a pure function of
  // those, and O(group size^2) to build (halo_traffic.h), while the planner asks for a few groups 100,000s of
  // times. Copies of a CostModel share the memo (thread-safe). set_halo_memo(false) recomputes every time (the
  // former path, for benchmarks and tests); call it before sharing the model between threads.
  void set_halo_memo(bool on);
  // Use `other`'s memo (both on): the key holds every input (shape, routing, link, tokens, bytes per token), so
  // models of the same cluster that differ elsewhere (the planner's one per micro batch size) can share it.
  void share_halo_memo(const CostModel& other);
  bool halo_memo() const { return halo_memo_ != nullptr; }
  double flops_per_token() const { return flops_per_token_; }
  // MoE layers among layers [0, x). Inline: the ZeRO-2/3 cycle (estimate_dp.cc) asks for every layer it visits.
  int moe_layers_before(int x) const {
    if (!model_.is_moe()) return 0;
    const int k = model_.moe.first_k_dense_layers;
    const int f = std::max(1, model_.moe.layer_freq);
    x = std::min(x, model_.num_layers);
    return x <= k ? 0 : (x - k + f - 1) / f;
  }
  // One microbatch's part shape on a rank under `strategy` (layer_cost.h), with `cal`'s expert load and
  // attention-score traffic: what the closed form and the simulator's task prices both cost.
  PartShape part_shape(const Strategy& strategy, const Calibration& cal) const;
  // The calibration's task profile of this model at a microbatch of `tokens` (cost/task_profile.h): what the
  // simulator and the closed form scale each task's price by; all 1 without one.
  TaskScales task_scales(double tokens) const { return task_profile_.at(tokens); }

 private:
  CostModel(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train, const Calibration& cal,
            const ByteConvention& bytes);
  // The af-pipe closed form (estimate_af.cc).
  Status estimate_af_pipe(const Strategy& s, Estimate* out) const;
  // Per-layer EP time of a microbatch of `tokens` (dispatch and combine forward, their transposes backward) on
  // `ep_group` under the strategy's all-to-all algorithm; 0 without expert parallelism.
  Result<double> ep_layer_s(const Strategy& s, const GroupLayout& ep_group, double tokens) const;
  // Per-layer EP time of the HALO all-to-alls for tokens per rank (dispatch x2 dtypes, combine x2).
  Result<double> halo_ep_layer_s(const GroupLayout& ep_group, double tokens) const;

  struct HaloMemo {
    using Key = std::tuple<int, int, int, int, int, int, int, double, double, double, double, double, double, double>;
    std::mutex mutex;
    std::map<Key, double> time_s;
  };

  ModelSpec model_;
  ClusterSpec cluster_;
  TrainSpec train_;
  Calibration calibration_;
  ByteConvention bytes_;
  PartTable table_;
  Network net_;
  DeviceModel device_;
  DeviceModel device_hp_;  // the parameters' dtype (bf16), for the parts that never run in fp8
  double flops_per_token_ = 0;
  TaskProfileTable task_profile_;
  std::shared_ptr<HaloMemo> halo_memo_;  // null: no memo
};

}  // namespace piper::cost
