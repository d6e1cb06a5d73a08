// TrainSpec: what one training step processes and in which precisions.
#pragma once

#include <cstdint>
#include <optional>
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

// The buffers the optimizer keeps per parameter, each in TrainSpec::optimizer_dtype: Adam and AdamW two moments,
// SGD one momentum buffer; InvalidArgument for a name with no memory model. The one rule of the graph's optimizer
// bytes (ir::build_graph) and the resource model's ByteConvention (cost/model_state.h).
Result<int> optimizer_state_buffers(const OptimizerSpec& optimizer);

// The format the GEMMs of the transformer blocks (attention projections, MLPs, experts) run in. The attention
// core, the router, the embedding and the LM head stay in the compute dtype of the parameters (bf16), as in
// DeepSeek-V3 (arXiv:2412.19437 §3.3) and Transformer Engine's recipes.
//   bf16   every GEMM at the bf16 peak
//   fp8    fine-grained FP8 (DeepSeek-V3: 1x128 activation tiles and 128x128 weight blocks, fp32 scales; also
//          Transformer Engine's blockwise/current scaling): GEMMs at the fp8 peak
//   mxfp8  OCP microscaling FP8 (MX spec v1.0: 32 elements share one E8M0 scale byte; Blackwell's native
//          format, Megatron-Core/TE "MXFP8"): GEMMs at the fp8 peak
// TrainSpec::apply_precision sets the dtypes a recipe implies; each can then be overridden on its own.
enum class Precision { kBF16, kFP8, kMXFP8 };
const char* to_string(Precision p);
Result<Precision> parse_precision(const std::string& text, const std::string& what);

struct TrainSpec {
  int64_t global_batch = 0;  // sequences per optimizer step
  int64_t micro_batch_size = 1;
  int64_t seq_len = 4096;
  DType param_dtype = DType::kBF16;      // compute copy of the weights
  DType grad_dtype = DType::kFP32;       // gradient accumulation
  DType master_dtype = DType::kFP32;     // master weights held by the optimizer (none when == param_dtype)
  DType optimizer_dtype = DType::kFP32;  // Adam moments
  DType activation_dtype = DType::kBF16;   // activations stashed for the backward
  Precision precision = Precision::kBF16;  // GEMM format (see Precision)
  // Activations on the wire (TP collectives, PP sends, the MoE combine); unset: activation_dtype.
  std::optional<DType> comm_dtype;
  // The MoE dispatch payload (DeepSeek-V3 dispatches in fp8, combines in bf16); unset: the wire dtype.
  std::optional<DType> dispatch_dtype;
  OptimizerSpec optimizer;

  int64_t tokens_per_step() const { return global_batch * seq_len; }
  // The recipe: precision, and for fp8/mxfp8 fp8 activations and dispatch with bf16 on the wire otherwise
  // (DeepSeek-V3 caches linear inputs and dispatches tokens in fp8, combines in bf16); bf16 resets activations to
  // bf16 and the wire and dispatch to follow them. Params, grads, master and moments keep their dtypes.
  void apply_precision(Precision p);
  // The dtype the block GEMMs run in: the parameters' dtype under bf16, fp8 otherwise.
  DType gemm_dtype() const { return precision == Precision::kBF16 ? param_dtype : DType::kFP8; }
  // Bytes per element of an fp8 tensor with its scales: MX shares one byte per 32 elements, DeepSeek-V3's 1x128
  // tiles one fp32 per 128: 1 + 1/32 either way. Other dtypes: their width.
  double stored_bytes(DType d) const;
  double activation_bytes() const { return stored_bytes(activation_dtype); }
  DType wire_dtype() const { return comm_dtype.value_or(activation_dtype); }
  double comm_bytes() const { return stored_bytes(wire_dtype()); }
  double dispatch_bytes() const { return stored_bytes(dispatch_dtype.value_or(wire_dtype())); }
  // Bytes per parameter of the fp8 weight copies the GEMMs read (0 under bf16): a row-wise and a column-wise
  // (transposed) quantisation, because the forward and the input-gradient GEMM contract over different
  // dimensions (Transformer Engine keeps both for Float8/MXFP8 tensors), each with its scales.
  double fp8_weight_copy_bytes() const { return precision == Precision::kBF16 ? 0.0 : 2 * stored_bytes(DType::kFP8); }
  Status validate() const;
};

}  // namespace piper
