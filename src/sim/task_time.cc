#include "piper/sim/task_time.h"

#include <array>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "piper/cost/layer_cost.h"
#include "piper/cost/model_state.h"
#include "piper/cost/tp_overlap.h"
#include "piper/cost/vocab_parallel.h"

namespace piper::sim {
namespace {

using cost::Part;
using cost::TaskCost;

enum Task { kF, kB, kW };

// The cost parts behind one chunk part (the attention chunk holds its core and the layer's norms too).
std::vector<Part> parts_of(Part chunk) {
  if (chunk == Part::kAttention) return {Part::kAttention, Part::kAttentionCore, Part::kNorms};
  return {chunk};
}

struct PartPrice {
  std::array<TaskCost, 3> cost;  // summed over the cost parts, per task
  std::array<double, 3> time_s{};
  double update_s = 0;
  // tp_overlap pieces (compile::Segment): the block's input and output GEMMs per task, time and flops.
  std::array<double, 3> in_s{}, out_s{}, in_flops{}, out_flops{};
};

// Whether `program` steps the embedding's parameters (its rank holds the embedding: a tied LM head there shares
// them and updates nothing of its own).
bool updates_embedding(const compile::Program& program) {
  for (const compile::Stream& s : program.streams) {
    for (const compile::Instruction& in : s.instrs) {
      if (in.op == compile::OpKind::kUpdate && in.part == Part::kEmbedding) return true;
    }
  }
  return false;
}

struct Prices {
  std::array<std::optional<PartPrice>, kNumParts> parts;  // by chunk part (spec/part.h)
  double out_sm_share = 1;  // Calibration::tp_overlap_gemm_sm_share
  double vocab_stats_s = 0;  // a split head's F: the cross-entropy statistics exchange (cost/vocab_parallel.h)
  const PartPrice* find(std::optional<Part> part) const {
    if (!part || !parts[static_cast<size_t>(*part)]) return nullptr;
    return &*parts[static_cast<size_t>(*part)];
  }
};

void add(TaskCost& a, const TaskCost& b) {
  a.flops += b.flops;
  a.bytes += b.bytes;
  a.pointwise_bytes += b.pointwise_bytes;
  a.fixed_s += b.fixed_s;
}

// tp_overlap pieces: the block's first and last GEMM (cost/tp_overlap.h), from the IR part's matmul cost part
// (block_gemms gives zeros for every other cost part, so parts without a tp block get none).
void split_gemms(const cost::PartTable& table, const cost::DeviceModel& dev, const cost::PartShape& shape, Part chunk,
                 PartPrice& p) {
  for (Part part : parts_of(chunk)) {
    const cost::BlockGemms g = cost::block_gemms(table, dev, shape, part);
    for (size_t k = 0; k < 3; ++k) {
      p.in_s[k] += g.first_s[k];
      p.out_s[k] += g.last_s[k];
      p.in_flops[k] += g.first_flops[k];
      p.out_flops[k] += g.last_flops[k];
    }
  }
}

// A chunk's F, B, W times and costs (no update) at `shape`. Same formula as the estimate: each cost part is its own
// kernel (roofline + pointwise traffic); fp8/mxfp8 run the block GEMMs at the fp8 peak, the rest at bf16's
// (CostModel::device_for); the times at the task profile's scales.
PartPrice price_chunk(const cost::CostModel& cm, const cost::PartShape& shape, Part chunk) {
  PartPrice p;
  for (Part part : parts_of(chunk)) {
    cost::PartCost c = cost::part_cost(cm.parts(), part, shape);
    const TaskCost* tasks[3] = {&c.f, &c.b, &c.w};
    for (int k = 0; k < 3; ++k) {
      const cost::DeviceModel& part_dev = cm.device_for(part);
      p.time_s[static_cast<size_t>(k)] += cost::task_time_s(*tasks[k], part_dev);
      add(p.cost[static_cast<size_t>(k)], *tasks[k]);
    }
  }
  split_gemms(cm.parts(), cm.device(), shape, chunk, p);
  // The model's measured task profile, where the calibration has one for it (cost/task_profile.h): the whole task
  // and its tp_overlap pieces alike.
  const cost::TaskScales scales = cm.task_scales(shape.tokens);
  for (size_t k = 0; k < 3; ++k) {
    const double x = scales.of(chunk, static_cast<int>(k));
    p.time_s[k] *= x;
    p.in_s[k] *= x;
    p.out_s[k] *= x;
  }
  return p;
}

Result<std::shared_ptr<const Prices>> make_prices(const cost::CostModel& cm, const Strategy& s,
                                                  const cost::Calibration& cal) {
  PIPER_RETURN_IF_ERROR(s.validate_for(cm.model(), cm.train(), s.world_size()));
  const cost::PartTable& table = cm.parts();
  const cost::DeviceModel& dev = cm.device();
  const cost::PartShape shape = cm.part_shape(s, cal);
  // Parameters per rank and the ZeRO shard degree of each IR part (as the estimate's dense/expert split).
  const double tp = s.tp;
  const double expert_shard = std::max(1, s.expert_replicas());
  auto shard_params = [&](Part part) {
    double params = 0, shard = s.dp;
    switch (part) {
      case Part::kAttention:
        params = table.attention_params / tp + table.norm_params_per_layer;
        break;
      case Part::kRouter:
        params = table.router_params;
        break;
      case Part::kExperts:
        params = table.num_experts / s.ep * table.expert_params / s.etp;
        shard = expert_shard;
        break;
      case Part::kSharedExperts:
        params = table.shared_params / tp;
        break;
      case Part::kDenseMlp:
        params = table.dense_mlp_params / tp;
        break;
      case Part::kEmbedding:
        params = table.embedding_params / tp;
        break;
      case Part::kHead:
        params = table.head_params / tp;  // tied: only when not on the embedding's rank (below)
        break;
      default:
        break;
    }
    return s.zero >= 1 ? params / shard : params;
  };
  const double update_scale = cm.task_scales(shape.tokens).update;
  auto prices = std::make_shared<Prices>();
  for (Part chunk : kChunkParts) {
    PartPrice p = price_chunk(cm, shape, chunk);
    p.update_s = update_scale *
                 dev.time_s(0, shard_params(chunk) * cost::optimizer_step_bytes_per_param(cm.bytes()), 0);
    prices->parts[static_cast<size_t>(chunk)] = p;
  }
  prices->out_sm_share = cal.tp_overlap_gemm_sm_share;
  prices->vocab_stats_s = cost::vocab_stats_exchange_s(cm, s, shape.tokens);
  return std::shared_ptr<const Prices>(std::move(prices));
}

// Task index of a pass; BW counts as B + W.
double task_value(const std::array<double, 3>& v, ir::Pass pass) {
  switch (pass) {
    case ir::Pass::kF:
      return v[kF];
    case ir::Pass::kB:
      return v[kB];
    case ir::Pass::kW:
      return v[kW];
    case ir::Pass::kBW:
      return v[kB] + v[kW];
    default:
      return 0;
  }
}

// The share of a node's `whole` value (per task) that instruction `in` does (compile::Segment).
double piece_value(const std::array<double, 3>& whole, const std::array<double, 3>& in_gemm,
                   const std::array<double, 3>& out_gemm, const compile::Instruction& in) {
  const int pieces = std::max(1, in.pieces);
  switch (in.segment) {
    case compile::Segment::kWhole:
      return task_value(whole, in.pass);
    case compile::Segment::kIn:
      return task_value(in_gemm, in.pass) / pieces;
    case compile::Segment::kOut:
      return task_value(out_gemm, in.pass) / pieces;
    case compile::Segment::kRest:
      return task_value(whole, in.pass) - (in.split_in ? task_value(in_gemm, in.pass) : 0.0) -
             (in.split_out ? task_value(out_gemm, in.pass) : 0.0);
  }
  return 0;
}

}  // namespace

Result<TaskTimeFn> cost_task_time(const cost::CostModel& model, const Strategy& strategy,
                                  const cost::Calibration& calibration) {
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Prices> prices, make_prices(model, strategy, calibration));
  const bool tied = model.model().tie_embeddings;
  return TaskTimeFn([prices, tied](const compile::Program& program, const compile::Instruction& in) -> double {
    if (in.op != compile::OpKind::kCompute && in.op != compile::OpKind::kUpdate) return 0.0;
    const PartPrice* p = prices->find(in.part);
    if (p == nullptr) return std::numeric_limits<double>::quiet_NaN();  // unpriced part: simulate_plan reports it
    if (in.op == compile::OpKind::kUpdate) {
      const bool shared_with_embedding = tied && in.part == Part::kHead && updates_embedding(program);
      return shared_with_embedding ? 0.0 : p->update_s;
    }
    // A recomputed forward is a compute instruction of pass F inside the backward: it costs f again (and a split
    // head's F its statistics exchange again).
    const bool split_head = in.part == Part::kHead && in.shard_axis == "tp" && in.pass == ir::Pass::kF;
    return piece_value(p->time_s, p->in_s, p->out_s, in) *
               (in.segment == compile::Segment::kOut ? 1 / prices->out_sm_share : 1.0) +
           (split_head ? prices->vocab_stats_s : 0.0);
  });
}

