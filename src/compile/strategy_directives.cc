#include "piper/compile/strategy_directives.h"

#include <algorithm>
#include <string>

#include "piper/base/strings.h"
#include "piper/spec/part.h"
#include "piper/strategy/schedules/schedule.h"

namespace piper::compile {

int lowered_etp(const Strategy& s, const ModelSpec& model) { return s.disaggregate || !model.is_moe() ? 1 : s.etp; }

Result<ir::MeshInfo> strategy_mesh(const Strategy& s, const ModelSpec& model) {
  ir::MeshInfo mesh;
  mesh.pp = s.pp;
  mesh.dp = s.dp;
  mesh.ep = s.ep;
  mesh.fold = s.fold;
  // Expert tensor parallelism slices the experts over the etp group (ir shard pass: its gather and reduce-scatter
  // sit next to the ep all-to-alls, or alone with ep = 1, Megatron's expert_model_parallel_size 1); disaggregated
  // experts stay whole.
  mesh.etp = lowered_etp(s, model);
  mesh.tp = s.tp;
  if (s.disaggregate) {
    if (s.schedule != "af-pipe") {
      return invalid_argument("disagg=1 runs with schedule=af-pipe (got schedule=" + s.schedule + ")");
    }
    const int width = s.dp * s.tp;
    if (s.attn_ranks != width * s.pp) {
      return invalid_argument("attn_ranks=" + std::to_string(s.attn_ranks) + " != dp*tp*pp = " +
                              std::to_string(width * s.pp) + "; set attn_ranks=" + std::to_string(width * s.pp));
    }
    if (s.ffn_ranks % width != 0) {
      const int nearest = std::max(1, (s.ffn_ranks + width / 2) / width) * width;
      return invalid_argument("compile: every pipeline rank of a plan runs on dp*tp = " + std::to_string(width) +
                              " ranks, so ffn_ranks=" + std::to_string(s.ffn_ranks) +
                              " must be a multiple of it; set ffn_ranks=" + std::to_string(nearest));
    }
    if (s.ep < 1 || s.dp % s.ep != 0) {
      return invalid_argument("compile: the FFN side of a stage has dp=" + std::to_string(s.dp) +
                              " ranks per tp slice, so ep=" + std::to_string(s.ep) + " must divide dp");
    }
    const int ffn_groups = s.ffn_ranks / width;
    if (ffn_groups == s.pp) {
      if (s.pp < 1 || model.num_layers % s.pp != 0) {
        return invalid_argument("disaggregation deals num_layers=" + std::to_string(model.num_layers) +
                                " round-robin to pp=" + std::to_string(s.pp) +
                                " attention (and FFN) stages: pp must divide num_layers");
      }
      mesh.pp = 2 * s.pp;
      mesh.vpp = model.num_layers / s.pp;
      return mesh;
    }
    // Unequal groups: pp attention and ffn_groups FFN pipeline ranks over the 2 * num_layers stages.
    if (model.num_layers < std::max(s.pp, ffn_groups)) {
      return invalid_argument("disaggregation: num_layers=" + std::to_string(model.num_layers) +
                              " cannot give each of pp=" + std::to_string(s.pp) + " attention and " +
                              std::to_string(ffn_groups) + " FFN pipeline ranks a layer; lower pp or ffn_ranks");
    }
    mesh.pp = s.pp + ffn_groups;
    const int stages = 2 * model.num_layers;
    mesh.vpp = stages % mesh.pp == 0 ? stages / mesh.pp : 1;
    mesh.stages = stages % mesh.pp == 0 ? 0 : stages;
    return mesh;
  }
  schedules::ScheduleParams params{s.pp, s.microbatches, s.vpp};
  PIPER_ASSIGN_OR_RETURN(int stages, schedules::schedule_num_stages(s.schedule, params));
  mesh.vpp = stages / s.pp;
  return mesh;
}

Result<std::vector<ir::Directive>> strategy_directives(const Strategy& s, const ModelSpec& model,
                                                       const DirectiveOptions& options) {
  PIPER_ASSIGN_OR_RETURN(ir::MeshInfo mesh, strategy_mesh(s, model));
  std::vector<ir::Directive> out;
  out.push_back(ir::Directive{ir::SplitDirective{s.microbatches}});
  if (!s.recompute_modules.empty()) {  // counts unsharded bytes: before the shard directives
    ir::RecomputeDirective d;
    d.filter.pass = ir::Pass::kF;
    d.modules = s.recompute_modules;
    out.push_back(ir::Directive{d});
  }
  if (s.tp > 1) {
    // Vocabulary parallelism (embed, head; Megatron's VocabParallelEmbedding and column-parallel output layer):
    // each tp rank holds vocab/tp rows of the embedding and the head. The embedding's partial outputs are
    // all-reduced (with sequence parallelism: reduce-scattered); the head all-gathers its input (sp) and its input
    // gradient is all-reduced / reduce-scattered, as any column-parallel layer's. The cross-entropy's exchange over
    // the vocabulary shards (Megatron: three all-reduces of a float per token; the CPU runtime: one all-gather of 3
    // floats per token, model/chunks/head.cc) is not emitted: the simulator adds it to the head F's task time
    // (cost/vocab_parallel.h), the closed form leaves it out with the embedding's and head's tp collectives.
    for (const Part part : {Part::kAttention, Part::kDenseMlp, Part::kSharedExperts, Part::kEmbedding, Part::kHead}) {
      const bool present = part == Part::kAttention || (part == Part::kDenseMlp && model.num_dense_layers() > 0) ||
                           (part == Part::kSharedExperts && model.moe.num_shared_experts > 0 && model.is_moe()) ||
                           ((part == Part::kEmbedding || part == Part::kHead) && options.vocab_parallel);
      if (!present) continue;
      ir::ShardDirective d;
      d.filter.part = chunk_name(part);
      d.axis = "tp";
      d.algorithm = "ring";
      d.sequence_parallel = s.sp;
      out.push_back(ir::Directive{d});
    }
  }
  if (s.ep > 1 || mesh.etp > 1) {
    ir::ShardDirective d;
    d.filter.part = chunk_name(Part::kExperts);
    d.axis = "ep";
    d.algorithm = s.a2a;
    out.push_back(ir::Directive{d});
  }
  // With dp = 1 too when the experts reduce over tensor ranks (ir::MeshInfo::experts_reduce_over_edp, e.g. tp=2 with
  // sequence parallelism: each tensor rank's experts saw half the tokens).
  const bool expert_reduction =
      model.is_moe() && mesh.experts_reduce_over_edp(s.sp && s.tp > 1) && mesh.expert_replicas() > 1;
  if (s.dp > 1 || expert_reduction) {
    ir::ReplicateDirective d;
    d.zero = s.zero;
    d.reduce = s.zero >= 1 ? "reduce_scatter" : "all_reduce";
    if (options.overlap_param_gather) d.param_gather = "before_forward";
    out.push_back(ir::Directive{d});
  }
  if (s.recompute != Recompute::kNone) {
    ir::RecomputeDirective d;
    d.filter.pass = ir::Pass::kF;
    if (s.recompute == Recompute::kSelective) d.filter.part = chunk_name(Part::kAttention);
    out.push_back(ir::Directive{d});
  }
  if (s.disaggregate) {
    out.push_back(ir::Directive{ir::DisaggregateDirective{s.pp, mesh.pp - s.pp, s.attn_ports, s.ffn_ports}});
  } else {
    PIPER_ASSIGN_OR_RETURN(auto parts, schedules::partition_directives(model.num_layers, mesh.num_stages()));
    out.insert(out.end(), parts.begin(), parts.end());
  }
  schedules::ScheduleParams params{mesh.pp, s.microbatches, mesh.vpp, s.ep_overlap};
  if (s.disaggregate) {
    params.attn_groups = s.pp;
    params.stages = mesh.stages;
  }
  PIPER_ASSIGN_OR_RETURN(auto sched, schedules::schedule_directives(s.schedule, params));
  out.insert(out.end(), sched.begin(), sched.end());
  return out;
}

Status check_directives_fill_mesh(const ir::Graph& graph) {
  const ir::MeshInfo& mesh = graph.mesh;
  std::vector<bool> busy(static_cast<size_t>(mesh.pp), false);
  std::vector<bool> staged(static_cast<size_t>(mesh.num_stages()), false);
  int max_rank = -1, max_stage = -1;
  for (const ir::Node& n : graph.nodes()) {
    if (n.kind != ir::NodeKind::kChunk) continue;
    if (n.tags.stage >= 0 && n.tags.stage < mesh.num_stages()) {
      staged[static_cast<size_t>(n.tags.stage)] = true;
      max_stage = std::max(max_stage, n.tags.stage);
    }
    if (n.pp_rank >= 0 && n.pp_rank < mesh.pp) {
      busy[static_cast<size_t>(n.pp_rank)] = true;
      max_rank = std::max(max_rank, n.pp_rank);
    }
  }
  auto unused = [](const std::vector<bool>& used) {
    std::vector<std::string> out;
    for (size_t i = 0; i < used.size(); ++i) {
      if (!used[i]) out.push_back(std::to_string(i));
    }
    return out;
  };
  const std::vector<std::string> idle = unused(busy);
  const std::string given = "the mesh has pp=" + std::to_string(mesh.pp) + ", vpp=" + std::to_string(mesh.vpp);
  if (!idle.empty() && max_rank >= 0) {
    const int file_pp = max_rank + 1;
    if (file_pp == mesh.pp) {
      return invalid_argument("the directives leave pipeline rank(s) " + join(idle, ", ") + " of the mesh pp=" +
                              std::to_string(mesh.pp) + " without work; place a stage on every rank");
    }
    return invalid_argument(
        "the directives place the model on pipeline ranks 0.." + std::to_string(max_rank) + " (" +
        std::to_string(std::max(max_stage + 1, file_pp)) + " stages: written for pp=" + std::to_string(file_pp) +
        ") but " + given + ": pipeline rank(s) " + join(idle, ", ") +
        " would have no work; compile with the mesh the file was written for (--mesh pp=" + std::to_string(file_pp) +
        ") or emit the directives again for pp=" + std::to_string(mesh.pp));
  }
  // Stages in use (placement by stage tag) must be the mesh's pp*vpp: a file for vpp=1 under vpp=2 leaves half.
  const std::vector<std::string> empty_stages = unused(staged);
  if (max_stage >= 0 && !empty_stages.empty()) {
    return invalid_argument("the directives tag layers with stages 0.." + std::to_string(max_stage) + " but " + given +
                            " = " + std::to_string(mesh.num_stages()) + " stages: stage(s) " +
                            join(empty_stages, ", ") +
                            " would hold no layer; compile with the pp and vpp the file was written for, or place "
                            "a layer on every stage");
  }
  // A mesh with etp > 1 slices every experts chunk over its etp group (the runtime builds the slices from the mesh):
  // the slices need the etp exchanges that the experts' shard ep puts around them.
  for (const ir::Node& n : graph.nodes()) {
    if (mesh.etp > 1 && n.kind == ir::NodeKind::kChunk && chunk_part(n.tags.part) == Part::kExperts &&
        n.tags.pass != ir::Pass::kW && n.shard_axis != "ep") {
      return invalid_argument("the mesh has etp=" + std::to_string(mesh.etp) + " but " + ir::describe(n) +
                              " is not sharded over ep, so its expert slices would have no etp gather and "
                              "reduce-scatter; add a shard directive with axis ep on the experts or set etp=1");
    }
  }
  return ok_status();
}

}  // namespace piper::compile
