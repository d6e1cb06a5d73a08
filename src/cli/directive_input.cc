#include "piper/cli/directive_input.h"

#include "piper/base/files.h"
#include "piper/base/strings.h"
#include "piper/cli/flags.h"

namespace piper::cli {

Result<ir::MeshInfo> parse_mesh(const std::string& text) {
  ir::MeshInfo mesh;
  for (const std::string& item : split(text, ',')) {
    auto kv = split(trim(item), '=');
    if (kv.size() != 2) return invalid_argument("--mesh '" + elide(text) + "': expected key=value pairs such as pp=2,dp=4");
    PIPER_ASSIGN_OR_RETURN(int64_t v, parse_int(trim(kv[1]), "--mesh " + kv[0]));
    if (v < 1 || v > kMaxMeshDegree) {
      return invalid_argument("--mesh " + elide(item) + ": degrees must be in [1, " + std::to_string(kMaxMeshDegree) +
                              "] (ranks along one axis)");
    }
    const std::string key = trim(kv[0]);
    int* field = key == "pp"    ? &mesh.pp
                 : key == "vpp" ? &mesh.vpp
                 : key == "dp"  ? &mesh.dp
                 : key == "ep"  ? &mesh.ep
                 : key == "tp"  ? &mesh.tp
                 : key == "etp" ? &mesh.etp
                 : key == "stages" ? &mesh.stages
                                : nullptr;
    if (field == nullptr) {
      return invalid_argument("--mesh: unknown axis '" + key + "'; use pp, vpp, dp, ep, tp, etp (or stages)");
    }
    *field = static_cast<int>(v);
  }
  const int64_t world = static_cast<int64_t>(mesh.pp) * mesh.dp * mesh.tp;
  if (world > kMaxWorldSize) {
    return invalid_argument("--mesh '" + elide(text) + "': pp*dp*tp = " + std::to_string(world) + " ranks; at most " +
                            std::to_string(kMaxWorldSize) + " (one program per rank); use smaller degrees");
  }
  if (mesh.dp % mesh.ep != 0) {
    return invalid_argument("--mesh: ep=" + std::to_string(mesh.ep) + " must divide dp=" + std::to_string(mesh.dp));
  }
  if (mesh.etp > 1 && mesh.tp % mesh.etp != 0) {
    return invalid_argument("--mesh: etp=" + std::to_string(mesh.etp) +
                            " slices the experts over tensor ranks: " + "it must divide tp=" + std::to_string(mesh.tp));
  }
  if (mesh.stages == mesh.pp * mesh.vpp) mesh.stages = 0;  // stages= is for a count that pp*vpp cannot give
  return mesh;
}

namespace {

// The mesh text, parsed and checked against the run's ranks (`world` > 0).
Result<ir::MeshInfo> checked_mesh(const std::string& mesh, int world) {
  PIPER_ASSIGN_OR_RETURN(ir::MeshInfo m, parse_mesh(mesh));
  const int64_t ranks = static_cast<int64_t>(m.pp) * m.dp * m.tp;
  if (world > 0 && ranks != world) {
    return invalid_argument("--mesh " + mesh + " has pp*dp*tp = " + std::to_string(ranks) + " ranks but the run has " +
                            std::to_string(world) + "; give a mesh of " + std::to_string(world) +
                            " ranks or change --nodes / --ranks");
  }
  return m;
}

// Resolves the strategy of in->directives on in->mesh (in->file names them in messages).
Status resolve_strategy(const ModelSpec& model, int64_t global_batch, DirectiveInput* in) {
  const int microbatches = compile::directive_microbatches(in->directives);
  int mbs = 1;
  if (global_batch > 0) {
    const int64_t per = static_cast<int64_t>(in->mesh.dp) * microbatches;
    if (global_batch % per != 0) {
      return invalid_argument("--global-batch " + std::to_string(global_batch) + " is not a multiple of dp*microbatches = " +
                              std::to_string(per) + " (the mesh's dp and the file's split); give a multiple of " +
                              std::to_string(per));
    }
    mbs = static_cast<int>(global_batch / per);
  }
  auto resolved = compile::strategy_of_directives(model, in->mesh, in->directives, mbs);
  if (!resolved.ok()) return resolved.status().with_context("--directives " + in->file);
  in->resolved = std::move(resolved).value();
  return ok_status();
}

}  // namespace

Result<DirectiveInput> load_directive_input(const ModelSpec& model, const std::string& strategy,
                                            const std::string& file, const std::string& mesh, int64_t global_batch,
                                            int world) {
  if (!strategy.empty() && !file.empty()) {
    return invalid_argument("--strategy and --directives both given; give one: a strategy, or a directive file "
                            "with --mesh");
  }
  if (file.empty()) return invalid_argument("give --strategy S (dp=8,pp=4,...) or --directives FILE --mesh M");
  if (mesh.empty()) {
    return invalid_argument("--directives " + file + " needs --mesh pp=P[,vpp=V,dp=D,ep=E,tp=T] (the mesh the file "
                            "was written for; `piper compile --emit-directives` prints it)");
  }
  DirectiveInput in;
  in.file = file;
  PIPER_ASSIGN_OR_RETURN(in.mesh, checked_mesh(mesh, world));
  PIPER_ASSIGN_OR_RETURN(in.directives, ir::load_directives_file(file));
  PIPER_RETURN_IF_ERROR(resolve_strategy(model, global_batch, &in));
  return in;
}

Result<DirectiveInput> resolve_directive_input(const ModelSpec& model, std::vector<ir::Directive> directives,
                                               const std::string& label, const std::string& mesh,
                                               int64_t global_batch, int world) {
  if (mesh.empty()) {
    return invalid_argument("--directives " + label + " needs --mesh pp=P[,vpp=V,dp=D,ep=E,tp=T] (the mesh the "
                            "directives were written for)");
  }
  DirectiveInput in;
  in.file = label;
  PIPER_ASSIGN_OR_RETURN(in.mesh, checked_mesh(mesh, world));
  in.directives = std::move(directives);
  PIPER_RETURN_IF_ERROR(resolve_strategy(model, global_batch, &in));
  return in;
}

std::string describe(const DirectiveInput& in) {
  const std::string s = in.resolved.strategy.to_string();
  return in.resolved.recognised
             ? "the directives of " + s + " (" + in.resolved.target + " target)"
             : "its own schedule; tasks priced as " + s;
}

}  // namespace piper::cli
