// Compute time on one device: a roofline with shape-dependent GEMM efficiency, overridable by calibration.
//
//   time = max(flops / (peak * eff(d)), bytes / (memory_bw * memory_bw_efficiency))
//   eff(d) = the device's measured GEMM table at d (cost/gemm_table.h), where it has one, else
//   eff(d) = gemm_efficiency * d / (d + gemm_half_dim)        d = the smallest GEMM dimension
//
// gemm_table (default true): price GEMMs from the measured table of the device (H100 SXM BF16: OpenXLA's sm_90
// data) unless the calibration sets gemm_efficiency (a measurement of its own); false: the curve everywhere.
//
// The saturating curve captures why skinny GEMMs (few tokens per expert) run far below peak even when the
// roofline says they are compute-bound: tile quantisation and too few thread blocks to fill the device.
// Defaults [inferred, to be replaced by measurement]: gemm_efficiency from the DeviceSpec (0.8 on NVIDIA presets),
// gemm_half_dim = 64 (d = 64 reaches half the large-GEMM efficiency, d = 256 80 %, d = 4096 98 %), in line with
// published cuBLAS bf16 sweeps on A100/H100 where M = 128 runs at roughly two thirds of the square-GEMM
// throughput. A calibration JSON file (written from `piper bench kernels` measurements) overrides any field:
//   {"gemm_efficiency": 0.72, "gemm_half_dim": 96, "memory_bw_efficiency": 0.85,
//    "workspace_bytes": 1073741824, "expert_load_imbalance": 1.1, "attention_score_bytes": 13}
// and an optional "source" string saying where the numbers come from (`piper calibrate` writes one).
// attention_score_bytes (default 0 = fused/flash attention): device-memory bytes moved per attention-score
// element in the forward by an attention that materialises the s x s scores per head (Megatron-LM before
// FlashAttention: QK^T writes 2 B, fused scale-mask-softmax reads 2 + writes 2, dropout reads 2 + writes 2 and
// a 1 B mask, AV reads 2 = 13 B [inferred from that kernel sequence]); the backward moves twice as much. Piper's
// CPU runtime materialises its fp32 scores too; `piper calibrate` times its attention kernels and writes what they
// take beyond their FLOPs as this figure (cli/calibrate_attention.h: the softmax rows, the score square's traffic,
// the backward's recomputed probabilities; 24-36 B on the build machine).
// recompute_reruns_tp_collectives (default false): the recomputed forward of a tensor-parallel chunk runs its
// tensor-parallel collectives again. Piper's runtime recomputes a chunk from its kept input and never needs the
// reduced output again, so it does not; Megatron-LM's full recomputation (torch.utils.checkpoint over whole
// transformer layers, megatron/model/transformer.py `_checkpointed_forward`) re-executes the layer's forward,
// both tensor-parallel all-reduces included: 6 per layer and microbatch instead of 4. A property of the software,
// so it sits here, next to attention_score_bytes.
// tp_overlap_gemm_sm_share (default 116/132): under tp_overlap (Strategy::tp_overlap, Megatron-LM's
// --tp-comm-overlap) the GEMMs whose reduce-scatter runs beside them (TE userbuffers' "pipeline" and "bulk"
// methods: proj/fc2 forward, the backward's dgrad/wgrad pair) give num_sm = 16 SMs to the communication kernel
// (set_sm_margin), so they run on 132 - 16 of an H100's 132 SMs and take 132/116 as long; the ring-exchange
// all-gathers use the copy engine and leave every SM to their GEMM [confirmed: TransformerEngine
// transformer_engine/pytorch/module/base.py get_default_config and common/comm_gemm_overlap/comm_gemm_overlap.cpp
// (_math_sms = sm_count - num_comm_sm), v2.0 and later]. A property of the software on H100; on another device
// set it to (SMs - 16) / SMs.
// Three properties of 2021 Megatron-LM's pipeline (the SC'21 paper's software; default false = Piper's own):
// p2p_blocking: every pipeline send/recv is waited for on the compute stream. megatron/p2p_communication.py
//   `_communicate` (2021) posts torch.distributed.batch_isend_irecv, waits for every request and calls
//   torch.cuda.synchronize(), so no compute runs while a rank's send is in flight: each chunk boundary of the
//   schedule (v per microbatch and direction under the interleaved schedule) is exposed.
// p2p_scatter_gather: `--scatter-gather-tensors-in-pipeline` (on by default in 2021 Megatron-LM and named by the
//   SC'21 paper, section 4.1): each tensor-parallel rank sends 1/tp of the boundary tensor
//   (mpu.split_tensor_into_1d_equal_chunks) and the receiver all-gathers it over tp (mpu.gather_split_1d_tensor)
//   on the compute stream.
// dp_reduce_after_backward: `--DDP-impl local` (examples/sc21/run_table_1.sh sets it on every pipelined row):
//   megatron/model/distributed.py DistributedDataParallel.allreduce_gradients() runs after the whole
//   forward-backward pass (megatron/training.py train_step), so the data-parallel all-reduce overlaps nothing.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/cost/gemm_table.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/part.h"

