// stream: put the matched nodes on a named logical stream (each stream is one total order per rank).
#include "piper/ir/passes/passes.h"

namespace piper::ir {

Status apply_stream(Graph& g, const StreamDirective& d) {
  std::vector<NodeId> hits = g.select(d.filter);
  if (hits.empty()) return invalid_argument("filter " + d.filter.to_string() + " matches no node");
  for (NodeId id : hits) {
    Node& n = g.node(id);
    if (n.order_slot >= 0 && n.stream != d.stream) {
      return invalid_argument(describe(n) + " is already ordered on stream '" + n.stream +
                              "'; give stream directives before the order rows that use them");
    }
    n.stream = d.stream;
  }
  return ok_status();
}

}  // namespace piper::ir
