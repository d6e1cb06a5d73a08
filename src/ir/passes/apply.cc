#include <variant>

#include "piper/ir/passes/passes.h"
#include "piper/ir/verify.h"

namespace piper::ir {

Status apply_directive(Graph& graph, const Directive& directive) {
  return std::visit(
      [&](const auto& d) -> Status {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, SplitDirective>) return apply_split(graph, d);
        if constexpr (std::is_same_v<T, PlaceDirective>) return apply_place(graph, d);
        if constexpr (std::is_same_v<T, ReplicateDirective>) return apply_replicate(graph, d);
        if constexpr (std::is_same_v<T, ShardDirective>) return apply_shard(graph, d);
        if constexpr (std::is_same_v<T, OrderDirective>) return apply_order(graph, d);
        if constexpr (std::is_same_v<T, StreamDirective>) return apply_stream(graph, d);
        if constexpr (std::is_same_v<T, RecomputeDirective>) return apply_recompute(graph, d);
        if constexpr (std::is_same_v<T, DisaggregateDirective>) return apply_disaggregate(graph, d);
      },
      directive.body);
}

Status apply_directives(Graph& graph, const std::vector<Directive>& directives, const ApplyOptions& options) {
  for (size_t i = 0; i < directives.size(); ++i) {
    std::string label = directive_label(directives[i], static_cast<int>(i));
    Status s = apply_directive(graph, directives[i]);
    if (!s.ok()) return s.with_context(label);
    if (options.verify_each) {
      s = verify_graph(graph);
      if (!s.ok()) return s.with_context("verifier after " + label);
    }
  }
  return ok_status();
}

}  // namespace piper::ir
