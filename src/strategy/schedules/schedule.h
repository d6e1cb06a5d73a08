// Pipeline schedules as directive generators.
//
// A schedule is a function from ScheduleParams to a list of ir::Directive: `place` directives that put each
// pipeline stage on a pipeline rank, then one `order` row per rank (a list of slots; a slot with several
// filters means "may overlap", as DualPipeV's F&B pairs). Nothing else: the built-ins use only the public
// directive API, so a user schedule written in C++ (register_schedule) or as a JSON directive file goes through
// exactly the same path (ir passes -> action lists / lowering).
//
// Stages are numbered along the model (stage 0 holds the first layers). Built-ins:
//   gpipe        1 stage/rank   all F then all BW
//   1f1b         1 stage/rank   p-1-r warm-up F, then F/BW alternating, then BW
//   interleaved  v stages/rank  (rank r holds r, r+p, ...) torch "flex" interleaved 1F1B rule
//   zb-h1        1 stage/rank   1F1B with B split into B (input grad) and W, W of rank r deferred by r B-steps
//   dualpipev    2 stages/rank  (r and 2p-1-r), DeepSeek's DualPipeV step table with F&B overlap slots
//   (1f1b and interleaved with ep_overlap: one more warm-up forward; steady F and BW pairs are may-overlap slots)
//   af-pipe      v stages/rank  attention (A) and FFN (F) ranks alternate along the model (stage j on an A rank
//                               when j is even), interleaved order with F&B overlap slots in the steady state;
//                               with attn_groups != pp/2 (unequal groups) stage 2l on A rank l mod a, 2l+1 on
//                               F rank a + l mod (pp-a), each rank's row a projection of one 1F1B-like chain order
// See docs/schedules.md for the rules and their sources.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "piper/base/status.h"
#include "piper/ir/directive.h"

namespace piper::schedules {

struct ScheduleParams {
  int pp = 1;            // pipeline ranks
  int microbatches = 1;  // per step
  int vpp = 1;           // stages per rank for interleaved and af-pipe (dualpipev always uses 2)
  // 1f1b and interleaved only (Strategy::ep_overlap, Megatron's --overlap-moe-expert-parallel-comm): one more
  // warm-up forward, so that the forward and backward of every steady-state step belong to different
  // microbatches, and each such pair is one may-overlap slot. Megatron schedules.py get_pp_rank_microbatches adds
  // the extra warm-up forward "to ensure the forward and backward computations are independent in all 1f1b steps".
  bool ep_overlap = false;
  // af-pipe only: attention pipeline ranks (0: pp / 2, equal groups) and, with unequal groups, the model's
  // stages (2 * num_layers, alternating attention and FFN) when pp * vpp is not that count.
  int attn_groups = 0;
  int stages = 0;
};

using ScheduleFn = std::function<Result<std::vector<ir::Directive>>(const ScheduleParams&)>;

struct ScheduleInfo {
  std::string name;
  std::string help;
  // Stages per rank for the given params (the graph is cut into pp * stages_per_rank stages).
  std::function<int(const ScheduleParams&)> stages_per_rank;
  ScheduleFn generate;
};

// Built-ins plus anything registered; names sorted.
std::vector<std::string> schedule_names();
Result<ScheduleInfo> find_schedule(const std::string& name);
// Adds (or replaces) a user schedule. Not thread-safe: call at start-up.
void register_schedule(ScheduleInfo info);

// Validates params for the named schedule and generates its directives.
Result<std::vector<ir::Directive>> schedule_directives(const std::string& name, const ScheduleParams& params);
Result<int> schedule_num_stages(const std::string& name, const ScheduleParams& params);

// Helper for generators: collects stage placement and per-rank slots and emits place + order directives.
class ScheduleBuilder {
 public:
  explicit ScheduleBuilder(int pp);
  void place(int stage, int rank);
  // Appends a one-action slot to `rank`'s row.
  void add(int rank, int stage, ir::Pass pass, int mb);
  // Appends a "may overlap" slot.
  void add_overlap(int rank, std::vector<ir::TagFilter> filters);
  std::vector<ir::Directive> finish() const;

 private:
  int pp_;
  std::vector<std::pair<int, int>> placement_;  // (stage, rank)
  std::vector<std::vector<std::vector<ir::TagFilter>>> rows_;
};

// The 1F1B skeleton that 1f1b and zb-h1 share, for pipeline rank `rank` holding stage `rank`: min(p-1-rank, m)
// warm-up forwards, then one forward and one backward step alternating until all m forwards are issued, then
// the remaining backward steps. `backward_step(k)` appends the backward step of microbatch k (k = 0, 1, ...,
// m-1, in order) to the rank's row: a fused BW for 1f1b, a B plus any due W for zb-h1.
void add_one_f_one_b_row(ScheduleBuilder& b, const ScheduleParams& p, int rank,
                         const std::function<void(int)>& backward_step);

// Contiguous, balanced partition of `num_layers` layers into `num_stages` stages (earlier stages take the
// remainder; stage_layers() in strategy.h): `place` directives {layer range} -> stage. Errors when
// num_layers < num_stages.
Result<std::vector<ir::Directive>> partition_directives(int num_layers, int num_stages);

// The built-in generators (one file each).
Result<std::vector<ir::Directive>> gpipe_schedule(const ScheduleParams& p);
Result<std::vector<ir::Directive>> one_f_one_b_schedule(const ScheduleParams& p);
Result<std::vector<ir::Directive>> interleaved_schedule(const ScheduleParams& p);
Result<std::vector<ir::Directive>> zb_h1_schedule(const ScheduleParams& p);
Result<std::vector<ir::Directive>> dualpipev_schedule(const ScheduleParams& p);
Result<std::vector<ir::Directive>> af_pipe_schedule(const ScheduleParams& p);

}  // namespace piper::schedules
