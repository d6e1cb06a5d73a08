#include "piper/cost/model_state.h"

#include "piper/base/check.h"

namespace piper::cost {
namespace {

// Local copy of the dtype widths so that this file does not need the spec library's sources.
double width(DType d) {
  switch (d) {
    case DType::kFP32: return 4;
    case DType::kBF16: return 2;
    case DType::kFP16: return 2;
    case DType::kFP8: return 1;
  }
  return 0;
}

}  // namespace

Result<ByteConvention> ByteConvention::from_train(const TrainSpec& train) {
  ByteConvention b;
  b.param = width(train.param_dtype);
  // The fp8 weight copies the GEMMs read (TrainSpec::fp8_weight_copy_bytes, computed here from the header's
  // enum for the reason above): row-wise and column-wise, 1 byte and 1/32 byte of scales per element each.
  b.weight_copy = train.precision == Precision::kBF16 ? 0.0 : 2 * (1.0 + 1.0 / 32.0);
  b.grad = width(train.grad_dtype);
  b.master = train.master_dtype == train.param_dtype ? 0.0 : width(train.master_dtype);
  PIPER_ASSIGN_OR_RETURN(const int buffers, optimizer_state_buffers(train.optimizer));
  b.optimizer = buffers * width(train.optimizer_dtype);
  return b;
}

ModelStateBytes model_state_bytes(double num_params, int zero_stage, int shard_ranks, const ByteConvention& b) {
  PIPER_CHECK(zero_stage >= 0 && zero_stage <= 3, "zero stage ", zero_stage);
  PIPER_CHECK(shard_ranks >= 1, "shard_ranks ", shard_ranks);
  const double d = shard_ranks;
  ModelStateBytes m;
  m.params = num_params * (b.param + b.weight_copy) / (zero_stage >= 3 ? d : 1.0);
  m.grads = num_params * b.grad / (zero_stage >= 2 ? d : 1.0);
  m.optimizer = num_params * b.optimizer_total() / (zero_stage >= 1 ? d : 1.0);
  return m;
}

double optimizer_step_bytes_per_param(const ByteConvention& b) {
  return b.grad + 2 * (b.master + b.optimizer) + b.param + b.weight_copy;  // + re-quantised fp8 copies
}

}  // namespace piper::cost
