#include "piper/cli/precision_flags.h"

#include "piper/cli/flags.h"
#include "piper/spec/limits.h"

namespace piper::cli {
namespace {

constexpr const char* kDtypes = "fp32, bf16, fp16 or fp8";

Status apply_dtype(const std::string& text, const char* flag, DType* out) {
  if (text.empty()) return ok_status();
  PIPER_ASSIGN_OR_RETURN(*out, parse_dtype(text, flag));
  return ok_status();
}

Status apply_optional_dtype(const std::string& text, const char* flag, std::optional<DType>* out) {
  if (text.empty()) return ok_status();
  PIPER_ASSIGN_OR_RETURN(const DType d, parse_dtype(text, flag));
  *out = d;
  return ok_status();
}

}  // namespace

void add_precision_options(CLI::App* sub, PrecisionOptions* o) {
  sub->add_option("--precision", o->precision,
                  "training precision: bf16 (default), fp8 (DeepSeek-V3 blockwise) or mxfp8 (OCP MX, Blackwell)");
  sub->add_option("--param-dtype", o->param, std::string("compute copy of the weights: ") + kDtypes);
  sub->add_option("--grad-dtype", o->grad, std::string("gradient accumulation: ") + kDtypes);
  sub->add_option("--master-dtype", o->master, std::string("optimizer's master weights: ") + kDtypes);
  sub->add_option("--moment-dtype", o->moment, std::string("Adam moments: ") + kDtypes);
  sub->add_option("--activation-dtype", o->activation, std::string("activations kept for the backward: ") + kDtypes);
  sub->add_option("--comm-dtype", o->comm,
                  std::string("activations on the wire (TP, PP, MoE combine; default: the activations'): ") + kDtypes);
  sub->add_option("--dispatch-dtype", o->dispatch,
                  std::string("MoE dispatch payload (default: the wire dtype): ") + kDtypes);
}

Status apply_precision_options(const PrecisionOptions& o, TrainSpec* train) {
  if (!o.precision.empty()) {
    PIPER_ASSIGN_OR_RETURN(const Precision p, parse_precision(o.precision, "--precision"));
    train->apply_precision(p);
  }
  PIPER_RETURN_IF_ERROR(apply_dtype(o.param, "--param-dtype", &train->param_dtype));
  PIPER_RETURN_IF_ERROR(apply_dtype(o.grad, "--grad-dtype", &train->grad_dtype));
  PIPER_RETURN_IF_ERROR(apply_dtype(o.master, "--master-dtype", &train->master_dtype));
  PIPER_RETURN_IF_ERROR(apply_dtype(o.moment, "--moment-dtype", &train->optimizer_dtype));
  PIPER_RETURN_IF_ERROR(apply_dtype(o.activation, "--activation-dtype", &train->activation_dtype));
  PIPER_RETURN_IF_ERROR(apply_optional_dtype(o.comm, "--comm-dtype", &train->comm_dtype));
  PIPER_RETURN_IF_ERROR(apply_optional_dtype(o.dispatch, "--dispatch-dtype", &train->dispatch_dtype));
  // The dtype rules only (batch sizes are checked by each command where it resolves them).
  TrainSpec probe = *train;
  probe.global_batch = 1;
  probe.micro_batch_size = 1;
  probe.seq_len = 1;
  return probe.validate();
}

std::string describe_precision(const TrainSpec& t) {
  std::string s = std::string(to_string(t.precision)) + " (activations " + to_string(t.activation_dtype) + ", wire " +
                  to_string(t.wire_dtype()) + ", dispatch " + to_string(t.dispatch_dtype.value_or(t.wire_dtype())) +
                  "; params " + to_string(t.param_dtype) + ", grads " + to_string(t.grad_dtype) + ", master " +
                  to_string(t.master_dtype) + ", moments " + to_string(t.optimizer_dtype) + ")";
  return s;
}

void add_domain_option(CLI::App* sub, int* domain_nodes) {
  add_int_option(sub, "--domain-nodes", domain_nodes, {1, kMaxNodesPerDomain, "nodes per scale-up domain"},
                 "nodes of each NVLink domain the job holds (Slurm --segment; default: the whole domain)");
}

Status apply_domain_nodes(int domain_nodes, ClusterSpec* cluster) {
  if (domain_nodes <= 0) return ok_status();
  cluster->scale_up.job_nodes_per_domain = domain_nodes;
  return cluster->validate();
}

}  // namespace piper::cli
