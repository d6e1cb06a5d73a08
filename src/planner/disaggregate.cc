#include "piper/planner/disaggregate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace piper::planner {

AfAllocation make_allocation(const AfModel& model, const AfCandidate& c, int ports_attn) {
  AfAllocation a;
  a.candidate = c;
  a.ports_attn = ports_attn;
  a.ports_ffn = model.total_ports() - ports_attn;
  a.objective = model.objective(c, ports_attn);
  a.step_time_s = model.step_time_s(c, ports_attn);
  a.bottleneck_s = model.bottleneck_s(c, ports_attn);
  a.net_attn_s = model.net_attn_s(c, ports_attn);
  a.net_ffn_s = model.net_ffn_s(c, ports_attn);
  a.mfu = model.mfu(a.step_time_s);
  return a;
}

Result<AfAllocation> enumerate_allocation(const AfModel& model, const std::vector<AfCandidate>& candidates) {
  const AfCandidate* best = nullptr;
  int best_ports = 0;
  double best_obj = 0;
  for (const auto& c : candidates) {
    for (int n = 1; n < model.total_ports(); ++n) {
      if (!model.ports_feasible(c, n)) continue;
      const double obj = model.objective(c, n);
      if (best == nullptr || obj < best_obj) {
        best = &c;
        best_ports = n;
        best_obj = obj;
      }
    }
  }
  if (best == nullptr) {
    return failed_precondition("plan --disaggregate: no GPU and port split is feasible (see the rejected counts)");
  }
  return make_allocation(model, *best, best_ports);
}

Result<AfAllocation> milp_allocation(const AfModel& model, const std::vector<AfCandidate>& candidates,
                                     const MilpSolver& solver, bool* proven_optimal) {
  if (candidates.empty()) return failed_precondition("plan --disaggregate: no feasible GPU split to choose from");
  using Sense = MilpProblem::Sense;
  MilpProblem p;
  const int K = static_cast<int>(candidates.size()), N = model.total_ports();
  const double bw = model.port_bw();
  double z_hi = 0;
  for (const auto& c : candidates) z_hi = std::max({z_hi, c.step_attn_s, c.step_ffn_s, c.step_bytes / bw});
  const int z = p.add_column("Z", 1.0, 0, 2 * z_hi + 1, false);
  std::vector<int> x(static_cast<size_t>(K)), y;
  for (int k = 0; k < K; ++k)
    x[static_cast<size_t>(k)] = p.add_binary("x" + std::to_string(k), candidates[static_cast<size_t>(k)].fill_s);
  std::vector<int> ports;
  for (int n = 1; n < N; ++n) {
    y.push_back(p.add_binary("y" + std::to_string(n), 0));
    ports.push_back(n);
  }
  const int busy = p.add_column("B", -model.busy_weight(), 0, 2 * z_hi + 1, false);
  auto with = [&](int first, double first_coef, const std::vector<int>& cols, auto coef_of) {
    std::vector<int> cs = {first};
    std::vector<double> vs = {first_coef};
    for (size_t i = 0; i < cols.size(); ++i) {
      cs.push_back(cols[i]);
      vs.push_back(coef_of(i));
    }
    return std::make_pair(cs, vs);
  };
  p.add_row("one_split", x, std::vector<double>(x.size(), 1.0), Sense::kEqual, 1);
  if (y.empty()) return failed_precondition("plan --disaggregate: the cluster has a single port; nothing to split");
  p.add_row("one_port_split", y, std::vector<double>(y.size(), 1.0), Sense::kEqual, 1);
  auto [ca, va] = with(z, 1.0, x, [&](size_t k) { return -candidates[k].step_attn_s; });
  p.add_row("z_attn_compute", ca, va, Sense::kGreaterEqual, 0);
  auto [cf, vf] = with(z, 1.0, x, [&](size_t k) { return -candidates[k].step_ffn_s; });
  p.add_row("z_ffn_compute", cf, vf, Sense::kGreaterEqual, 0);
  for (size_t i = 0; i < y.size(); ++i) {
    const int n = ports[i];
    for (int side = 0; side < 2; ++side) {
      const double side_ports = side == 0 ? n : N - n;
      double big_m = 0;
      for (const auto& c : candidates) big_m = std::max(big_m, c.step_bytes / (side_ports * bw));
      auto [cs, vs] = with(z, 1.0, x, [&](size_t k) { return -candidates[k].step_bytes / (side_ports * bw); });
      cs.push_back(y[i]);
      vs.push_back(-big_m);
      p.add_row((side == 0 ? "z_net_attn_" : "z_net_ffn_") + std::to_string(n), cs, vs, Sense::kGreaterEqual, -big_m);
    }
  }
  {
    std::vector<int> cs = y;
    std::vector<double> vs;
    for (int n : ports) vs.push_back(n);
    for (int k = 0; k < K; ++k) {
      cs.push_back(x[static_cast<size_t>(k)]);
      vs.push_back(-candidates[static_cast<size_t>(k)].max_ports_attn);
    }
    p.add_row("ports_attn_on_own_nodes", cs, vs, Sense::kLessEqual, 0);
    vs.clear();
    for (int n : ports) vs.push_back(N - n);
    for (int k = 0; k < K; ++k) vs.push_back(-candidates[static_cast<size_t>(k)].max_ports_ffn);
    p.add_row("ports_ffn_on_own_nodes", cs, vs, Sense::kLessEqual, 0);
  }
  auto [ba, bva] = with(busy, 1.0, x, [&](size_t k) { return -candidates[k].step_attn_s; });
  p.add_row("busy_attn", ba, bva, Sense::kLessEqual, 0);
  auto [bf, bvf] = with(busy, 1.0, x, [&](size_t k) { return -candidates[k].step_ffn_s; });
  p.add_row("busy_ffn", bf, bvf, Sense::kLessEqual, 0);

  PIPER_ASSIGN_OR_RETURN(MilpSolution s, solver.solve(p));
  int chosen_k = -1, chosen_n = -1;
  for (int k = 0; k < K; ++k) {
    if (s.values[static_cast<size_t>(x[static_cast<size_t>(k)])] > 0.5) chosen_k = k;
  }
  for (size_t i = 0; i < y.size(); ++i) {
    if (s.values[static_cast<size_t>(y[i])] > 0.5) chosen_n = ports[i];
  }
  if (chosen_k < 0 || chosen_n < 0) return internal_error("milp: the solution selects no split");
  if (proven_optimal) *proven_optimal = s.proven_optimal;
  const AfCandidate& c = candidates[static_cast<size_t>(chosen_k)];
  if (!model.ports_feasible(c, chosen_n)) return internal_error("milp: the chosen port split breaks a constraint");
  return make_allocation(model, c, chosen_n);
}

