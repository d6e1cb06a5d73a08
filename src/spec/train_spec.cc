#include "piper/spec/train_spec.h"

#include <cmath>
#include <string>

#include "piper/spec/limits.h"

namespace piper {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// Upper bounds (limits.h): tokens per microbatch times any per-token size must fit int64.
Status validate_sizes(const TrainSpec& t) {
  auto str = [](int64_t v) { return std::to_string(v); };
  if (t.global_batch > kMaxGlobalBatch) {
    return invalid_argument("train.global_batch: " + str(t.global_batch) + " is out of range; allowed 1.." +
                            str(kMaxGlobalBatch) + " sequences (published runs use <= 65536)");
  }
  if (t.micro_batch_size > kMaxMicroBatchSize) {
    return invalid_argument("train.micro_batch_size: " + str(t.micro_batch_size) + " is out of range; allowed 1.." +
                            str(kMaxMicroBatchSize));
  }
  if (t.seq_len > kMaxSeqLen) {
    return invalid_argument("train.seq_len: " + str(t.seq_len) + " is out of range; allowed 1.." + str(kMaxSeqLen) +
                            " (the longest published context is 10M tokens)");
  }
  if (t.micro_batch_size * t.seq_len > kMaxMicrobatchTokens) {
    return invalid_argument("train: micro_batch_size*seq_len = " + str(t.micro_batch_size * t.seq_len) +
                            " tokens per microbatch is out of range; allowed <= " + str(kMaxMicrobatchTokens) +
                            " (a microbatch's FLOPs and bytes must fit int64); lower micro_batch_size or seq_len");
  }
  return ok_status();
}

}  // namespace

const char* to_string(Precision p) {
  switch (p) {
    case Precision::kBF16:
      return "bf16";
    case Precision::kFP8:
      return "fp8";
    case Precision::kMXFP8:
      return "mxfp8";
  }
  return "?";
}

Result<Precision> parse_precision(const std::string& text, const std::string& what) {
  if (text == "bf16") return Precision::kBF16;
  if (text == "fp8") return Precision::kFP8;
  if (text == "mxfp8") return Precision::kMXFP8;
  return invalid_argument(what + ": '" + text + "' is not a training precision; pick one of {bf16, fp8, mxfp8}");
}

void TrainSpec::apply_precision(Precision p) {
  precision = p;
  if (p == Precision::kBF16) {
    activation_dtype = DType::kBF16;
    comm_dtype.reset();
    dispatch_dtype.reset();
  } else {
    activation_dtype = DType::kFP8;
    comm_dtype = DType::kBF16;
    dispatch_dtype = DType::kFP8;
  }
}

double TrainSpec::stored_bytes(DType d) const {
  return d == DType::kFP8 ? 1.0 + 1.0 / 32.0 : static_cast<double>(dtype_bytes(d));
}

Result<int> optimizer_state_buffers(const OptimizerSpec& optimizer) {
  if (optimizer.name == "adam" || optimizer.name == "adamw") return 2;
  if (optimizer.name == "sgd") return 1;
  return invalid_argument("train.optimizer.name: '" + optimizer.name + "' has no memory model; use adam, adamw or sgd");
}

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
  PIPER_RETURN_IF_ERROR(validate_sizes(*this));
  if (optimizer.name != "adamw") {
    return invalid_argument("train.optimizer.name: '" + optimizer.name + "' is not supported; pick one of {adamw}");
  }
  if (!(std::isfinite(optimizer.lr) && optimizer.lr > 0 && optimizer.lr <= kMaxLearningRate)) {
    return invalid_argument("train.optimizer.lr: " + num(optimizer.lr) + " is out of range; allowed (0, " +
                            num(kMaxLearningRate) + "] (AdamW diverges far below it; published runs use 1e-5..1e-2)");
  }
  if (!(optimizer.beta1 >= 0 && optimizer.beta1 < 1) || !(optimizer.beta2 >= 0 && optimizer.beta2 < 1)) {
    return invalid_argument("train.optimizer: beta1 and beta2 must be in [0, 1)");
  }
  if (!(optimizer.eps > 0 && optimizer.eps <= 1)) {
    return invalid_argument("train.optimizer.eps: " + num(optimizer.eps) + " is out of range; allowed (0, 1]");
  }
  if (!(optimizer.weight_decay >= 0 && optimizer.weight_decay <= 1e3)) {
    return invalid_argument("train.optimizer.weight_decay: " + num(optimizer.weight_decay) +
                            " is out of range; allowed [0, 1000] (published runs use 0..0.1)");
  }
  if (!(std::isfinite(optimizer.grad_clip) && optimizer.grad_clip >= 0)) {
    return invalid_argument("train.optimizer.grad_clip: " + num(optimizer.grad_clip) +
                            " is out of range; allowed finite >= 0 (0 = off)");
  }
  if (param_dtype == DType::kFP8) {
    return invalid_argument(
        "train.param_dtype: fp8 is not a master or compute copy of the weights; keep params in bf16 and set "
        "precision fp8 or mxfp8 (the GEMMs then read fp8 copies of them)");
  }
  if (precision != Precision::kBF16 && param_dtype == DType::kFP32) {
    return invalid_argument(std::string("train.precision: ") + to_string(precision) +
                            " with param_dtype fp32; fp8 GEMMs quantise a bf16 compute copy; set params to bf16");
  }
  for (const auto& [key, d] : {std::pair{"grad_dtype", grad_dtype}, std::pair{"master_dtype", master_dtype}}) {
    if (d == DType::kFP8) {
      return invalid_argument(std::string("train.") + key + ": fp8 is out of range; allowed {fp32, bf16, fp16} " +
                              "(fp8 gradient accumulation and master weights diverge; DeepSeek-V3 keeps them in fp32)");
    }
  }
  if (dtype_bytes(master_dtype) < dtype_bytes(param_dtype)) {
    return invalid_argument(std::string("train.master_dtype: ") + to_string(master_dtype) +
                            " is narrower than param_dtype " + to_string(param_dtype));
  }
  return ok_status();
}

}  // namespace piper
