// verify_plan: checks a lowered Plan before anyone runs or simulates it.
//
//  - every send/m2n-send has exactly one receive on its peer rank with the same tag, and vice versa;
//  - every wait has a record of the same event on the same rank;
//  - no deadlock under blocking point-to-point semantics: an abstract execution advances every stream of every
//    program; a send and its receive complete together (rendezvous) only when both are at the head of their
//    streams; a wait needs its record done; collectives complete locally, since all members of a dp/ep/tp
//    group run the same program template and reach them in the same order;
//  - with a capacity (> 0), the peak live bytes per rank along that execution (static model state plus the
//    alloc/free deltas) must fit;
//  - the experts' gradients reduce where ir::MeshInfo::experts_reduce_over_edp says: when it holds (folded tp x ep,
//    etp > 1, sequence parallelism) none over dp, and each rank that updates a layer's experts reduces them over
//    edp (when that group has more than one rank), since the runtime then no longer sums them over tp itself;
//  - with tp > 1 every chunk whose gradients are partial sums over tp (the tensors a split chunk keeps whole; under
//    sequence parallelism every unsplit chunk but experts reduced over edp) has one tp gradient sum
//    (CommRole::kTpGradSum) on the rank that updates it, and no other chunk has one (ir::add_tp_grad_sums).
// Errors name the rank, the stream and the instruction (index and label).
#pragma once

#include <cstdint>

#include "piper/base/status.h"
#include "piper/compile/plan.h"

namespace piper::compile {

struct PlanStats {
  std::vector<int64_t> peak_bytes;  // per template (pipeline rank)
  size_t instructions = 0;
};

Result<PlanStats> verify_plan(const Plan& plan, int64_t capacity_bytes = 0);

}  // namespace piper::compile
