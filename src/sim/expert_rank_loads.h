// Measured expert loads in a simulation of every rank: each ep rank's experts priced from its own share of the
// routed tokens (balance/expert_loads.h RankLoads: `piper simulate --full --expert-loads F`, `piper train`'s
// prediction), time and memory.
//
// A plan's programs are templates shared by the ranks of a pipeline rank, with the experts' compute priced and
// their activation buffers sized for one load (the cost annotations' and CompileOptions::expert_load: the busiest
// ep rank under --expert-loads, 1 without). For a simulated rank of ep coordinate e, in every MoE layer l:
//   - an experts compute instruction takes expert_time(instruction, factor(l, e)) seconds instead of its template's;
//   - an experts activation buffer (the first alloc before an experts forward, or before its recomputation: the
//     runtime's convention, runtime/exec/executor.cc resolve_alloc; not a recompute checkpoint, which is per token,
//     nor ZeRO-3's gathered parameters), the experts backward's working set (the first alloc before an experts B
//     or BW; its small per-token part, dout and dhn, scales with it too) and a B's gradients for its W (the
//     second alloc before an experts B) hold llround(bytes x peak(l, e) / plan_load), peak being the rank's factor
//     in its busiest step over the MoE layers its program holds (RankLoads::peak_over: its peak memory comes from
//     that step; a file without step_tokens gives the busiest step over every layer), and their frees release them.
// The representative simulation (one rank per pipeline rank) and the closed form keep the busiest rank's load
// (time: Calibration::expert_load_imbalance; memory: Calibration::memory_load()).
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "piper/balance/expert_loads.h"
#include "piper/compile/plan.h"

namespace piper::sim {

struct ExpertRankLoads {
  balance::RankLoads loads;  // no layers: off
  double plan_load = 1;      // the load the plan's experts buffers are sized for (CompileOptions::expert_load), > 0
  // With per-step loads (loads.step_factor), the step's time is the mean over the recorded steps from this one on
  // (load_steps()) of a simulation of each with that step's own factors (RankLoads::at_step): each all-to-all waits
  // for the layer's busiest rank in that step, and which rank that is changes from step to step, so the run's mean
  // loads (the mean of the maxima is above the maximum of the means) under-price it. piper train's own loads: 1, as
  // its measured step time leaves the first step out.
  size_t first_step = 0;
  // Seconds of an experts compute instruction at `load` x the mean rank's rows (task_time.h cost_expert_time;
  // simulate_compiled() fills it when empty).
  std::function<double(const compile::Instruction&, double load)> expert_time;
  bool on() const { return !loads.layers.empty(); }
};

// At most this many recorded steps are simulated one by one (evenly spaced over the steps from first_step).
inline constexpr size_t kMaxLoadSteps = 16;

// The steps of loads.step_factor a simulation averages its time over (above): none when off, without per-step
// loads, or with first_step past the last step; else every step from first_step, or kMaxLoadSteps of them evenly
// spaced, in increasing order.
std::vector<size_t> load_steps(const ExpertRankLoads& loads);

// One simulated rank's departures from its template.
struct RankLoadOverrides {
  std::vector<std::vector<double>> duration_s;    // [stream][instr]: compute seconds (else 0, unused)
  std::unordered_map<int, int64_t> buffer_bytes;  // experts activation buffer id -> its bytes on this rank
};

// The overrides of ep coordinate `ep_rank` on `prog`, whose template durations are `template_s` ([stream][instr]).
// Errors: an experts instruction the cost model cannot price (named).
Result<RankLoadOverrides> rank_load_overrides(const compile::Program& prog,
                                              const std::vector<std::vector<double>>& template_s, int ep_rank,
                                              const ExpertRankLoads& loads);

// `prog`'s experts activation buffers (above), by buffer id: each one's layer and planned bytes.
struct ExpertsBuffer {
  int layer = -1;
  int64_t bytes = 0;
  bool backward = false;  // the backward's working set (else the forward's stash)
};
std::unordered_map<int, ExpertsBuffer> experts_buffers(const compile::Program& prog);

}  // namespace piper::sim
