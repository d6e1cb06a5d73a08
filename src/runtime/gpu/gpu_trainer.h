// GpuTrainer: single-rank training on one CUDA GPU (`piper train --device cuda`), the GPU counterpart of
// Trainer's single-rank run. It reuses the model's structure and initial weights (Model::create from the seed,
// so the same bits as on the CPU), the same corpus, data order and microbatches (the default strategy's mbs,
// or --strategy's), and runs every chunk of model.chunks() in order with the CUDA kernels
// (kernels/cuda/cuda_api.h) on device-resident tensors: bf16 GEMM operands with fp32 accumulation, fp32
// master weights, gradients and AdamW moments, fp32 norms/softmax/loss, the router's logits in fp32.
// Each microbatch runs forward then backward (B and W together), gradients accumulate over the microbatches,
// then one AdamW step with global-norm clipping; the aux-loss-free bias is updated on the host after the step.
// What it does not do (refused by create()): more than one rank, pipeline/tensor/expert parallelism,
// checkpoints. This header has no CUDA types; without the CUDA backend in the build create() says how to build it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "piper/base/status.h"
#include "piper/runtime/trainer.h"

namespace piper::runtime {

class GpuTrainer {
 public:
  // FailedPrecondition "no CUDA device: ..." without a usable GPU; FailedPrecondition naming -DPIPER_CUDA=ON
  // when the binary was built without the CUDA backend; InvalidArgument for multi-rank or parallel strategies.
  static Result<std::unique_ptr<GpuTrainer>> create(const TrainOptions& options);
  virtual ~GpuTrainer() = default;
  virtual Result<TrainStepStats> step() = 0;
  virtual std::string device() const = 0;  // "NVIDIA H200, sm_90, ..."
  virtual int microbatches() const = 0;
  virtual int64_t mbs() const = 0;
  // The gradients of the last step (before AdamW consumed them), by parameter name ("L1.attn.w_qkv"), in the
  // model's parameter order; trainable parameters only. For tests: it copies every gradient to the host.
  virtual Result<std::vector<std::pair<std::string, std::vector<float>>>> gradients() = 0;
};

// Whether this binary has the CUDA backend.
bool gpu_backend_built();

}  // namespace piper::runtime
