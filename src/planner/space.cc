#include "piper/planner/space.h"

#include <algorithm>

#include "piper/base/strings.h"

namespace piper::planner {
namespace {

std::vector<int> divisors(int n, int at_most) {
  std::vector<int> out;
  for (int d = 1; d <= n && d <= at_most; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

Status check_positive(const std::vector<int>& values, const char* name) {
  if (values.empty())
    return invalid_argument(std::string("plan: the ") + name + " list is empty; give at least one value");
  for (int v : values) {
    if (v < 1) return invalid_argument(std::string("plan: ") + name + "=" + std::to_string(v) + " must be >= 1");
  }
  return ok_status();
}

}  // namespace

const char* to_string(Rule rule) {
  static const char* kNames[kNumRules] = {"tp_divides_heads",
                                          "ep_divides_dp",
                                          "sp_needs_tp",
                                          "moe_tp_needs_sp",
                                          "stages_exceed_layers",
                                          "batch_divisibility",
                                          "microbatches_lt_pp",
                                          "dualpipev_microbatches",
                                          "interleaved_microbatches",
                                          "duplicate_a2a",
                                          "duplicate_order",
                                          "ep_outside_domain",
                                          "memory",
                                          "invalid"};
  return kNames[static_cast<int>(rule)];
}

int64_t ResolvedSpace::inner_block() const {
  return static_cast<int64_t>(sp.size()) * space.mbs.size() * schedules.size() * space.zero.size() *
         space.recompute.size() * space.a2a.size() * space.orders.size();
}

int64_t ResolvedSpace::total() const {
  int64_t n = 0;
  for (const auto& item : items) n += item_size(item);
  return n;
}

Result<ResolvedSpace> resolve_space(const SearchSpace& space, const ModelSpec& model, const ClusterSpec& cluster,
                                    int64_t global_batch) {
  if (global_batch < 1) {
    return invalid_argument("plan: global batch " + std::to_string(global_batch) + " must be >= 1 sequence");
  }
  PIPER_RETURN_IF_ERROR(check_positive(space.mbs, "mbs"));
  PIPER_RETURN_IF_ERROR(check_positive(space.vpp, "vpp"));
  if (space.schedules.empty()) return invalid_argument("plan: the schedule list is empty");
  if (space.zero.empty() || space.recompute.empty() || space.a2a.empty() || space.orders.empty()) {
    return invalid_argument("plan: the zero, recompute, a2a and order lists must each hold at least one value");
  }
  for (int z : space.zero) {
    if (z < 0 || z > 3) return invalid_argument("plan: zero=" + std::to_string(z) + " must be one of {0,1,2,3}");
  }
  for (const auto& a : space.a2a) {
    if (a != "flat" && a != "halo") return invalid_argument("plan: a2a=" + a + " is not one of {flat, halo}");
  }
  for (const auto& order : space.orders) {
    Strategy probe;
    probe.order = order;
    Status st = probe.validate();
    if (!st.ok()) return st;
  }
  ResolvedSpace r;
  r.space = space;
  r.world = cluster.world_size();
  r.global_batch = global_batch;
  for (const auto& name : space.schedules) {
    PIPER_ASSIGN_OR_RETURN(ScheduleKind kind, parse_schedule(name));
    if (kind == ScheduleKind::kAFPipe) {
      return invalid_argument(
          "plan: schedule af-pipe is searched by the disaggregated mode (--disaggregate), not here");
    }
    if (kind == ScheduleKind::kInterleaved) {
      for (int v : space.vpp) {
        if (v >= 2) r.schedules.push_back({name, v});
      }
    } else {
      r.schedules.push_back({name, 1});
    }
  }
  if (r.schedules.empty()) return invalid_argument("plan: interleaved needs a vpp >= 2 in the vpp list");
  const int max_tp = space.max_tp > 0 ? space.max_tp : cluster.node.devices_per_node;
  const std::vector<int> eps =
      model.is_moe() ? divisors(model.moe.num_experts, space.max_ep > 0 ? space.max_ep : model.moe.num_experts)
                     : std::vector<int>{1};
  for (int tp : divisors(r.world, max_tp)) {
    for (int pp : divisors(r.world / tp, model.num_layers)) {
      for (int ep : eps) r.items.push_back({tp, pp, ep});
    }
  }
  return r;
}

}  // namespace piper::planner
