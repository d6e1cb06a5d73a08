// Durations of compute and optimizer-update instructions, from the resource model (src/cost/).
//
// One source of truth: the simulator prices a chunk task with exactly the part costs and roofline that
// cost::CostModel::estimate() sums per stage: layer_cost.h's part_cost() for the same PartShape (tokens of one
// microbatch, tp, ep, etp, dtypes, expert load imbalance) and the DeviceModel's time_s() + memory_time_s(). The IR
// parts map to cost parts as
//   attn -> attention + attention core + norms    router -> router      experts -> experts
//   shared -> shared experts    mlp -> dense MLP    embed -> embedding   head -> head (LM head + loss)
// and passes F, B, W to the part's f, b, w (a fused BW is b + w; a recomputed F costs f again). An update
// instruction streams the optimizer bytes of the rank's parameter shard (ZeRO >= 1 shards dense parameters over
// dp, experts over dp / ep * tp / etp), as the estimate's optimizer term does; a tied LM head updates nothing on the
// embedding's rank and a full copy elsewhere. Both read only the instruction (its op, part, pass, segment) and,
// for a tied head's update, whether its program also updates the embedding; the returned functions are pure.
// cost_annotations() fills the Plan's flops/bytes annotations from the same numbers (pass it as
// CompileOptions::cost) so that the plan, the simulator and the estimate agree.
#pragma once

#include <functional>

#include "piper/base/status.h"
#include "piper/compile/plan.h"
#include "piper/cost/device_model.h"
#include "piper/cost/estimate.h"
#include "piper/strategy/strategy.h"

namespace piper::sim {

// Seconds one compute or update instruction of `program` keeps the device's compute engine busy. NaN (or a
// negative value) means "cannot price this instruction"; simulate_plan() turns it into an error naming the
// instruction.
using TaskTimeFn = std::function<double(const compile::Program& program, const compile::Instruction& instr)>;

// Errors: a strategy the cost model rejects (validate_for), or a chunk part the cost model has no price for.
Result<TaskTimeFn> cost_task_time(const cost::CostModel& model, const Strategy& strategy,
                                  const cost::Calibration& calibration = {});

// The seconds of an experts compute instruction when its rank's experts receive `load` x the mean rank's routed
// rows (cost_task_time prices them at calibration.expert_load_imbalance); 0 for any other instruction. For
// simulations that price each ep rank from its own measured load (expert_rank_loads.h). Copies `model`.
using ExpertTimeFn = std::function<double(const compile::Instruction& instr, double load)>;
Result<ExpertTimeFn> cost_expert_time(const cost::CostModel& model, const Strategy& strategy,
                                      const cost::Calibration& calibration = {});

Result<compile::CostFn> cost_annotations(const cost::CostModel& model, const Strategy& strategy,
                                         const cost::Calibration& calibration = {});

// Unit costs for schedule checks: a chunk of part `part` costs f, b, w for F, B, W (BW = b + w); every other chunk
// and every update costs 0.
TaskTimeFn unit_task_time(Part part, double f = 1, double b = 1, double w = 1);

}  // namespace piper::sim
