// TrainSpec: what one training step processes and in which precisions.
#pragma once

#include <cstdint>
#include <string>

#include "piper/base/status.h"
#include "piper/spec/cluster_spec.h"

namespace piper {

struct OptimizerSpec {
  std::string name = "adamw";
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // global-norm clipping; 0 = off
};

struct TrainSpec {
  int64_t global_batch = 0;  // sequences per optimizer step
  int64_t micro_batch_size = 1;
  int64_t seq_len = 4096;
  DType param_dtype = DType::kBF16;      // compute copy of the weights
  DType grad_dtype = DType::kFP32;       // gradient accumulation
  DType master_dtype = DType::kFP32;     // master weights held by the optimizer (none when == param_dtype)
  DType optimizer_dtype = DType::kFP32;  // Adam moments
  DType activation_dtype = DType::kBF16;
  OptimizerSpec optimizer;

  int64_t tokens_per_step() const { return global_batch * seq_len; }
  Status validate() const;
};

}  // namespace piper
