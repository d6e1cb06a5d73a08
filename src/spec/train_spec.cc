#include "piper/spec/train_spec.h"

#include <string>

namespace piper {

Status TrainSpec::validate() const {
  auto str = [](int64_t v) { return std::to_string(v); };
  if (global_batch < 1) return invalid_argument("train.global_batch: " + str(global_batch) + " must be >= 1");
  if (micro_batch_size < 1) {
    return invalid_argument("train.micro_batch_size: " + str(micro_batch_size) + " must be >= 1");
  }
  if (global_batch % micro_batch_size != 0) {
    return invalid_argument("train.micro_batch_size: " + str(micro_batch_size) +
                            " does not divide global_batch=" + str(global_batch));
  }
  if (seq_len < 1) return invalid_argument("train.seq_len: " + str(seq_len) + " must be >= 1");
  if (optimizer.name != "adamw") {
    return invalid_argument("train.optimizer.name: '" + optimizer.name + "' is not supported; pick one of {adamw}");
  }
  if (!(optimizer.lr > 0)) return invalid_argument("train.optimizer.lr: must be > 0");
  if (!(optimizer.beta1 >= 0 && optimizer.beta1 < 1) || !(optimizer.beta2 >= 0 && optimizer.beta2 < 1)) {
    return invalid_argument("train.optimizer: beta1 and beta2 must be in [0, 1)");
  }
  if (!(optimizer.eps > 0)) return invalid_argument("train.optimizer.eps: must be > 0");
  if (!(optimizer.weight_decay >= 0)) return invalid_argument("train.optimizer.weight_decay: must be >= 0");
  if (!(optimizer.grad_clip >= 0)) return invalid_argument("train.optimizer.grad_clip: must be >= 0 (0 = off)");
  if (dtype_bytes(master_dtype) < dtype_bytes(param_dtype)) {
    return invalid_argument(std::string("train.master_dtype: ") + to_string(master_dtype) +
                            " is narrower than param_dtype " + to_string(param_dtype));
  }
  return ok_status();
}

}  // namespace piper