Result<DisaggregateResult> disaggregate(const AfModel& model, const MilpSolver* solver) {
  const auto start = std::chrono::steady_clock::now();
  DisaggregateResult r;
  std::vector<AfCandidate> cands = model.candidates(&r.rejected);
  r.gpu_splits = static_cast<int64_t>(cands.size());
  r.port_splits = model.total_ports() - 1;
  if (cands.empty()) {
    std::string why;
    for (const auto& [rule, n] : r.rejected) {
      if (n > 0) why += " " + rule + "=" + std::to_string(n);
    }
    return failed_precondition("plan --disaggregate: no GPU split is feasible (rejected:" + why +
                               "); add nodes, raise --global-batch, or lower --seq");
  }
  if (solver != nullptr) {
    PIPER_ASSIGN_OR_RETURN(r.best, milp_allocation(model, cands, *solver, &r.proven_optimal));
    r.method = solver->name();
  } else {
    PIPER_ASSIGN_OR_RETURN(r.best, enumerate_allocation(model, cands));
    r.method = "enumeration";
    r.proven_optimal = true;
  }
  r.solve_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<AfCandidate> even;
  for (const auto& c : cands) {
    if (c.attn == c.ffn) even.push_back(c);
  }
  auto e = enumerate_allocation(model, even);
  if (!even.empty() && e.ok()) {
    r.even = *e;
    r.has_even = true;
  }
  r.attn_intensity = model.attn_intensity();
  r.ffn_intensity = model.ffn_intensity();
  r.attn_balance = model.balance(r.best.candidate.attn, r.best.ports_attn);
  r.ffn_balance = model.balance(r.best.candidate.ffn, r.best.ports_ffn);
  r.attn_turning_seq = model.attn_turning_seq(r.attn_balance);
  return r;
}

Strategy AfAllocation::strategy() const {
  Strategy s = candidate.strategy();
  s.attn_ports = ports_attn;
  s.ffn_ports = ports_ffn;
  return s;
}

Json AfAllocation::to_json() const {
  const AfCandidate& c = candidate;
  return Json{{"strategy", strategy().to_string()},
              {"attn_gpus", c.attn},
              {"ffn_gpus", c.ffn},
              {"attn_ports", ports_attn},
              {"ffn_ports", ports_ffn},
              {"pp", c.pp},
              {"ep", c.ep},
              {"dp_attn", c.dp_a},
              {"microbatches", c.microbatches},
              {"recompute", to_string(c.recompute)},
              {"step_time_s", step_time_s},
              {"mfu", mfu},
              {"objective", objective},
              {"per_step",
               {{"attn_compute_s", c.step_attn_s},
                {"ffn_compute_s", c.step_ffn_s},
                {"attn_network_s", net_attn_s},
                {"ffn_network_s", net_ffn_s},
                {"fill_s", c.fill_s}}},
              {"memory", {{"attn_bytes", c.mem_attn_bytes}, {"ffn_bytes", c.mem_ffn_bytes}}}};
}

Json DisaggregateResult::to_json() const {
  Json rej = Json::object();
  for (const auto& [rule, n] : rejected) rej[rule] = n;
  Json j = {{"method", method},
            {"proven_optimal", proven_optimal},
            {"gpu_splits", gpu_splits},
            {"port_splits", port_splits},
            {"rejected_by_rule", rej},
            {"solve_time_s", solve_time_s},
            {"best", best.to_json()},
            {"attn_to_ffn_gpu_ratio", static_cast<double>(best.candidate.attn) / best.candidate.ffn},
            {"roofline",
             {{"attn_intensity_flops_per_byte", attn_intensity},
              {"ffn_intensity_flops_per_byte", ffn_intensity},
              {"attn_balance_flops_per_byte", attn_balance},
              {"ffn_balance_flops_per_byte", ffn_balance},
              {"attn_bound", attn_intensity < attn_balance ? "network" : "compute"},
              {"ffn_bound", ffn_intensity < ffn_balance ? "network" : "compute"},
              {"attn_turning_seq", attn_turning_seq}}}};
  if (has_even) j["even_split"] = even.to_json();
  return j;
}

}  // namespace piper::planner