namespace piper::cost {

// The largest attention_score_bytes a calibration file accepts (Calibration::from_json).
constexpr double kMaxAttentionScoreBytes = 1e3;
// The largest expert_call_*_s a calibration file accepts: 10 ms per expert call is a hundred times what the build
// machine's core measures (docs/calibration.md), a loaded machine's measurement or a typo.
constexpr double kMaxExpertCallS = 1e-2;
// The largest expert_row_*_s: 100 us per row, about a thousand times the build machine's.
constexpr double kMaxExpertRowS = 1e-4;
// The largest measured / priced of a task profile's point (Calibration::task_profiles), and 1 / it the smallest: a
// task 20x off its price is a loaded machine's measurement (2-thread tasks at load 3-5 measured 2-500x), not a price.
constexpr double kMaxTaskScale = 20.0;
// Whether measured / priced lies within [1 / kMaxTaskScale, kMaxTaskScale] (false for NaN).
inline bool task_scale_plausible(double ratio) { return ratio >= 1 / kMaxTaskScale && ratio <= kMaxTaskScale; }
// What a file's sharing efficiency (core_sharing, a task profile's sharing) may be: beyond, a disturbed measurement.
constexpr double kMinSharingEfficiency = 0.01, kMaxSharingEfficiency = 1.5;

struct Calibration {
  double gemm_efficiency = -1;  // < 0: take DeviceSpec::gemm_efficiency
  double gemm_half_dim = 64;
  double memory_bw_efficiency = 0.8;  // achievable fraction of HBM bandwidth for streaming kernels
  // CUDA context, cuBLAS/NCCL workspaces and allocator slack per rank [inferred: ~1 GiB is typical on H100s].
  double workspace_bytes = 1024.0 * 1024.0 * 1024.0;
  double expert_load_imbalance = 1.0;  // tokens on the busiest expert rank / the mean (1 = perfectly balanced)
  // The experts' rows of the ep rank that holds the most at its peak over the mean rank's, which memory is sized
  // with (the closed form, and the buffers of a plan compiled for one representative rank); set from measured loads
  // (`--expert-loads`: balance::contiguous_memory_load, the ranks' busiest steps), not from calibration files.
  // <= 0: expert_load_imbalance, the figure time is priced with.
  double expert_memory_load = 0;
  double attention_score_bytes = 0;    // see above; 0: fused attention (scores never leave the chip)
  // Seconds per routed-expert call (one local expert receiving rows in one microbatch) beyond what its FLOPs and
  // bytes are priced at, forward (F), input gradient (B) and weight gradient (W): the gather, the three GEMMs of a
  // SwiGLU expert on weights no longer in cache, the activation and the scatter, which cost far more at a few dozen
  // rows than the GEMM curve (measured with hot weights) says. `piper calibrate` times the runtime's expert
  // kernels at three row counts with the weights of many experts cycled (cli/calibrate_experts.h) and fits the
  // time beyond the price as expert_call_*_s per expert call plus expert_row_*_s per row; 0 (presets, files from
  // before session 31): no such cost. Charged per expected expert with rows and per row (cost/layer_cost.cc,
  // Part::kExperts), scaled from the measured expert shape (expert_shape_*) to the model's, and measured on one
  // thread of one whole core (DeviceModel::fixed_time_s).
  double expert_call_forward_s = 0;
  double expert_call_backward_input_s = 0;
  double expert_call_backward_weight_s = 0;
  double expert_row_forward_s = 0;
  double expert_row_backward_input_s = 0;
  double expert_row_backward_weight_s = 0;
  // The expert shape the figures above were measured at ("expert_shape": {"hidden": H, "ffn": F}, one SwiGLU expert
  // of hidden H and width F): required in a file with any expert_call_*_s or expert_row_*_s. 0: none (no figures).
  double expert_shape_hidden = 0;
  double expert_shape_ffn = 0;
  bool recompute_reruns_tp_collectives = false;     // see above; false: Piper's own recomputation
  double tp_overlap_gemm_sm_share = 116.0 / 132.0;  // see above
  bool gemm_table = true;                           // see above
  bool p2p_blocking = false;                        // see above (2021 Megatron-LM)
  bool p2p_scatter_gather = false;                  // see above (2021 Megatron-LM)
  bool dp_reduce_after_backward = false;            // see above (2021 Megatron-LM, --DDP-impl local)
  // Measured figures of one device that replace the preset's (<= 0: the preset's). `piper calibrate` writes both
  // for a CPU core, whose turbo clock and caches beat the preset's base-clock peak and memcpy bandwidth; the
  // fractions above are then of these figures. peak_flops_fp32 prices fp32 compute only.
  double peak_flops_fp32 = 0;
  double memory_bw_bytes_per_s = 0;
  // One thread's copy rate, bytes moved (read plus written) per second: std::copy of 64 MiB, measured by
  // `piper calibrate`. It prices the copies that stage a data-parallel collective (cost/copy_cost.h); a large copy
  // moves more bytes a second than the triad above (whose stores read each line first). 0: unmeasured.
  double copy_bw_bytes_per_s = 0;
  // Figures of one rank computing alone with `threads` kernel threads, measured by `piper calibrate` for every
  // thread count 1..C of a CPU machine (the runtime's GEMM and a triad with that many threads). The figures above
  // are one core's; a thread count with an entry here is priced with its own measured figures instead of `threads`
  // times one core's (cli/train_report.h local_cluster). Optional: a file without it means what it always did.
  struct ThreadFigures {
    int threads = 1;
    double peak_flops_fp32 = 0;        // the fitted large-GEMM throughput of the rank (all its threads), FLOP/s
    double gemm_half_dim = 0;          // the fitted curve's h at this thread count
    double memory_bw_bytes_per_s = 0;  // the triad's bandwidth with this many threads
    double task_overhead_s = 0;        // the fixed cost of one kernel call with (almost) no work at this count
  };
  std::vector<ThreadFigures> thread_figures;  // ascending threads, no repeats; empty: threads x one core
  // core_sharing[n - 2]: the share of its one-alone speed per CPU second that each of n single-thread ranks
  // computing together on the machine keeps (shared caches and memory bandwidth, context switches), n = 2..2C,
  // measured by `piper calibrate` with n concurrent processes. The core pool (sim/plan_exec.h CorePool) multiplies
  // each rank's processor share by it. Empty: 1 (ideal processor sharing), as before it was measured.
  std::vector<double> core_sharing;
  // Task profiles (`piper calibrate --model M`, cli/calibrate_tasks.h): model M's tasks as the runtime runs them on
  // one rank with `threads` kernel threads, timed beside what this model priced them at from the figures above
  // (per step: a key's calls summed). The simulator and the closed form scale a task's price by measured / priced
  // for its key at its microbatch's tokens (cost/task_profile.h); a model, seq or thread count without a profile
  // is priced as before. Optional.
  struct TaskProfilePoint {
    int threads = 1;
    double tokens = 0;        // mbs x seq of the microbatch the tasks ran on
    std::string task;         // "<chunk>.<pass>" ("attn.F", "experts.BW"; spec/part.h chunk_name) or "update"
    double calls = 0;         // the key's tasks per step
    double measured_s = 0;    // their wall seconds per step, as the runtime timed them
    double priced_s = 0;      // their price per step from this file's figures, without a profile
    double scale() const { return measured_s / priced_s; }
  };
  // A chunk task's key parsed: its chunk and pass, 0..3 for F, B, W, BW.
  struct TaskKey {
    Part part = Part::kAttention;
    int pass = 0;
  };
  // "<chunk>.<pass>" parsed; nullopt for "update" and for anything that is no chunk task's key.
  static std::optional<TaskKey> parse_task_key(const std::string& task);
  struct TaskProfile {
    std::string model;        // ModelSpec::name
    int64_t parameters = 0;   // the model's parameter count (spec/counting.h): a renamed or edited config differs
    int64_t seq = 0;          // tokens per sequence
    std::vector<TaskProfilePoint> points;
    // sharing[n - 2]: core_sharing measured with this model's own training steps (n copies, one thread each, on
    // the node's cores at once; `piper calibrate --model`); empty: not measured. apply_model_sharing puts it in
    // core_sharing for a run of this model.
    std::vector<double> sharing;
  };
  std::vector<TaskProfile> task_profiles;
  // The kernel threads of the rank being priced (cli/calibration_file.h scale_to_rank_cores): the task profiles'
  // points at this count apply; 0 (unknown: a cluster not priced per thread count) applies none.
  int rank_threads = 0;

