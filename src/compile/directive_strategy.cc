#include "piper/compile/directive_strategy.h"

#include <variant>

#include "piper/compile/strategy_directives.h"
#include "piper/compile/target.h"
#include "piper/spec/part.h"

namespace piper::compile {
namespace {

// The settings a strategy shares with its directives, read from the directives.
Strategy settings_of(const ir::MeshInfo& mesh, const std::vector<ir::Directive>& directives, int mbs) {
  Strategy s;
  s.dp = mesh.dp;
  s.tp = mesh.tp;
  s.ep = mesh.ep;
  s.pp = mesh.pp;
  s.fold = mesh.fold;
  s.etp = mesh.etp;
  s.mbs = mbs;
  s.microbatches = directive_microbatches(directives);
  for (const ir::Directive& d : directives) {
    if (const auto* r = std::get_if<ir::ReplicateDirective>(&d.body)) s.zero = std::max(s.zero, r->zero);
    if (const auto* sh = std::get_if<ir::ShardDirective>(&d.body)) {
      if (sh->axis == "tp") s.sp = s.sp || sh->sequence_parallel;
      if (sh->axis == "ep") s.a2a = sh->algorithm;
    }
    if (const auto* rc = std::get_if<ir::RecomputeDirective>(&d.body)) {
      if (!rc->modules.empty()) {
        s.recompute_modules = rc->modules;
      } else if (chunk_part(rc->filter.part) == Part::kAttention) {
        s.recompute = s.recompute == Recompute::kFull ? Recompute::kFull : Recompute::kSelective;
      } else {
        s.recompute = Recompute::kFull;
      }
    }
    if (const auto* dg = std::get_if<ir::DisaggregateDirective>(&d.body)) {
      s.disaggregate = true;
      s.schedule = "af-pipe";
      s.pp = dg->attn_groups;
      s.attn_ranks = s.dp * s.tp * dg->attn_groups;
      s.ffn_ranks = s.dp * s.tp * dg->ffn_groups;
      s.attn_ports = dg->attn_ports;
      s.ffn_ports = dg->ffn_ports;
    }
  }
  return s;
}

bool same_mesh(const ir::MeshInfo& a, const ir::MeshInfo& b) {
  return a.pp == b.pp && a.vpp == b.vpp && a.dp == b.dp && a.ep == b.ep && a.tp == b.tp && a.fold == b.fold &&
         a.etp == b.etp && a.num_stages() == b.num_stages();
}

// Schedule variants of `base` on the mesh that validate, in the order they are tried.
std::vector<Strategy> candidates(const Strategy& base, const ModelSpec& model, const ir::MeshInfo& mesh) {
  std::vector<Strategy> out;
  std::vector<std::string> names = base.disaggregate ? std::vector<std::string>{"af-pipe"} : known_schedule_names();
  for (const std::string& name : names) {
    if (!base.disaggregate && name == "af-pipe") continue;
    for (bool overlap : {false, true}) {
      Strategy s = base;
      s.schedule = name;
      s.ep_overlap = overlap;
      s.vpp = name == "interleaved" || parse_schedule(name).value() == ScheduleKind::kCustom ? mesh.vpp : 1;
      if (!s.validate().ok()) continue;
      auto m = strategy_mesh(s, model);
      if (!m.ok() || !same_mesh(*m, mesh)) continue;
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace

int directive_microbatches(const std::vector<ir::Directive>& directives) {
  for (const ir::Directive& d : directives) {
    if (const auto* sp = std::get_if<ir::SplitDirective>(&d.body)) return sp->microbatches;
  }
  return 1;
}

Result<DirectiveStrategy> strategy_of_directives(const ModelSpec& model, const ir::MeshInfo& mesh,
                                                 const std::vector<ir::Directive>& directives, int mbs) {
  const Strategy base = settings_of(mesh, directives, mbs);
  const std::vector<Strategy> tried = candidates(base, model, mesh);
  const std::string text = ir::directives_to_json(directives).dump();
  for (const Strategy& s : tried) {
    for (const Target& target : {megatron_target(), cpu_runtime_target()}) {
      DirectiveOptions options;
      options.vocab_parallel = target.vocab_parallel;
      options.overlap_param_gather = target.overlap_param_gather;
      auto emitted = strategy_directives(s, model, options);
      if (emitted.ok() && ir::directives_to_json(*emitted).dump() == text) return DirectiveStrategy{s, true, target.name};
    }
  }
  if (tried.empty()) {
    Status why = base.validate();
    return invalid_argument(
        "the directives on mesh pp=" + std::to_string(mesh.pp) + ",vpp=" + std::to_string(mesh.vpp) +
        ",dp=" + std::to_string(mesh.dp) + ",ep=" + std::to_string(mesh.ep) + ",tp=" + std::to_string(mesh.tp) +
        " match no strategy that could price their tasks (microbatches=" + std::to_string(base.microbatches) +
        ", zero=" + std::to_string(base.zero) + (why.ok() ? "" : ": " + why.message()) +
        "); check --mesh against the file's place directives and the split's microbatches");
  }
  return DirectiveStrategy{tried.front(), false, ""};
}

}  // namespace piper::compile
