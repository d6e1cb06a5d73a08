// The disaggregation allocator: how many GPUs and ports (NICs) the attention and FFN groups get.
//
// Candidates are the GPU splits of AfModel::candidates() (with their pipeline depth and recomputation); port
// splits are 1..ports-1 for the attention side. The MILP picks one of each with one-hot binaries x_k, y_n:
//   minimise  Z + sum_k fill_k x_k - w * B
//   s.t.      sum_k x_k = 1,  sum_n y_n = 1
//             Z >= sum_k attn_k x_k,   Z >= sum_k ffn_k x_k                   (per-step compute of each group)
//             Z >= sum_k bytes_k / (n bw) x_k - M_n (1 - y_n)     for every n (attention-side ports)
//             Z >= sum_k bytes_k / ((N-n) bw) x_k - M'_n (1 - y_n) for every n (FFN-side ports)
//             sum_n n y_n <= sum_k maxports_attn_k x_k,   sum_n (N-n) y_n <= sum_k maxports_ffn_k x_k
//             B <= sum_k attn_k x_k,   B <= sum_k ffn_k x_k                   (keep both busy: w is small)
// so Z is the slower of the four per-step times (AfModel::bottleneck_s) and the objective is
// AfModel::objective. enumerate_allocation() evaluates that objective for every feasible (k, n) pair: the
// oracle the MILP is tested against, and the fallback when CBC is not built in.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/planner/af_model.h"
#include "piper/planner/milp.h"

namespace piper::planner {

struct AfAllocation {
  AfCandidate candidate;
  int ports_attn = 0, ports_ffn = 0;
  // The candidate's strategy with this port split (Strategy::attn_ports, ffn_ports).
  Strategy strategy() const;
  double objective = 0, step_time_s = 0, bottleneck_s = 0, net_attn_s = 0, net_ffn_s = 0, mfu = 0;
  Json to_json() const;
};

struct DisaggregateResult {
  AfAllocation best;
  std::string method;  // "cbc" or "enumeration"
  bool proven_optimal = false;
  int64_t gpu_splits = 0, port_splits = 0;  // candidates and port choices offered to the solver
  std::vector<std::pair<std::string, int64_t>> rejected;
  double solve_time_s = 0;
  bool has_even = false;
  AfAllocation even;  // best allocation with attn == ffn, for comparison
  // Roofline: arithmetic intensity, machine balance of the chosen allocation, bound, turning point.
  double attn_intensity = 0, ffn_intensity = 0, attn_balance = 0, ffn_balance = 0, attn_turning_seq = 0;
  Json to_json() const;
};

AfAllocation make_allocation(const AfModel& model, const AfCandidate& c, int ports_attn);
// Exhaustive: the best feasible (candidate, port split) by AfModel::objective; ties go to the earlier candidate,
// then fewer attention ports. FailedPrecondition when nothing is feasible.
Result<AfAllocation> enumerate_allocation(const AfModel& model, const std::vector<AfCandidate>& candidates);
// The MILP above, solved by `solver`.
Result<AfAllocation> milp_allocation(const AfModel& model, const std::vector<AfCandidate>& candidates,
                                     const MilpSolver& solver, bool* proven_optimal = nullptr);
// Candidates, then the MILP (solver != nullptr) or enumeration, plus the even split and the roofline report.
Result<DisaggregateResult> disaggregate(const AfModel& model, const MilpSolver* solver);

}  // namespace piper::planner