  double memory_load() const { return expert_memory_load > 0 ? expert_memory_load : expert_load_imbalance; }
  // The entry for `threads`, or nullptr.
  const ThreadFigures* figures_for_threads(int threads) const;
  // core_sharing for n ranks computing together: 1 for n <= 1 or when unmeasured, the last entry beyond 2C.
  double sharing_efficiency(int ranks) const;

  static Result<Calibration> from_json(const Json& json, const std::string& what);
  static Result<Calibration> load(const std::string& path);
};

// The share of its device's peak a rank of `node` is priced at with every rank of the node computing (the closed
// form's and representative ranks' price, and the simulator's core pool's reference): NodeSpec::static_core_share
// times the calibration's measured sharing efficiency for devices_per_node ranks computing together, on a node
// whose ranks share cores (node.shared_cores > 0); exactly static_core_share() otherwise or without a measurement.
double rate_share(const NodeSpec& node, const Calibration& calibration);

class DeviceModel {
 public:
  // rate_share: the share of the device's peak FLOP/s and memory bandwidth it gets (cost::rate_share: CPU ranks
  // sharing a node's cores, all busy); 1 = all of it.
  // device_cores: the cores one device's kernels use computing alone (NodeSpec::device_cores); with rate_share it
  // gives the share of one core a fixed cost measured on one thread runs at (fixed_time_s).
  DeviceModel(const DeviceSpec& device, DType compute_dtype, const Calibration& calibration, double rate_share = 1.0,
              double device_cores = 1.0);

