#include <algorithm>
#include <string>
#include <variant>

#include "piper/ir/passes/passes.h"
#include "piper/ir/verify.h"

namespace piper::ir {
namespace {

// A filter range past the graph selects nothing there: "layer 0-99" on a 4-layer model is a file written for
// another model, refused instead of silently matching layers 0-3.
Status check_range(const TagFilter& f, const IntRange& r, const char* key, int count, const std::string& what) {
  if (r.empty() || r.hi < count) return ok_status();
  return invalid_argument("filter " + f.to_string() + ": " + key + " " + std::to_string(r.lo) +
                          (r.lo == r.hi ? "" : "-" + std::to_string(r.hi)) + " is outside the " + what + " (allowed " +
                          key + " 0.." + std::to_string(count - 1) +
                          "); was the directive file written for another model or mesh?");
}

Status check_filter(const Graph& g, const TagFilter& f) {
  PIPER_RETURN_IF_ERROR(
      check_range(f, f.layer, "layer", g.num_layers, "model's " + std::to_string(g.num_layers) + " layers"));
  PIPER_RETURN_IF_ERROR(check_range(f, f.stage, "stage", g.mesh.num_stages(),
                                    "mesh's pp*vpp = " + std::to_string(g.mesh.num_stages()) + " stages"));
  return check_range(f, f.mb, "mb", g.num_microbatches,
                     "plan's " + std::to_string(g.num_microbatches) + " microbatches (split comes first)");
}

Status check_filters(const Graph& g, const Directive& directive) {
  return std::visit(
      [&](const auto& d) -> Status {
        using T = std::decay_t<decltype(d)>;
        if constexpr (std::is_same_v<T, OrderDirective>) {
          for (const auto& slot : d.slots) {
            for (const TagFilter& f : slot) PIPER_RETURN_IF_ERROR(check_filter(g, f));
          }
          return ok_status();
        } else if constexpr (requires { d.filter; }) {
          return check_filter(g, d.filter);
        } else {
          return ok_status();
        }
      },
      directive.body);
}

}  // namespace

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
  size_t unchecked_from = directives.size();  // first order directive whose cycle check is deferred
  for (size_t i = 0; i < directives.size(); ++i) {
    const auto* order = std::get_if<OrderDirective>(&directives[i].body);
    if (unchecked_from < i && !order) {
      if (!graph.is_acyclic()) {
        return invalid_argument("order directives " + std::to_string(unchecked_from) + "-" + std::to_string(i - 1) +
                                " make a cycle (apply them with defer_order_cycle_checks off to name the directive)");
      }
      unchecked_from = directives.size();
    }
    std::string label = directive_label(directives[i], static_cast<int>(i));
    Status s = check_filters(graph, directives[i]);
    if (s.ok()) {
      if (order && options.defer_order_cycle_checks) {
        s = apply_order(graph, *order, /*check_cycles=*/false);
        unchecked_from = std::min(unchecked_from, i);
      } else {
        s = apply_directive(graph, directives[i]);
      }
    }
    if (!s.ok()) return s.with_context(label);
    if (options.verify_each) {
      s = verify_graph(graph);
      if (!s.ok()) return s.with_context("verifier after " + label);
    }
  }
  if (unchecked_from < directives.size() && !graph.is_acyclic()) {
    return invalid_argument("order directives " + std::to_string(unchecked_from) + "-" +
                            std::to_string(directives.size() - 1) +
                            " make a cycle (apply them with defer_order_cycle_checks off to name the directive)");
  }
  split_unsharded_moe_tokens(graph);
  add_tp_grad_sums(graph);
  return ok_status();
}

}  // namespace piper::ir
