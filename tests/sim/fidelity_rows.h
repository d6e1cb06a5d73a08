// Every published row Piper's predictions are compared with, in one place: the CTest fidelity tests
// (fidelity_test.cc, moe_fidelity_test.cc) assert the rows that are within their band, and `make fidelity`
// (fidelity_report.cc, scripts/fidelity.sh) prints every row of every table as docs/fidelity.md and .json.
//
// A row is one published run: model, cluster, the strategy as its source ran it, the published step time (quoted,
// or derived from the quoted TFLOP/s with the source's own FLOP count) and the source on the row. Its status says
// what CTest does with it:
//   kRegression   within its band by both models: asserted to stay there;
//   kOpenGap      outside its band by at least one model, for a reason named in `note`: reported, and asserted to
//                 stay outside (a row that moves in is noticed and promoted);
//   kReportedOnly not a separate check (`note` says why), reported only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/cost/device_model.h"
#include "piper/spec/train_spec.h"

namespace piper::fidelity {

enum class RowStatus { kRegression, kOpenGap, kReportedOnly };
const char* row_status_name(RowStatus s);

struct Row {
  std::string table;  // "sc21", "mcore-h100", "moe-h100", "blackwell"
  std::string name;
  std::string source;
  std::string model;        // preset name, or inline JSON (starts with '{')
  std::string cluster;      // preset name
  int nodes = 0;
  std::string strategy;
  int64_t global_batch = 0;
  int64_t seq_len = 0;
  double published_step_s = 0;
  std::string published;    // as published ("137 TFLOP/s per GPU", "29.0 s")
  double lo = 0, hi = 0;    // band for predicted / published step time
  RowStatus status = RowStatus::kRegression;
  std::string note;         // why a gap or reported-only row is what it is
  bool check_fits = true;   // the closed form's memory must fit, as the published run did
  bool slow = false;        // more than ~5 s to simulate: a test of its own
  cost::Calibration calibration;
  Precision precision = Precision::kBF16;  // the training recipe (TrainSpec::apply_precision)
  bool bf16_dispatch = false;               // a low-precision recipe whose MoE dispatch stays bf16
  int job_nodes_per_domain = 0;             // > 0: nodes of each multi-node NVLink domain the job holds
};

struct RowResult {
  double simulated_step_s = 0, closed_form_step_s = 0;
  double simulated_ratio = 0, closed_form_ratio = 0;  // predicted / published step time
  bool fits = false;
  bool in_band() const;  // both ratios within [lo, hi]
  double lo = 0, hi = 0;
};

// SC'21 Table 1 (A100, 2021 software), Megatron-Core dense GPT on H100 (README table, r0.8.0), MoE on H100.
std::vector<Row> sc21_rows();
std::vector<Row> mcore_h100_rows();
std::vector<Row> moe_h100_rows();
// Megatron-Bridge 25.11 performance summary on GB200, GB300 and B200 (MoE, bf16 and mxfp8).
std::vector<Row> blackwell_rows();
std::vector<Row> all_rows();

// Simulates and estimates one row (its calibration, overridden by `use_gemm_table` when set to false).
Result<RowResult> evaluate(const Row& row, bool use_gemm_table = true);

}  // namespace piper::fidelity
