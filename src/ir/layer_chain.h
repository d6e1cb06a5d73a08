// build_layer_chain: the smallest training DAG, a chain of identical layers, each one chunk ("block") with
// tasks F and BW (fused backward) plus an update. `piper schedule` and the schedule tests use it with one
// layer per stage, so a schedule's action lists are exactly the chunk order the directives produce.
#pragma once

#include "piper/ir/graph.h"

namespace piper::ir {

// Edges: F(l) -> F(l+1), F(l) -> BW(l) (activations; the last layer's edge carries the loss),
// BW(l+1) -> BW(l) (input gradient), BW(l) -> U(l) (weight gradient). Tags: layer l, part "block".
Graph build_layer_chain(int num_layers, const MeshInfo& mesh);

}  // namespace piper::ir
