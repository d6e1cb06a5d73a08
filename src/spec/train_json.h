// TrainSpec <-> JSON: {"global_batch": 1024, "micro_batch_size": 1, "seq_len": 4096, "param_dtype": "bf16",
// "grad_dtype": "fp32", "master_dtype": "fp32", "optimizer_dtype": "fp32", "activation_dtype": "bf16",
// "precision": "bf16" (or fp8, mxfp8: sets fp8 activation_dtype and dispatch_dtype before the keys that follow
// override them), "comm_dtype": "bf16", "dispatch_dtype": "bf16",
// "optimizer": {"name": "adamw", "lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
// "grad_clip": 1.0}}. global_batch is required; every other field keeps the TrainSpec default when absent.
// Unknown keys are errors. The result is validated.
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/spec/train_spec.h"

namespace piper {

Result<TrainSpec> train_from_json(const Json& json, const std::string& what);
Result<TrainSpec> load_train(const std::string& path);
OrderedJson to_json(const TrainSpec& train);

}  // namespace piper
