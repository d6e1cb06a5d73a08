// Tensor-parallel communication overlap (Strategy::tp_overlap; Megatron-LM's --tp-comm-overlap with Transformer
// Engine's default userbuffers methods), shared by the closed form (estimate.cc) and the simulator's prices
// (sim/task_time.cc), which runs the pieces the compiler emits (compile/lower.h: LowerOptions::tp_overlap).
//
// Under sequence parallelism a tp block (attention, MLP, shared experts) receives its input through an
// all-gather and hands its output to a reduce-scatter, forward and backward. With the overlap:
//  - all-gather + the block's first GEMM run as tp pieces (TE "ring exchange"): GEMM piece 0 uses the local
//    shard at once; piece i waits for all-gather piece i. With t_c the all-gather, t_g the GEMM:
//      exposed = max(0, t_c - t_g (tp - 1) / tp)
//  - the block's last GEMM + reduce-scatter run as k pieces (TE "pipeline", num_splits 4); reduce-scatter
//    piece i starts when GEMM piece i ends; the GEMM runs on the SMs the communication kernel leaves it
//    (Calibration::tp_overlap_gemm_sm_share), so t_g here is the slowed GEMM:
//      exposed = max(t_c / k, t_c - t_g (k - 1) / k)
//  The forward's first GEMM is the input projection (qkv, fc1), its last the output projection (proj, fc2);
//  the backward runs the output projection's gradient GEMMs first and the input projection's last.
// (Both follow from the piece timelines: pieces of equal length, the collective's pieces back to back.)
#pragma once

#include <array>

#include "piper/cost/device_model.h"
#include "piper/cost/layer_cost.h"
#include "piper/strategy/strategy.h"  // kTpOverlapRsPieces

namespace piper::cost {

// A block's first and last GEMM per task (index 0 = F, 1 = B, 2 = W): roofline seconds on all SMs, and FLOPs.
// `matmul` is the block's matmul cost part (kAttention, kDenseMlp or kSharedExperts); any other part gives zeros.
struct BlockGemms {
  std::array<double, 3> first_s{}, last_s{}, first_flops{}, last_flops{};
};
BlockGemms block_gemms(const PartTable& table, const DeviceModel& device, const PartShape& shape, Part matmul);

double tp_overlap_all_gather_exposed_s(double comm_s, double gemm_s, int pieces);
double tp_overlap_reduce_scatter_exposed_s(double comm_s, double gemm_s, int pieces);

}  // namespace piper::cost
