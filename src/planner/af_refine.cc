#include "piper/planner/af_refine.h"

#include <algorithm>
#include <numeric>

#include "piper/planner/rescore.h"

namespace piper::planner {

Result<Strategy> compilable_af_strategy(const AfAllocation& a, const ModelSpec& model, const TrainSpec& train) {
  (void)model;
  const AfCandidate& c = a.candidate;
  Strategy s = a.strategy();  // with the MILP's NIC split, priced by the simulator (cost/nic_split.h)
  if (c.ffn % c.dp_a != 0) {
    return invalid_argument("ffn=" + std::to_string(c.ffn) + " GPUs are not a multiple of dp_attn=" +
                            std::to_string(c.dp_a) + ": the compiler runs every pipeline rank on dp*tp ranks");
  }
  s.ep = std::gcd(c.ep, c.dp_a);
  const int64_t per_mb = static_cast<int64_t>(s.dp) * s.microbatches;
  if (per_mb < 1 || train.global_batch % per_mb != 0) {
    return invalid_argument("global batch " + std::to_string(train.global_batch) + " is not a multiple of dp*" +
                            "microbatches = " + std::to_string(per_mb));
  }
  s.mbs = static_cast<int>(train.global_batch / per_mb);
  return s;
}

AfScored score_allocation(const std::string& name, const AfAllocation& a, const ModelSpec& model,
                          const ClusterSpec& cluster, const TrainSpec& train, const SearchOptions& options) {
  AfScored x;
  x.name = name;
  x.alloc = a;
  Result<Strategy> s = compilable_af_strategy(a, model, train);
  if (!s.ok()) {
    x.strategy = a.strategy();
    x.why = s.status().message();
    return x;
  }
  x.strategy = *s;
  TrainSpec t = train;
  t.micro_batch_size = x.strategy.mbs;
  Result<double> step = simulate_step_time(model, cluster, t, x.strategy, options);
  if (step.ok()) {
    x.sim_step_s = *step;
  } else {
    x.why = step.status().message();
  }
  return x;
}

namespace {

bool same_split(const AfAllocation& a, const AfAllocation& b) {
  const AfCandidate &x = a.candidate, &y = b.candidate;
  return x.attn == y.attn && x.pp == y.pp && x.recompute == y.recompute && x.microbatches == y.microbatches &&
         a.ports_attn == b.ports_attn;
}

// The port split the roofline prefers for GPU split `c`; -1 when none is feasible.
int best_ports(const AfModel& model_af, const AfCandidate& c) {
  int ports = -1;
  double best_obj = -1;
  for (int p = 1; p < model_af.total_ports(); ++p) {
    if (!model_af.ports_feasible(c, p)) continue;
    const double obj = model_af.objective(c, p);
    if (best_obj < 0 || obj < best_obj) {
      best_obj = obj;
      ports = p;
    }
  }
  return ports;
}

// The GPU-split neighbours of `c` among `cands` (see the header): next attention share down and up at the same pp
// and recomputation, the other recomputation, pp halved and doubled at the same attention share.
std::vector<AfCandidate> neighbour_splits(const AfCandidate& c, const std::vector<AfCandidate>& cands) {
  std::vector<AfCandidate> out;
  const AfCandidate* down = nullptr;
  const AfCandidate* up = nullptr;
  for (const AfCandidate& o : cands) {
    if (o.pp != c.pp || o.recompute != c.recompute) continue;
    if (o.attn < c.attn && (down == nullptr || o.attn > down->attn)) down = &o;
    if (o.attn > c.attn && (up == nullptr || o.attn < up->attn)) up = &o;
  }
  for (const AfCandidate* o : {down, up}) {
    if (o != nullptr) out.push_back(*o);
  }
  for (const AfCandidate& o : cands) {
    const bool other_rc = o.attn == c.attn && o.pp == c.pp && o.recompute != c.recompute;
    const bool other_pp = o.attn == c.attn && o.recompute == c.recompute && (o.pp == 2 * c.pp || 2 * o.pp == c.pp);
    if (other_rc || other_pp) out.push_back(o);
  }
  return out;
}

// Every neighbour of `a`: its GPU-split neighbours, each at the port split the roofline prefers for it, and the
// same GPU split with one node's NICs moved from one group to the other (each way, when feasible).
std::vector<AfAllocation> neighbours(const AfModel& model_af, const AfAllocation& a,
                                     const std::vector<AfCandidate>& cands) {
  std::vector<AfAllocation> out;
  for (const AfCandidate& n : neighbour_splits(a.candidate, cands)) {
    const int ports = best_ports(model_af, n);
    if (ports > 0) out.push_back(make_allocation(model_af, n, ports));
  }
  if (model_af.total_ports() > model_af.ports_per_node()) {  // one node: the split is the GPUs' own links
    const int natural = model_af.natural_ports_attn(a.candidate);
    for (int p : {a.ports_attn - model_af.ports_per_node(), a.ports_attn + model_af.ports_per_node(), natural}) {
      if (p != a.ports_attn && model_af.ports_feasible(a.candidate, p)) {
        out.push_back(make_allocation(model_af, a.candidate, p));
      }
    }
  }
  return out;
}

}  // namespace

AfLocalSearch af_local_search(const AfModel& model_af, const AfScored& start, const ModelSpec& model,
                              const ClusterSpec& cluster, const TrainSpec& train, const SearchOptions& options,
                              int max_simulations) {
  AfLocalSearch r;
  r.best = start;
  r.simulations = start.simulated() ? 1 : 0;
  const std::vector<AfCandidate> cands = model_af.candidates(nullptr);
  std::vector<AfAllocation> seen = {start.alloc};
  bool moved = start.simulated();
  while (moved && r.simulations < max_simulations) {
    moved = false;
    AfScored step_best = r.best;
    for (const AfAllocation& n : neighbours(model_af, r.best.alloc, cands)) {
      if (r.simulations >= max_simulations) break;
      if (std::any_of(seen.begin(), seen.end(), [&](const AfAllocation& s) { return same_split(s, n); })) continue;
      seen.push_back(n);
      AfScored x = score_allocation("local-search", n, model, cluster, train, options);
      if (x.simulated()) ++r.simulations;
      r.tried.push_back(x);
      if (x.simulated() && x.sim_step_s < step_best.sim_step_s) step_best = x;
    }
    if (step_best.sim_step_s < r.best.sim_step_s) {
      r.best = step_best;
      ++r.moves;
      moved = true;
    }
  }
  return r;
}

}  // namespace piper::planner
