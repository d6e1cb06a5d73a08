// The graph verifier: structural invariants every pass must keep. Run after each directive in test builds.
//
// Checks: edges join existing nodes; the graph is acyclic; stages and pipeline ranks are inside the mesh;
// temporal edges never join nodes on two different pipeline ranks; each (rank, stream) order is dense
// (slots 0..k-1 without holes) and every ordered node is placed; send/recv nodes come in matched pairs.
// Errors name the node(s) involved.
#pragma once

#include "piper/base/status.h"
#include "piper/ir/graph.h"

namespace piper::ir {

Status verify_graph(const Graph& graph);

}  // namespace piper::ir
