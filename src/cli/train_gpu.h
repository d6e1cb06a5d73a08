// `piper train --device cuda`: the single-rank GPU trainer (runtime/gpu/gpu_trainer.h) behind the train command.
#pragma once

#include <cstdint>
#include <string>

#include "piper/base/status.h"
#include "piper/runtime/trainer.h"

namespace piper::cli {

// The flags --device cuda does not support yet, refused before anything starts.
Status check_gpu_train_flags(int ranks, const std::string& strategy, bool save, bool resume, bool trace);
// Trains `steps` steps of `options` on the GPU, printing one line per step (or one JSON object).
Status train_gpu(const runtime::TrainOptions& options, int64_t steps, bool json);

}  // namespace piper::cli
