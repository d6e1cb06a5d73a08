// Plan files: a compiled Plan written as JSON (`piper compile --emit-plan FILE`) and read back.
//
// The file is Plan::to_json() (compile/plan.h): {"format": "piper-plan", "version": 2, "world_size",
// "num_microbatches", "num_layers", "mesh", "rank_template", "coords",
// "programs": [{"pp_rank", "static_bytes", "streams": [{"name", "instructions"}]}]},
// one object per instruction with its fields (docs/ir.md, "Plan files"); a field at its default value is left out.
// The loader checks everything an executor relies on, so that a loaded plan cannot crash or hang the simulator:
// the format and version, every key's type and range (unknown keys are errors: they are typos), the mesh and the
// rank layout (world_size = pp * dp * tp, coords as Plan::rank_of lays them out), one program per pipeline rank,
// peers inside the pipeline, collectives over a known axis, every waited event recorded on the same rank, every
// microbatch and layer inside the plan's, every node an instruction's data flow (inputs, outputs) names lowered by
// an instruction of the same program, the m2n fields only on m2n instructions, sizes
// bounded so that no sum overflows (plan_io.cc), and then what the compiler verified before writing it
// (compile/verify_plan.h: every send has its receive, no deadlock).
// Every error names the field ("plan.programs[1].streams[0].instructions[7].peer: ...") and what to do.
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/compile/plan.h"

namespace piper::compile {

// The plan a Plan::to_json() object describes; `what` names the source in errors (a path).
Result<Plan> plan_from_json(const Json& j, const std::string& what = "plan");

// Reads a plan file (a regular file, base/files.h) written by write_plan_file().
Result<Plan> load_plan_file(const std::string& path);

// Writes plan.to_json() to `path` atomically (base/files.h: a failed write leaves no partial file).
Status write_plan_file(const std::string& path, const Plan& plan);

}  // namespace piper::compile
