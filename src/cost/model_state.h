// Model-state memory: parameters, gradients and optimizer states per rank under ZeRO 0..3.
//
// The byte convention (bytes per parameter of each state) comes from the TrainSpec dtypes, so the same
// formula gives Megatron's 18 bytes/param (bf16 params 2 + fp32 grads 4 + fp32 master 4 + Adam m,v 8) and
// the ZeRO paper's 16 (fp16 params 2 + fp16 grads 2 + K = 12). ZeRO shards, over a group of `shard_ranks`:
//   stage 0: nothing            (p + g + o) * N
//   stage 1: optimizer states    (p + g) * N + o * N / d
//   stage 2: + gradients          p * N + (g + o) * N / d
//   stage 3: + parameters         (p + g + o) * N / d
// Under fp8/mxfp8 GEMMs the rank also holds fp8 copies of its weights (ByteConvention::weight_copy, 2.0625
// bytes/param), counted with the parameters (sharded with them under stage 3).
// Megatron's distributed optimizer is stage 1: 6 + 12/dp bytes/param with the 18-byte convention.
// Callers pick the group: dense parameters shard over dp, expert parameters over the expert-data-parallel
// group (dp/ep, times tp/etp when experts are not tensor-sliced), because only those ranks hold a replica.
#pragma once

#include "piper/base/status.h"
#include "piper/spec/train_spec.h"

namespace piper::cost {

struct ByteConvention {
  double param = 2;      // compute copy
  double grad = 4;       // gradient accumulation buffer
  double master = 4;     // fp32 master copy held by the optimizer (0 when params are already the master)
  double optimizer = 8;  // optimizer moments (Adam: 2 x moment dtype)
  double weight_copy = 0;  // fp8 weight copies (row-wise + column-wise with scales) under fp8/mxfp8 GEMMs

  double optimizer_total() const { return master + optimizer; }  // what ZeRO-1 shards
  double total() const { return param + grad + master + optimizer; }

  // From the TrainSpec dtypes and optimizer name (adam/adamw: 2 moments, sgd: 1 momentum buffer).
  static Result<ByteConvention> from_train(const TrainSpec& train);
};

struct ModelStateBytes {
  double params = 0;
  double grads = 0;
  double optimizer = 0;  // master weights + moments
  double total() const { return params + grads + optimizer; }
  ModelStateBytes& operator+=(const ModelStateBytes& o) {
    params += o.params;
    grads += o.grads;
    optimizer += o.optimizer;
    return *this;
  }
};

// Bytes one rank holds for `num_params` parameters replicated over `shard_ranks` ranks, at ZeRO `zero_stage`.
// Preconditions: zero_stage in 0..3, shard_ranks >= 1.
ModelStateBytes model_state_bytes(double num_params, int zero_stage, int shard_ranks, const ByteConvention& bytes);

// Bytes one optimizer step reads and writes per parameter it updates (grad, master and moments read and written,
// compute copy written): the optimizer step is memory-bound.
double optimizer_step_bytes_per_param(const ByteConvention& bytes);

}  // namespace piper::cost