Result<ExpertTimeFn> cost_expert_time(const cost::CostModel& model, const Strategy& strategy,
                                      const cost::Calibration& calibration) {
  PIPER_RETURN_IF_ERROR(strategy.validate_for(model.model(), model.train(), strategy.world_size()));
  const cost::PartShape shape = model.part_shape(strategy, calibration);
  return ExpertTimeFn([model, shape](const compile::Instruction& in, double load) -> double {
    if (in.op != compile::OpKind::kCompute || in.part != Part::kExperts) return 0.0;
    cost::PartShape at = shape;
    at.expert_load = load;
    const PartPrice p = price_chunk(model, at, Part::kExperts);
    return piece_value(p.time_s, p.in_s, p.out_s, in);
  });
}

Result<compile::CostFn> cost_annotations(const cost::CostModel& model, const Strategy& strategy,
                                         const cost::Calibration& calibration) {
  PIPER_ASSIGN_OR_RETURN(std::shared_ptr<const Prices> prices, make_prices(model, strategy, calibration));
  // comm_bytes stays the node's payload, which the lowering filled in.
  return compile::CostFn([prices](compile::Instruction& in) {
    const PartPrice* p = prices->find(in.part);
    if (p == nullptr || in.op != compile::OpKind::kCompute) return;
    std::array<double, 3> flops{}, bytes{};
    for (size_t k = 0; k < 3; ++k) {
      flops[k] = p->cost[k].flops;
      bytes[k] = p->cost[k].bytes + p->cost[k].pointwise_bytes;
    }
    in.flops = static_cast<int64_t>(piece_value(flops, p->in_flops, p->out_flops, in));
    // Memory traffic stays on the whole node or its kRest piece (a GEMM piece's own bytes are not split out).
    const bool gemm_piece = in.segment == compile::Segment::kIn || in.segment == compile::Segment::kOut;
    in.bytes = gemm_piece ? 0 : static_cast<int64_t>(task_value(bytes, in.pass));
  });
}

TaskTimeFn unit_task_time(Part part, double f, double b, double w) {
  const std::array<double, 3> v = {f, b, w};
  return [part, v](const compile::Program&, const compile::Instruction& in) -> double {
    if (in.op != compile::OpKind::kCompute) return 0.0;
    return in.part == part ? task_value(v, in.pass) : 0.0;
  };
}

}  // namespace piper::sim
