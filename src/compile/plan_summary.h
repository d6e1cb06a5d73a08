// plan_summary: per-template statistics of a verified Plan, for `piper compile` and quick inspection.
//
// For each program template (one per pipeline rank): how many global ranks run it, the instruction count per
// stream, counts by kind (compute, send, recv, collective, update, alloc/free, record/wait), the FLOPs and
// bytes sent that its cost annotations add up to, the resident model state (Program::static_bytes) and the
// peak live bytes that verify_plan's abstract execution saw (an estimate: the real peak depends on timing).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "piper/base/json.h"
#include "piper/compile/plan.h"
#include "piper/compile/verify_plan.h"

namespace piper::compile {

struct TemplateSummary {
  int pp_rank = 0;
  int num_ranks = 0;                                                // global ranks that run this template
  std::vector<std::pair<std::string, size_t>> stream_instructions;  // (stream, instructions), in stream order
  size_t compute = 0, send = 0, recv = 0, collective = 0, update = 0, alloc = 0, free = 0, record = 0, wait = 0;
  int64_t flops = 0;
  int64_t comm_bytes = 0;
  int64_t static_bytes = 0;
  int64_t peak_bytes = 0;
};

// `stats` must come from verify_plan(plan) (its peak_bytes has one entry per template).
std::vector<TemplateSummary> summarize_plan(const Plan& plan, const PlanStats& stats);
Json summary_to_json(const std::vector<TemplateSummary>& summary);
// A fixed-width table, one row per template.
std::string format_summary(const std::vector<TemplateSummary>& summary);

}  // namespace piper::compile
