#include "fidelity_rows.h"

#include <cstdio>
#include <string>

#include "piper/cost/estimate.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::fidelity {
namespace {

Result<ModelSpec> row_model(const Row& row) {
  if (!row.model.empty() && row.model[0] == '{') return load_model_from_text(row.model, "", row.name);
  return load_model(row.model);
}

// Narayanan et al., SC'21, Eq. 3 (recomputation included): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
double sc21_flops(const ModelSpec& m, int64_t batch, int64_t seq) {
  const double B = static_cast<double>(batch), s = static_cast<double>(seq), l = m.num_layers,
               h = static_cast<double>(m.hidden_size), V = static_cast<double>(m.vocab_size);
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

// Megatron-Core r0.8.0 num_floating_point_operations (no recomputation): 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
double mcore_flops(const ModelSpec& m, int64_t batch, int64_t seq) {
  const double B = static_cast<double>(batch), s = static_cast<double>(seq), l = m.num_layers,
               h = static_cast<double>(m.hidden_size), V = static_cast<double>(m.vocab_size);
  return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}

cost::Calibration megatron_2021() {
  cost::Calibration c;
  c.attention_score_bytes = 13;
  c.recompute_reruns_tp_collectives = true;
  // 2021 Megatron-LM's pipeline (cost/device_model.h): blocking batched isend/irecv + torch.cuda.synchronize
  // (megatron/p2p_communication.py), the scatter/gather split the paper's section 5.1 names for Table 1, and
  // --DDP-impl local (examples/sc21/run_table_1.sh sets DDP=local on the pipelined rows 39B-1T and DDP=torch,
  // whose bucketed all-reduce overlaps the backward, on the pp = 1 rows 1.7B-18B: sc21_rows() turns it off there).
  c.p2p_blocking = true;
  c.p2p_scatter_gather = true;
  c.dp_reduce_after_backward = true;
  return c;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Run as published, three interleaved rows stay 9-11 % too fast with 2021 Megatron-LM's pipeline modelled
// (blocking scatter/gather point-to-point, gradient all-reduce after the backward; docs/simulator.md, "Table 1 as
// published"): a cost of the 2021 interleaved schedule that the model still lacks.
constexpr const char* kInterleavedGap =
    "interleaved schedule as published: predicted 9-11 % too fast in TFLOP/s with 2021 Megatron-LM's blocking "
    "scatter/gather point-to-point and after-backward gradient all-reduce modelled; the rest is not identified "
    "(not modelled: the rendezvous coupling of neighbouring ranks at every blocking exchange, 2021's fp16 "
    "optimizer passes, the tied-embedding all-reduce; docs/simulator.md)";

// The rows with least communication measure the device: Megatron ran them at 0.70-0.86 of the time Piper
// predicts, with GEMMs priced from measured H100 data (the table moved 1.7B from 0.69 to 0.70): what is missing is
// not the GEMMs or the attention kernel (docs/simulator.md, "Megatron-Core on H100").
constexpr const char* kH100ComputeGap =
    "predicted 14-31 % too fast where communication is least (1.7B has none exposed): H100 compute below the "
    "GEMM and attention kernels (non-GEMM kernels, launches, clocks under load) is not modelled; needs a GPU "
    "measurement";

}  // namespace

const char* row_status_name(RowStatus s) {
  switch (s) {
    case RowStatus::kRegression:
      return "regression";
    case RowStatus::kOpenGap:
      return "open gap";
    case RowStatus::kReportedOnly:
      return "reported only";
  }
  return "?";
}

bool RowResult::in_band() const {
  return simulated_ratio >= lo && simulated_ratio <= hi && closed_form_ratio >= lo && closed_form_ratio <= hi;
}

std::vector<Row> sc21_rows() {
  constexpr const char* kSrc =
      "Narayanan et al. SC'21 (arXiv:2104.04473) Table 1; strategy from Megatron-LM examples/sc21/run_table_1.sh";
  struct Spec {
    const char* model;
    int gpus;
    const char* strategy;
    int64_t batch;
    double tflops;
    bool slow;
    bool gap = false;
  };
  // Every row as the published script ran it (examples/sc21/run_table_1.sh: TP, PP, MBS, GBS and, on four rows,
  // --num-layers-per-virtual-pipeline-stage; all --recompute-method uniform). Rows without virtual stages run
  // Megatron's non-interleaved 1F1B. d = GPUs / (t p), microbatches = batch / (d mbs).
  const Spec specs[] = {
      {"gpt-1.7b", 32, "dp=32,tp=1,pp=1,mbs=16,microbatches=1,recompute=full,schedule=1f1b", 512, 137, false},
      {"gpt-3.6b", 64, "dp=32,tp=2,pp=1,mbs=16,microbatches=1,recompute=full,schedule=1f1b", 512, 138, false},
      {"gpt-7.5b", 128, "dp=32,tp=4,pp=1,mbs=16,microbatches=1,recompute=full,schedule=1f1b", 512, 142, false},
      {"gpt-18b", 256, "dp=32,tp=8,pp=1,mbs=8,microbatches=4,recompute=full,schedule=1f1b", 1024, 135, false},
      {"gpt-39b", 512, "dp=32,tp=8,pp=2,mbs=4,microbatches=12,recompute=full,schedule=1f1b", 1536, 138, false},
      // 76B: 60 layers / pp 4 / 5 layers per virtual stage = vpp 3.
      {"gpt-76b", 1024, "dp=32,tp=8,pp=4,vpp=3,mbs=2,microbatches=28,recompute=full,schedule=interleaved", 1792, 140,
       false, true},
      // 145B: 80 / 8 / 5 = vpp 2.
      {"gpt-145b", 1536, "dp=24,tp=8,pp=8,vpp=2,mbs=2,microbatches=48,recompute=full,schedule=interleaved", 2304,
       148, false},
      // 310B: 96 / 16 / 3 = vpp 2.
      {"gpt-310b", 1920, "dp=15,tp=8,pp=16,vpp=2,mbs=1,microbatches=144,recompute=full,schedule=interleaved", 2160,
       155, false, true},
      // 530B: 105 / 35 / 1 = vpp 3.
      {"gpt-530b", 2520, "dp=9,tp=8,pp=35,vpp=3,mbs=1,microbatches=280,recompute=full,schedule=interleaved", 2520,
       163, true, true},
      {"gpt-1t", 3072, "dp=6,tp=8,pp=64,mbs=1,microbatches=512,recompute=full,schedule=1f1b", 3072, 163, true},
  };
  std::vector<Row> rows;
  for (const Spec& sp : specs) {
    Row r;
    r.table = "sc21";
    r.name = sp.model;
    r.source = kSrc;
    r.model = sp.model;
    r.cluster = "dgx-a100";
    r.nodes = sp.gpus / 8;
    r.strategy = sp.strategy;
    r.global_batch = sp.batch;
    r.seq_len = 2048;
    auto m = load_model(sp.model);
    r.published_step_s = m.ok() ? sc21_flops(*m, sp.batch, 2048) / (sp.tflops * 1e12 * sp.gpus) : 0;
    r.published = fmt("%.0f TFLOP/s per GPU", sp.tflops);
    // +-10 % in achieved TFLOP/s, as a band on the step time.
    r.lo = 1 / 1.10;
    r.hi = 1 / 0.90;
    r.slow = sp.slow;
    r.calibration = megatron_2021();
    // run_table_1.sh: DDP=torch on the pp = 1 rows, DDP=local on the pipelined ones.
    r.calibration.dp_reduce_after_backward = std::string(sp.strategy).find("pp=1,") == std::string::npos;
    if (sp.gap) {
      r.status = RowStatus::kOpenGap;
      r.note = kInterleavedGap;
    }
    rows.push_back(r);
  }
  return rows;
}

std::vector<Row> mcore_h100_rows() {
  constexpr const char* kSrc =
      "Megatron-LM README model table (core r0.8.0, commit f2e5db4, images/model_table.png): DP 48, BF16, "
      "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap";
  struct Spec {
    const char* name;
    int heads, hidden, layers, tp, pp;
    int64_t batch;
    double tflops;
    bool slow;
    bool gap = false;
  };
  const Spec specs[] = {
      {"1.7B", 16, 2048, 24, 1, 1, 192, 408.8, false, true}, {"7.1B", 32, 4096, 30, 2, 1, 192, 465.9, false, true},
      {"16B", 48, 6144, 32, 4, 1, 192, 489.1, false, true},  {"32B", 56, 7168, 48, 8, 1, 192, 459.6, false},
      {"70B", 64, 8192, 84, 8, 2, 384, 419.7, false},    {"119B", 80, 10240, 92, 8, 4, 768, 420.5, true},
      {"177B", 96, 12288, 96, 8, 6, 1152, 432.8, true},  {"314B", 128, 16384, 96, 8, 8, 1536, 474.4, true},
      {"462B", 144, 18432, 112, 8, 16, 3072, 459.9, true},
  };
  std::vector<Row> rows;
  for (const Spec& sp : specs) {
    Row r;
    r.table = "mcore-h100";
    r.name = sp.name;
    r.source = kSrc;
    char json[512];
    // GPT as in the table: untied embeddings, vocabulary 131,072, 4h GeLU MLP, biases (Megatron-Core defaults),
    // rotary positions; the parameter counts reproduce the table's sizes (12 l h^2 + 2 V h).
    std::snprintf(json, sizeof json,
                  R"({"name": "mcore-gpt-%s", "num_layers": %d, "hidden_size": %d, "attention": "standard",)"
                  R"( "num_heads": %d, "num_kv_heads": %d, "attention_bias": true, "mlp": "gelu",)"
                  R"( "intermediate_size": %d, "mlp_bias": true, "vocab_size": 131072, "tie_embeddings": false,)"
                  R"( "norm": "layernorm", "norm_bias": true, "max_seq_len": 4096})",
                  sp.name, sp.layers, sp.hidden, sp.heads, sp.heads, 4 * sp.hidden);
    r.model = json;
    r.cluster = "dgx-h100";
    const int gpus = 48 * sp.tp * sp.pp;
    r.nodes = gpus / 8;
    char strat[256];
    const int64_t mb = sp.batch / 48;
    std::snprintf(strat, sizeof strat, "dp=48,tp=%d,pp=%d,%szero=1,mbs=1,microbatches=%lld,recompute=none,schedule=1f1b",
                  sp.tp, sp.pp, sp.tp > 1 ? "sp=1,tp_overlap=1," : "", static_cast<long long>(mb));
    r.strategy = strat;
    r.global_batch = sp.batch;
    r.seq_len = 4096;
    auto m = row_model(r);
    r.published_step_s = m.ok() ? mcore_flops(*m, sp.batch, 4096) / (sp.tflops * 1e12 * gpus) : 0;
    r.published = fmt("%.1f TFLOP/s per GPU", sp.tflops);
    // +-15 %, one band for the table (set knowing session 9's numbers, not per row).
    r.lo = 0.85;
    r.hi = 1.15;
    r.slow = sp.slow;
    if (sp.gap) {
      r.status = RowStatus::kOpenGap;
      r.note = kH100ComputeGap;
    }
    rows.push_back(r);
  }
  return rows;
}

std::vector<Row> all_rows() {
  std::vector<Row> rows = sc21_rows();
  for (auto& r : mcore_h100_rows()) rows.push_back(r);
  for (auto& r : moe_h100_rows()) rows.push_back(r);
  for (auto& r : blackwell_rows()) rows.push_back(r);
  return rows;
}

Result<RowResult> evaluate(const Row& row, bool use_gemm_table) {
  PIPER_ASSIGN_OR_RETURN(ModelSpec m, row_model(row));
  PIPER_ASSIGN_OR_RETURN(ClusterSpec c, load_cluster(row.cluster, row.nodes));
  if (row.job_nodes_per_domain > 0 && c.scale_up.nodes_per_domain > 1) {
    c.scale_up.job_nodes_per_domain = row.job_nodes_per_domain;
    PIPER_RETURN_IF_ERROR(c.validate());
  }
  PIPER_ASSIGN_OR_RETURN(Strategy s, Strategy::parse(row.strategy));
  if (s.world_size() != row.nodes * c.node.devices_per_node || s.global_batch() != row.global_batch)
    return invalid_argument(row.name + ": strategy " + row.strategy + " does not give the row's GPUs and batch");
  TrainSpec t;
  t.seq_len = row.seq_len;
  t.global_batch = row.global_batch;
  t.micro_batch_size = s.mbs;
  t.apply_precision(row.precision);
  if (row.bf16_dispatch) t.dispatch_dtype = DType::kBF16;
  cost::Calibration cal = row.calibration;
  if (!use_gemm_table) cal.gemm_table = false;
  PIPER_ASSIGN_OR_RETURN(auto cm, cost::CostModel::create(m, c, t, cal));
  PIPER_ASSIGN_OR_RETURN(auto est, cm.estimate(s));
  PIPER_ASSIGN_OR_RETURN(auto sim, sim::simulate(m, c, t, s, cal));
  RowResult r;
  r.simulated_step_s = sim.step_time_s;
  r.closed_form_step_s = est.step_time_s;
  r.simulated_ratio = sim.step_time_s / row.published_step_s;
  r.closed_form_ratio = est.step_time_s / row.published_step_s;
  r.fits = est.fits;
  r.lo = row.lo;
  r.hi = row.hi;
  return r;
}

}  // namespace piper::fidelity
