// The training-precision and scale-up-domain options shared by estimate, simulate, plan, compile and train.
//
//   --precision bf16|fp8|mxfp8   the recipe (TrainSpec::apply_precision): the GEMM format, and for fp8/mxfp8 fp8
//                                activations and dispatch with bf16 on the wire
//   --param-dtype, --grad-dtype, --master-dtype, --moment-dtype, --activation-dtype, --comm-dtype,
//   --dispatch-dtype             one dtype each (fp32, bf16, fp16, fp8), applied after the recipe
//   --domain-nodes N             nodes of each scale-up domain the job holds (ClusterSpec::ScaleUpSpec; Slurm's
//                                --segment), 1..the domain's size; default: the whole domain
// A bad name fails with one line that names the flag, the value and the valid names; the combination is then
// checked by TrainSpec::validate / ClusterSpec::validate.
#pragma once

#include <string>

#include "piper/base/status.h"
#include "piper/cli/command.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/train_spec.h"

namespace piper::cli {

struct PrecisionOptions {
  std::string precision;                                                // "" = not given (bf16)
  std::string param, grad, master, moment, activation, comm, dispatch;  // "" = not given
};

void add_precision_options(CLI::App* sub, PrecisionOptions* o);

// Applies the recipe, then each dtype given, and validates the dtypes' combination.
Status apply_precision_options(const PrecisionOptions& o, TrainSpec* train);

// "fp8 (activations fp8, dispatch fp8, wire bf16; params bf16, grads fp32, master fp32, moments fp32)".
std::string describe_precision(const TrainSpec& train);

void add_domain_option(CLI::App* sub, int* domain_nodes);

// Sets the job's nodes per domain (0 = not given: the whole domain) and re-validates the cluster.
Status apply_domain_nodes(int domain_nodes, ClusterSpec* cluster);

}  // namespace piper::cli
