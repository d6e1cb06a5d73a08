// GpuTrainer in a build without the CUDA backend: create() says how to get one.
#include "piper/runtime/gpu/gpu_trainer.h"

namespace piper::runtime {

Result<std::unique_ptr<GpuTrainer>> GpuTrainer::create(const TrainOptions&) {
  return failed_precondition(
      "--device cuda: this piper was built without the CUDA backend; install the CUDA toolkit (nvcc, cuBLAS) and "
      "reconfigure with -DPIPER_CUDA=ON (cmake -S . -B build -DPIPER_CUDA=ON), or use --device cpu");
}

bool gpu_backend_built() { return false; }

}  // namespace piper::runtime