  double peak_flops() const { return peak_flops_; }
  // Fraction of peak for a GEMM whose smallest dimension is `min_dim` (0 or less: not a GEMM, returns 0).
  // The measured table where the device has one (cost/gemm_table.h), else the curve.
  double gemm_efficiency(double min_dim) const {
    if (min_dim <= 0) return 0.0;
    if (gemm_table_) return gemm_table_->efficiency(min_dim, peak_flops_);
    return curve_efficiency(min_dim);
  }
  // The curve gemm_efficiency * d / (d + gemm_half_dim), whatever the device.
  double curve_efficiency(double min_dim) const {
    return min_dim <= 0 ? 0.0 : gemm_efficiency_ * min_dim / (min_dim + gemm_half_dim_);
  }
  const GemmTable* gemm_table() const { return gemm_table_; }  // nullptr: the curve
  // Roofline time of a task. min_dim <= 0 means memory-bound work with no GEMM. attention_kernel: a fused
  // attention kernel, priced by the curve (TaskCost::attention_kernel).
  double time_s(double flops, double bytes, double min_dim, bool attention_kernel = false) const;
  // Time of memory-bound kernels that cannot overlap a GEMM: bytes / achievable bandwidth.
  double memory_time_s(double bytes) const { return bytes > 0 ? bytes / memory_bw_ : 0.0; }
  // A fixed cost measured on one thread of one whole core (TaskCost::fixed_s), at this rank's share of a core:
  // min(1, device_cores x rate_share), as a rank's copies are (cost::copy_seconds_per_byte_at_share).
  double fixed_time_s(double seconds) const { return seconds > 0 ? seconds / core_share_ : 0.0; }
  // The share of one core this rank's one-thread work runs at: min(1, device_cores x rate_share).
  double core_share() const { return core_share_; }

 private:
  double peak_flops_ = 0;
  double gemm_efficiency_ = 0.8;
  double gemm_half_dim_ = 64;
  double memory_bw_ = 0;
  double core_share_ = 1;  // min(1, device_cores x rate_share)
  const GemmTable* gemm_table_ = nullptr;
};

}  // namespace piper::cost
