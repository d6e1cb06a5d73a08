// Training checkpoints: a directory with
//   model.safetensors      the parameters (fp32, by name)
//   optimizer.safetensors  the optimizer state (AdamW moments, named "<param>.m" / "<param>.v" by convention)
//   index.json             format/version, step, data position, RNG state, and per file its byte size and
//                          fnv1a64 of the data section, plus a weight_map {tensor name: file}
// The index is written last (through a rename), so a directory with an index is a complete checkpoint.
// load_checkpoint checks everything (sizes, checksums, that the files hold exactly the tensors the index lists)
// and reports any mismatch as DataLoss naming the file and the problem; a missing directory or index is NotFound.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "piper/base/status.h"
#include "piper/runtime/data_loader.h"
#include "piper/tensor/rng.h"
#include "piper/tensor/tensor.h"

namespace piper {

struct CheckpointMeta {
  int64_t step = 0;   // optimizer steps completed
  DataPosition data;  // where the data loader resumes
  RngState rng;       // the trainer's RNG
};

using NamedTensors = std::vector<std::pair<std::string, const Tensor*>>;

struct Checkpoint {
  CheckpointMeta meta;
  std::map<std::string, Tensor> model;      // MemCategory::kParameters
  std::map<std::string, Tensor> optimizer;  // MemCategory::kOptimizer
};

// Creates the directory if needed; overwrites an existing checkpoint there.
Status save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const NamedTensors& model,
                       const NamedTensors& optimizer);
Result<Checkpoint> load_checkpoint(const std::string& dir);

// Copies the checkpoint's tensor `name` into dst; InvalidArgument if it is absent or its shape differs.
Status restore_tensor(const std::map<std::string, Tensor>& tensors, const std::string& name, Tensor* dst);

}  // namespace piper
