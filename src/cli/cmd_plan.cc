// piper plan: search the strategy space for the fastest plans that fit (src/planner/search.h).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/base/units.h"
#include "piper/cli/calibration_file.h"
#include "piper/cli/command.h"
#include "piper/cli/command_json.h"
#include "piper/cli/directive_input.h"
#include "piper/cli/flags.h"
#include "piper/cli/local_plan.h"
#include "piper/cli/plan_outcome.h"
#include "piper/cli/plan_report.h"
#include "piper/cli/plan_validate.h"
#include "piper/cli/precision_flags.h"
#include "piper/cli/train_report.h"
#include "piper/cost/estimate.h"
#include "piper/cost/task_profile.h"
#include "piper/planner/af_refine.h"
#include "piper/planner/disaggregate.h"
#include "piper/planner/domain.h"
#include "piper/planner/rescore.h"
#include "piper/planner/search.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/comm_calibration.h"
#include "piper/spec/model_loader.h"

namespace piper::cli {
namespace {

struct PlanOptions {
  std::string model;
  std::string cluster;
  int nodes = 1;
  int64_t global_batch = 0;
  int64_t seq_len = 0;  // 0: not given (min(4096, the model's max_seq_len))
  int top_k = kPlanTopK;
  int threads = 0;  // 0: not given (all cores)
  double memory_fraction = 0.95;
  std::string schedules;
  std::string calibration;
  std::string comm_calibration;
  std::string expert_loads;  // --expert-loads FILE (balance/expert_loads.h): measured loads for every candidate's ep
  bool json = false;
  bool disaggregate = false;
  int af_local_search = 12;  // simulations the local search around the best allocation may spend
  bool no_verify = false;
  bool no_memory_screen = false;
  bool no_verify_cache = false;
  bool no_closed_form_memo = false;
  bool compile_data_edges = false;
  bool no_rescore_bound = false;
  int verify_attempts = 3;
  int simulate_top = -1;  // -1: not given (as many as --top)
  int local_search = kPlanLocalSearchSteps;
  double sim_budget_s = kPlanSimBudgetS;
  std::string solver = "cbc";
  std::string af_placement = "spread";
  int local_ranks = 0;  // 0: not given; > 0: plan for this many ranks on this machine (train_report.h local_cluster)
  bool runnable = false;
  std::string candidate, candidate_mesh;  // --candidate FILE --mesh M: a user's directive file, ranked too
  std::string report;                     // --report FILE.html|FILE.svg (plan_report.h)
  PrecisionOptions precision;
  int domain_nodes = 0;  // 0: not given (the whole scale-up domain)
  int validate = 0;      // --validate K (plan_validate.h); 0: off
  int validate_steps = 5;
};

// The user's plan (--candidate), simulated on the same cluster and ranked among the searched plans by simulated
// step time.
struct Candidate {
  bool given = false;
  DirectiveInput input;
  double step_time_s = 0;
  int rank = 0;  // 1-based position among the searched plans' simulated step times
  Json to_json() const {
    return Json{{"file", input.file},
                {"recognised", input.resolved.recognised},
                {"priced_as", input.resolved.strategy.to_string()},
                {"simulated_step_time_s", step_time_s},
                {"rank", rank}};
  }
};

Status score_candidate(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train,
                       const cost::Calibration& calibration, const planner::SearchResult& r, Candidate* c) {
  sim::SimOptions so;
  so.full = cluster.node.shared_cores > 0;  // as the search's re-scoring (planner/rescore.cc)
  PIPER_ASSIGN_OR_RETURN(sim::SimReport rep,
                         sim::simulate_directives(model, cluster, train, c->input.mesh, c->input.directives,
                                                  c->input.resolved.strategy, calibration, so));
  c->step_time_s = rep.step_time_s;
  c->rank = 1;
  for (const auto& p : r.top) c->rank += p.simulated && p.sim_step_time_s < c->step_time_s ? 1 : 0;
  return ok_status();
}

void print_plans(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train, bool verify,
                 const planner::SearchResult& r, const Candidate& c) {
  const auto& st = r.stats;
  std::printf("model     %s, seq %lld, global batch %lld sequences\n", model.name.c_str(),
              static_cast<long long>(train.seq_len), static_cast<long long>(train.global_batch));
  std::printf("cluster   %s: %d nodes x %d = %d devices (%s each)\n", cluster.name.c_str(), cluster.num_nodes,
              cluster.node.devices_per_node, cluster.world_size(),
              format_bytes(static_cast<double>(cluster.device.memory_bytes)).c_str());
  std::printf("precision %s\n", describe_precision(train).c_str());
  if (cluster.has_multi_node_domain()) {
    std::printf("domain    %d ranks per scale-up domain (%d nodes), %d domains\n", cluster.devices_per_domain(),
                cluster.scale_up.domain_nodes(), cluster.num_domains());
  }
  std::printf(
      "search    %lld strategies considered, %lld rejected, %lld scored (closed form), %lld fit; %s on %d "
      "threads; simulated: %lld\n",
      static_cast<long long>(st.considered), static_cast<long long>(st.rejected_total()),
      static_cast<long long>(st.scored), static_cast<long long>(st.fitting), format_seconds(st.search_time_s).c_str(),
      st.threads, static_cast<long long>(st.simulated - st.simulate_stopped));
  if (st.verified + st.verify_failed > 0) {
    const std::string screened =
        st.verify_screened > 0 ? " (" + std::to_string(st.verify_screened) + " by the memory screen)" : "";
    const std::string cached = st.verify_cached > 0 ? ", " + std::to_string(st.verify_cached) +
                                                          " verdicts shared with an equivalent plan (no compile)"
                                                    : "";
    std::printf("verify    %lld compiled and verified, %lld rejected by the compiler%s%s, %s\n",
                static_cast<long long>(st.verified), static_cast<long long>(st.verify_failed), screened.c_str(),
                cached.c_str(), format_seconds(st.verify_time_s).c_str());
    if (!st.first_verify_failure.empty())
      std::printf("          first rejection: %s\n", st.first_verify_failure.c_str());
  } else {
    std::printf("verify    %s\n", verify ? "nothing to compile (no plan fits)" : "off (--no-verify)");
  }
  if (st.simulated > 0) {
    std::printf(
        "simulate  %lld simulated (%lld failed, %lld stopped by the budget), local search %lld tried / %lld "
        "improved / %lld ruled out by the bound (simulated/closed form >= %.3f), %s%s\n",
        static_cast<long long>(st.simulated - st.simulate_stopped), static_cast<long long>(st.simulate_failed),
        static_cast<long long>(st.simulate_stopped), static_cast<long long>(st.local_search_tried),
        static_cast<long long>(st.local_search_improved), static_cast<long long>(st.local_search_ruled_out),
        st.sim_ratio_min, format_seconds(st.simulate_time_s).c_str(),
        st.simulate_budget_hit ? " (stopped by --sim-budget-s)" : "");
  }
  std::printf("rejected by rule:\n");
  for (int k = 0; k < planner::kNumRules; ++k) {
    if (st.rejected[k] > 0) {
      std::printf("  %-26s %lld\n", planner::to_string(static_cast<planner::Rule>(k)),
                  static_cast<long long>(st.rejected[k]));
    }
  }
  std::printf("\n %-3s %11s %11s %7s %12s %11s %12s %9s  %s\n", "#", "simulated", "step time", "MFU", "tokens/s",
              "peak mem", "compiled pk", "ep group", "strategy");
  int simulated_rows = 0;
  auto print_candidate = [&] {
    std::printf(" %-3s %11s %11s %7s %12s %11s %12s %9s  %s  (--candidate, %s)\n", "C",
                format_seconds(c.step_time_s).c_str(), "-", "-", "-", "-", "-", "-", c.input.file.c_str(),
                describe(c.input).c_str());
  };
  for (size_t i = 0; i < r.top.size(); ++i) {
    const auto& p = r.top[i];
    if (c.given && p.simulated && ++simulated_rows == c.rank) print_candidate();
    const char* ep_place = p.strategy.ep <= 1                            ? "-"
                           : planner::ep_inside_domain(p.strategy, cluster) ? "in domain"
                                                                         : "spans";
    std::printf(" %-3zu %11s %11s %6.1f%% %12s %11s %12s %9s  %s%s\n", i + 1,
                p.simulated ? format_seconds(p.sim_step_time_s).c_str() : "-",
                format_seconds(p.estimate.step_time_s).c_str(), 100 * p.estimate.mfu,
                format_count(p.estimate.tokens_per_s).c_str(), format_bytes(p.peak_memory_bytes()).c_str(),
                p.verified ? format_bytes(p.verification.compiled_peak_bytes).c_str() : "-", ep_place,
                p.strategy.to_string().c_str(), p.origin == "search" ? "" : "  (local search)");
  }
  if (c.given && simulated_rows < c.rank) print_candidate();
  std::printf("(simulated: step time by the simulator; step time, MFU, tokens/s: closed form)\n");
  if (c.given) {
    std::printf("candidate %s: simulated step %s, rank %d among the %d simulated plans\n", c.input.file.c_str(),
                format_seconds(c.step_time_s).c_str(), c.rank, simulated_rows + 1);
  }
  if (!r.top.empty()) {
    std::printf("\nmemory per pipeline rank of #1:");
    const auto& ranks = r.top[0].estimate.ranks;
    for (size_t k = 0; k < ranks.size(); ++k) std::printf(" %s", format_bytes(ranks[k].total()).c_str());
    std::printf("\n");
  }
}

void print_allocation(const char* label, const planner::AfAllocation& a) {
  const auto& c = a.candidate;
  std::printf(
      "%s attention %d GPUs / %d ports, FFN %d GPUs / %d ports (A:F = %.2f), pp %d, ep %d, dp_attn %d, "
      "recompute %s, %d microbatches\n",
      label, c.attn, a.ports_attn, c.ffn, a.ports_ffn, static_cast<double>(c.attn) / c.ffn, c.pp, c.ep, c.dp_a,
      to_string(c.recompute), c.microbatches);
  std::printf(
      "    step %s, MFU %.1f %%; per step: attention compute %s, FFN compute %s, network A %s, network F %s, "
      "fill %s\n",
      format_seconds(a.step_time_s).c_str(), 100 * a.mfu, format_seconds(c.step_attn_s).c_str(),
      format_seconds(c.step_ffn_s).c_str(), format_seconds(a.net_attn_s).c_str(), format_seconds(a.net_ffn_s).c_str(),
      format_seconds(c.fill_s).c_str());
  std::printf("    memory per GPU: attention %s, FFN %s\n", format_bytes(c.mem_attn_bytes).c_str(),
              format_bytes(c.mem_ffn_bytes).c_str());
  std::printf("    strategy %s\n", a.strategy().to_string().c_str());
}

// The af-pipe closed form (`piper estimate`, cost/estimate_af.cc) of each re-scored plan; 0 where it has none.
std::vector<double> af_closed_forms(const std::vector<planner::AfScored>& plans, const ModelSpec& model,
                                    const ClusterSpec& cluster, const TrainSpec& train,
                                    const cost::Calibration& calibration) {
  std::vector<double> out(plans.size(), 0.0);
  auto cm = cost::CostModel::create(model, cluster, train, calibration);
  for (size_t i = 0; cm.ok() && i < plans.size(); ++i) {
    auto e = cm->estimate(plans[i].strategy);
    if (e.ok()) out[i] = e->step_time_s;
  }
  return out;
}

// What `plan --disaggregate` found: the MILP's allocation and the enumeration that checks it, the allocations
// re-scored by the simulator (with their closed forms, `closed[i]` for `rescored[i]`) and the local search.
struct AfOutcome {
  planner::DisaggregateResult r;
  planner::AfAllocation oracle;
  bool agrees = false;
  std::vector<planner::AfScored> rescored;
  std::vector<double> closed;
  planner::AfLocalSearch walk;
};

Result<AfOutcome> af_outcome(const PlanOptions& o, const planner::AfModel& af, const ModelSpec& model,
                             const ClusterSpec& cluster, const TrainSpec& train, const cost::Calibration& calibration) {
  std::unique_ptr<planner::MilpSolver> solver;
  if (o.solver == "cbc") {
    PIPER_ASSIGN_OR_RETURN(solver, planner::make_cbc_solver());
  } else if (o.solver != "enumeration") {
    return invalid_argument("--solver=" + o.solver + " is not one of {cbc, enumeration}");
  }
  AfOutcome out;
  PIPER_ASSIGN_OR_RETURN(out.r, planner::disaggregate(af, solver.get()));
  const planner::DisaggregateResult& r = out.r;
  // The exhaustive oracle over the same candidates, as a check on the MILP.
  auto cands = af.candidates(nullptr);
  PIPER_ASSIGN_OR_RETURN(out.oracle, planner::enumerate_allocation(af, cands));
  out.agrees = std::abs(out.oracle.objective - r.best.objective) <= 1e-9 * std::abs(out.oracle.objective);
  // Re-scoring with the simulator (planner/af_refine.h): the best allocation, the best even one, and a local
  // search around the best.
  planner::SearchOptions so;
  so.calibration = calibration;
  std::vector<planner::AfScored>& rescored = out.rescored;
  rescored = {planner::score_allocation("best", r.best, model, cluster, train, so)};
  if (r.has_even &&
      !(r.even.candidate.attn == r.best.candidate.attn && r.even.candidate.pp == r.best.candidate.pp &&
        r.even.candidate.ep == r.best.candidate.ep && r.even.candidate.microbatches == r.best.candidate.microbatches)) {
    rescored.push_back(planner::score_allocation("even", r.even, model, cluster, train, so));
  }
  if (r.best.candidate.attn == r.best.candidate.ffn) {
    // The roofline's best uneven allocation too, so that an uneven plan is simulated beside an even best.
    std::vector<planner::AfCandidate> uneven;
    for (const auto& c : cands) {
      if (c.attn != c.ffn) uneven.push_back(c);
    }
    auto u = planner::enumerate_allocation(af, uneven);
    if (!uneven.empty() && u.ok()) {
      rescored.push_back(planner::score_allocation("uneven", *u, model, cluster, train, so));
    }
  }
  out.walk = planner::af_local_search(af, rescored.front(), model, cluster, train, so, o.af_local_search);
  if (rescored.front().simulated()) {
    planner::AfScored found = out.walk.best;
    found.name = "local";
    rescored.push_back(found);
  }
  out.closed = af_closed_forms(rescored, model, cluster, train, calibration);
  return out;
}

void print_af_json(const AfOutcome& a, const planner::AfModel& af, const PlanOptions& o, const ModelSpec& model,
                   const ClusterSpec& cluster, const TrainSpec& train, const std::string& calibration_source) {
  const planner::DisaggregateResult& r = a.r;
  const std::vector<planner::AfScored>& rescored = a.rescored;
  const std::vector<double>& closed = a.closed;
  const planner::AfLocalSearch& walk = a.walk;
  const planner::AfAllocation& oracle = a.oracle;
  Json j = r.to_json();
  j["model"] = model.name;
  j["cluster"] = cluster.name;
  j["nodes"] = cluster.num_nodes;
  j["world_size"] = cluster.world_size();
  j["seq_len"] = train.seq_len;
  j["global_batch"] = train.global_batch;
  j["calibration"] = calibration_source;
  j["ports"] = {{"count", af.total_ports()},
                {"bw_bytes_per_s", af.port_bw()},
                {"nics", af.ports_are_nics()},
                {"placement", o.af_placement}};
  j["enumeration"] = oracle.to_json();
  j["enumeration_agrees"] = a.agrees;
  Json sims = Json::array();
  for (size_t i = 0; i < rescored.size(); ++i) {
    const planner::AfScored& x = rescored[i];
    Json e{{"allocation", x.name},
           {"strategy", x.strategy.to_string()},
           {"uneven", x.alloc.candidate.attn != x.alloc.candidate.ffn},
           {"attn_gpus", x.alloc.candidate.attn},
           {"ffn_gpus", x.alloc.candidate.ffn},
           {"attn_ports", x.alloc.ports_attn},
           {"ffn_ports", x.alloc.ports_ffn},
           {"roofline_step_time_s", x.alloc.step_time_s},
           {"closed_form_step_time_s", closed[i]}};
    if (x.why.empty()) {
      e["simulated_step_time_s"] = x.sim_step_s;
    } else {
      e["not_simulated"] = x.why;
    }
    sims.push_back(e);
  }
  j["simulated"] = sims;
  Json tried = Json::array();
  for (const planner::AfScored& x : walk.tried) {
    Json e{{"strategy", x.strategy.to_string()},
           {"attn_gpus", x.alloc.candidate.attn},
           {"ffn_gpus", x.alloc.candidate.ffn},
           {"attn_ports", x.alloc.ports_attn},
           {"ffn_ports", x.alloc.ports_ffn},
           {"pp", x.alloc.candidate.pp}};
    if (x.simulated()) {
      e["simulated_step_time_s"] = x.sim_step_s;
    } else {
      e["not_simulated"] = x.why;
    }
    tried.push_back(e);
  }
  j["local_search"] = {{"simulations", walk.simulations}, {"moves", walk.moves}, {"tried", tried}};
  print_json(j.dump(2));
}

void print_af_text(const AfOutcome& a, const planner::AfModel& af, const ModelSpec& model, const ClusterSpec& cluster,
                   const TrainSpec& train, const std::string& calibration_source) {
  const planner::DisaggregateResult& r = a.r;
  const std::vector<planner::AfScored>& rescored = a.rescored;
  const std::vector<double>& closed = a.closed;
  const planner::AfLocalSearch& walk = a.walk;
  std::printf(
      "disaggregated attention/FFN (af-pipe): %s on %s, %d nodes = %d GPUs, %d %s of %s; seq %lld, global "
      "batch %lld\n",
      model.name.c_str(), cluster.name.c_str(), cluster.num_nodes, cluster.world_size(), af.total_ports(),
      af.ports_are_nics() ? "NIC ports" : "device-link ports", format_si(af.port_bw(), "B/s").c_str(),
      static_cast<long long>(train.seq_len), static_cast<long long>(train.global_batch));
  std::printf("calibration %s\n", calibration_source.c_str());
  std::printf("search   %lld feasible GPU splits x %lld port splits; rejected:", static_cast<long long>(r.gpu_splits),
              static_cast<long long>(r.port_splits));
  for (const auto& [rule, n] : r.rejected) {
    if (n > 0) std::printf(" %s %lld", rule.c_str(), static_cast<long long>(n));
  }
  std::printf("\nsolver   %s%s in %s; exhaustive enumeration %s (objective %.6g vs %.6g)\n", r.method.c_str(),
              r.proven_optimal ? " (proven optimal)" : " (NOT proven optimal)", format_seconds(r.solve_time_s).c_str(),
              a.agrees ? "agrees" : "DISAGREES", r.best.objective, a.oracle.objective);
  print_allocation("best    ", r.best);
  if (r.has_even) print_allocation("even    ", r.even);
  std::printf(
      "roofline attention %.0f FLOP/B vs its balance %.0f -> %s-bound (compute-bound from seq ~%.0f); FFN %.0f "
      "FLOP/B vs %.0f -> %s-bound\n",
      r.attn_intensity, r.attn_balance, r.attn_intensity < r.attn_balance ? "network" : "compute", r.attn_turning_seq,
      r.ffn_intensity, r.ffn_balance, r.ffn_intensity < r.ffn_balance ? "network" : "compute");
  for (size_t i = 0; i < rescored.size(); ++i) {
    const planner::AfScored& x = rescored[i];
    const auto& c = x.alloc.candidate;
    if (x.simulated()) {
      std::printf("simulate %-6s %s A:F %d:%d GPUs, %d:%d ports: %s (roofline %s, x%.2f; closed form %s)  %s\n",
                  x.name.c_str(), c.attn == c.ffn ? "even  " : "uneven", c.attn, c.ffn, x.alloc.ports_attn,
                  x.alloc.ports_ffn, format_seconds(x.sim_step_s).c_str(),
                  format_seconds(x.alloc.step_time_s).c_str(),
                  x.alloc.step_time_s > 0 ? x.sim_step_s / x.alloc.step_time_s : 0.0,
                  closed[i] > 0 ? format_seconds(closed[i]).c_str() : "-", x.strategy.to_string().c_str());
    } else {
      std::printf("simulate %-6s %s A:F %d:%d GPUs not simulated: %s\n", x.name.c_str(),
                  c.attn == c.ffn ? "even  " : "uneven", c.attn, c.ffn, x.why.c_str());
    }
  }
  for (const planner::AfScored& x : walk.tried) {
    const auto& c = x.alloc.candidate;
    std::printf("  tried  A:F %d:%d GPUs, %d:%d ports, pp %d, recompute %s: %s\n", c.attn, c.ffn, x.alloc.ports_attn,
                x.alloc.ports_ffn, c.pp, to_string(c.recompute),
                x.simulated() ? format_seconds(x.sim_step_s).c_str() : ("not simulated: " + x.why).c_str());
  }
  if (rescored.front().simulated()) {
    std::printf(
        "local    search around the best: %d simulations, %d improving moves (neighbouring GPU splits, "
        "recomputation, pp, one node's NICs moved either way)\n",
        walk.simulations, walk.moves);
  }
}

Status run_disaggregate(const PlanOptions& o, const ModelSpec& model, const ClusterSpec& cluster,
                        const TrainSpec& train, const cost::Calibration& calibration,
                        const std::string& calibration_source) {
  planner::AfOptions options;
  options.memory_fraction = o.memory_fraction;
  PIPER_ASSIGN_OR_RETURN(options.placement, planner::parse_af_placement(o.af_placement));
  PIPER_ASSIGN_OR_RETURN(planner::AfModel af, planner::AfModel::create(model, cluster, train, options));
  PIPER_ASSIGN_OR_RETURN(AfOutcome a, af_outcome(o, af, model, cluster, train, calibration));
  if (o.json) {
    print_af_json(a, af, o, model, cluster, train, calibration_source);
  } else {
    print_af_text(a, af, model, cluster, train, calibration_source);
  }
  if (!a.agrees) return internal_error("plan --disaggregate: the MILP and the enumeration disagree; please report");
  return ok_status();
}

using EpLoads = std::map<int, planner::SearchOptions::ExpertLoad>;

std::string expert_loads_summary(const std::string& file, const EpLoads& by_ep) {
  std::string line = "experts     " + file + ": busiest ep rank over the mean (measured; at its peak), by ep:";
  char buf[64];
  for (const auto& [ep, load] : by_ep) {
    if (ep == 1) continue;
    std::snprintf(buf, sizeof(buf), " %d: %.3f (%.3f)", ep, load.time, load.memory);
    line += buf;
  }
  return line;
}

Json expert_loads_json(const std::string& file, const EpLoads& by_ep) {
  Json busiest = Json::object();
  Json peak = Json::object();
  for (const auto& [ep, load] : by_ep) {
    busiest[std::to_string(ep)] = load.time;
    peak[std::to_string(ep)] = load.memory;
  }
  return Json{{"file", file}, {"busiest_by_ep", busiest}, {"memory_load_by_ep", peak}};
}

Status run_plan(const PlanOptions& o) {
  PIPER_ASSIGN_OR_RETURN(ModelSpec model, load_model(o.model));
  PIPER_ASSIGN_OR_RETURN(const int64_t seq_len, resolve_seq_len(model, o.seq_len));
  ClusterSpec cluster;
  TrainSpec train;
  cost::Calibration calibration;
  std::string calibration_source, links_source;
  if (o.local_ranks > 0) {
    // This machine as `piper train --ranks R` sees it (CPU ranks sharing the cores, fp32 training).
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    PIPER_ASSIGN_OR_RETURN(LocalMachine m, local_cluster(o.local_ranks, std::max(1, cores / o.local_ranks),
                                                         o.calibration, o.comm_calibration));
    cluster = m.cluster;
    calibration = m.calibration;
    cost::apply_model_sharing(&calibration, model, seq_len);
    links_source = m.links_source;
    train = local_train_spec(o.global_batch, seq_len);
    calibration_source = with_task_profile(m.calibration_source, calibration, model, seq_len);
  } else {
    PIPER_ASSIGN_OR_RETURN(cluster, load_cluster(o.cluster, o.nodes));
    PIPER_RETURN_IF_ERROR(apply_domain_nodes(o.domain_nodes, &cluster));
    PIPER_ASSIGN_OR_RETURN(links_source, apply_link_calibration(o.comm_calibration, &cluster));
    train.global_batch = o.global_batch;
    train.seq_len = seq_len;
    PIPER_RETURN_IF_ERROR(apply_precision_options(o.precision, &train));
    PIPER_ASSIGN_OR_RETURN(DeviceCalibration device, load_device_calibration(o.calibration, cluster.name));
    calibration = device.calibration;
    calibration_source = device.source;
  }
  if (o.disaggregate) {
    return run_disaggregate(o, model, cluster, train, calibration, calibration_source);
  }
  planner::SearchOptions options;
  options.top_k = o.top_k;
  options.memory_fraction = o.memory_fraction;
  options.verify = !o.no_verify;
  options.memory_screen = !o.no_memory_screen;
  options.verify_cache = !o.no_verify_cache;
  options.memoise_closed_form = !o.no_closed_form_memo;
  options.data_edges = o.compile_data_edges;
  options.verify_attempts_per_plan = o.verify_attempts;
  options.threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  options.simulate_top = o.simulate_top < 0 ? o.top_k : o.simulate_top;
  options.local_search_steps = o.local_search;
  options.simulate_budget_s = o.sim_budget_s;
  options.rescore_bound = !o.no_rescore_bound;
  // Progress on stderr (stdout keeps the table or the JSON object) once the command has run for a second.
  const auto started = std::chrono::steady_clock::now();
  options.progress = [started](const std::string& line) {
    if (std::chrono::steady_clock::now() - started >= std::chrono::seconds(1)) {
      std::fprintf(stderr, "plan: %s\n", line.c_str());
    }
  };
  if (!o.schedules.empty()) options.space.schedules = split(o.schedules, ',');
  options.calibration = calibration;
  std::string loads_line;
  if (!o.expert_loads.empty()) {
    PIPER_ASSIGN_OR_RETURN(options.expert_load_by_ep, expert_load_by_ep(o.expert_loads, model));
    loads_line = expert_loads_summary(o.expert_loads, options.expert_load_by_ep);
  }
  if (o.runnable || o.validate > 0) {  // --validate trains the plans
    restrict_to_runtime(model, options.memory_fraction * static_cast<double>(cluster.device.memory_bytes), &options);
  }
  Candidate candidate;
  if (!o.candidate.empty() || !o.candidate_mesh.empty()) {
    if (o.candidate.empty()) return invalid_argument("--mesh is for --candidate FILE; add --candidate or drop --mesh");
    candidate.given = true;
    PIPER_ASSIGN_OR_RETURN(candidate.input, load_directive_input(model, "", o.candidate, o.candidate_mesh,
                                                                 train.global_batch, cluster.world_size()));
  }
  // --validate K draws K plans from the rest of the ranked list: keep a longer list than the top printed.
  if (o.validate > 0) options.top_k = std::max(options.top_k, kValidateRankedPlans);
  if (o.validate > 0 && o.simulate_top < 0) options.simulate_top = options.top_k;
  PIPER_ASSIGN_OR_RETURN(planner::SearchResult r, planner::search(model, cluster, train, options));
  ValidationReport validation;
  if (o.validate > 0) {
    ValidateOptions v{o.validate,    o.validate_steps, o.local_ranks,      o.model,       train.global_batch,
                      train.seq_len, o.calibration,    o.comm_calibration, o.expert_loads};
    PIPER_ASSIGN_OR_RETURN(validation, validate_plans(r.top, v));
    if (static_cast<int>(r.top.size()) > o.top_k) r.top.resize(static_cast<size_t>(o.top_k));
  }
  if (candidate.given) {
    Status st = score_candidate(model, cluster, train, options.calibration_for(candidate.input.resolved.strategy.ep), r,
                                &candidate);
    if (!st.ok()) return st.with_context("--candidate " + o.candidate);
  }
  if (!o.report.empty()) {
    PIPER_RETURN_IF_ERROR(write_plan_report(o.report, plan_json(model, cluster, train, r), options.memory_fraction));
  }
  if (o.json) {
    Json j = plan_json(model, cluster, train, r);
    if (candidate.given) j["candidate"] = candidate.to_json();
    if (o.validate > 0) j["validation"] = validation.to_json();
    j["calibration"] = calibration_source;
    j["links"] = links_source;
    if (!o.expert_loads.empty()) j["expert_loads"] = expert_loads_json(o.expert_loads, options.expert_load_by_ep);
    print_json(j.dump(2));
  } else {
    print_plans(model, cluster, train, options.verify, r, candidate);
    std::printf("calibration %s\nlinks       %s\n", calibration_source.c_str(), links_source.c_str());
    if (!loads_line.empty()) std::printf("%s\n", loads_line.c_str());
    if (o.validate > 0) print_validation(validation, o.validate_steps, o.local_ranks);
  }
  if (r.top.empty()) return nothing_fits(cluster, options.memory_fraction, r);
  return ok_status();
}

PIPER_REGISTER_COMMAND(g_plan, "plan", "Search parallel strategies for the fastest plans that fit", [](CLI::App* sub) {
  auto o = std::make_shared<PlanOptions>();
  sub->add_option("--model", o->model, "model preset or config file")->required();
  sub->add_option("--cluster", o->cluster, "cluster preset or file (required unless --local-ranks)");
  add_int_option(sub, "--nodes", &o->nodes, {1, kMaxNodes, "nodes of the cluster"}, "number of nodes (with --cluster)")
      ->capture_default_str();
  add_int_option(sub, "--local-ranks", &o->local_ranks,
                 {1, kMaxLocalRanks, "MPI ranks on this machine, as piper train --ranks"},
                 "plan for R ranks on this machine (local-cpu, cores shared; what `piper train --ranks R` runs on)");
  sub->add_flag("--runnable", o->runnable,
                "only strategies the runtime executes today (src/runtime/support.h; `piper train` can run them)");
  add_int_option(sub, "--global-batch", &o->global_batch, {1, kMaxGlobalBatch, "sequences per step"},
                 "sequences per optimizer step")
      ->required();
  add_int_option(sub, "--seq", &o->seq_len, {1, kMaxSeqLen, "tokens per sequence"},
                 "sequence length (default: min(4096, the model's max_seq_len))");
  add_int_option(sub, "--top", &o->top_k, {1, 1000, "plans kept"}, "how many plans to print")->capture_default_str();
  add_int_option(sub, "--threads", &o->threads, {1, kMaxThreads, "search threads"},
                 "search threads (default: all cores)");
  sub->add_option("--schedules", o->schedules, "comma-separated schedules to search (default: all but af-pipe)");
  add_real_option(sub, "--memory-fraction", &o->memory_fraction, {0, 1, true, "share of device memory"},
                  "fraction of device memory a plan may use")
      ->capture_default_str();
  sub->add_option("--calibration", o->calibration, "calibration JSON (src/cost/device_model.h)");
  sub->add_option("--comm-calibration", o->comm_calibration,
                  "measured link latency/bandwidth JSON from `piper bench comm --calibration-out` "
                  "(src/spec/comm_calibration.h)");
  sub->add_option("--expert-loads", o->expert_loads,
                  "measured expert loads (`piper train --record-expert-loads FILE`): each candidate's busiest ep rank "
                  "priced from them (time and memory) instead of the calibration's expert_load_imbalance");
  sub->add_flag("--no-verify", o->no_verify, "skip compiling the best plans with the plan verifier");
  sub->add_flag("--no-memory-screen", o->no_memory_screen,
                "compile every microbatch of a plan before rejecting it by memory (the former path; same verdicts)");
  sub->add_flag("--no-verify-cache", o->no_verify_cache,
                "compile every candidate, also those differing from a verified one only in mesh order, etp or a2a "
                "(the former path; same verdicts)");
  sub->add_flag("--no-closed-form-memo", o->no_closed_form_memo,
                "recompute the HALO all-to-all time for every candidate (the former path; same estimates)");
  sub->add_flag("--compile-data-edges", o->compile_data_edges,
                "compile the plans verified and simulated with their instructions' data edges, which neither reads "
                "(the former path; same verdicts and step times)");
  add_int_option(sub, "--verify-attempts", &o->verify_attempts, {1, 1000, "compilations per plan returned"},
                 "compile at most this many plans per plan returned")
      ->capture_default_str();
  add_int_option(sub, "--simulate-top", &o->simulate_top, {0, 1000, "plans re-scored by the simulator"},
                 "re-score this many of the best plans with the simulator (default: --top; 0: closed form only)");
  add_int_option(sub, "--local-search", &o->local_search, {0, 1000, "neighbours simulated"},
                 "simulate at most this many neighbours of the best simulated plan (0: no local search)")
      ->capture_default_str();
  add_real_option(sub, "--sim-budget-s", &o->sim_budget_s, {0, 86400, false, "seconds, at most a day"},
                  "re-scoring time limit: no simulation starts, and running ones stop, after this many seconds")
      ->capture_default_str();
  sub->add_flag("--no-rescore-bound", o->no_rescore_bound,
                "simulate every fitting local-search neighbour until --local-search or --sim-budget-s runs out, also "
                "those whose closed form times the smallest simulated/closed-form ratio cannot beat the best (the "
                "former path)");
  sub->add_flag("--disaggregate", o->disaggregate,
                "allocate GPUs and NICs to disaggregated attention and FFN groups (af-pipe; roofline + MILP)");
  sub->add_option("--af-placement", o->af_placement,
                  "disaggregation: spread (groups share nodes, NICs split freely) or node (whole nodes per group)")
      ->capture_default_str();
  add_int_option(sub, "--af-local-search", &o->af_local_search, {0, 64, "simulations"},
                 "disaggregation: simulations the local search around the best allocation may spend (0: none)")
      ->capture_default_str();
  sub->add_option("--solver", o->solver, "disaggregation solver: cbc (MILP) or enumeration")->capture_default_str();
  sub->add_option("--candidate", o->candidate, "also simulate this directive file and rank it with the searched plans");
  sub->add_option("--mesh", o->candidate_mesh, "with --candidate: pp=P[,vpp=V,dp=D,ep=E,tp=T]");
  add_int_option(sub, "--validate", &o->validate, {1, 20, "plans from the top, and as many from the rest"},
                 "with --local-ranks: train the best K plans and K others from the rest, and print predicted vs "
                 "measured step time and memory with the rank correlation (docs/planner.md)");
  add_int_option(sub, "--validate-steps", &o->validate_steps, {2, 1000, "training steps per validated plan"},
                 "--validate: steps each plan trains (the first is not timed)")
      ->capture_default_str();
  sub->add_option("--report", o->report,
                  "also write the plans as charts: FILE.html (table, step-time breakdown, memory per rank; inline "
                  "SVG, no other files) or FILE.svg");
  sub->add_flag("--json", o->json, "print one JSON object");
  add_domain_option(sub, &o->domain_nodes);
  add_precision_options(sub, &o->precision);
  return std::function<Status()>([o] {
    if (!o->report.empty()) {
      if (o->disaggregate) return invalid_argument("--report charts the strategy search's plans; drop --disaggregate");
      PIPER_RETURN_IF_ERROR(check_plan_report_path(o->report));
    }
    if (o->disaggregate && !o->candidate.empty()) {
      return invalid_argument("--candidate ranks a plan with the strategy search; drop --disaggregate");
    }
    if (o->local_ranks > 0 && (!o->precision.precision.empty() || o->domain_nodes > 0)) {
      return invalid_argument(
          "--local-ranks plans fp32 training on this machine's cores; drop --precision/--domain-nodes, or plan for a "
          "--cluster");
    }
    if (o->validate > 0 && (o->local_ranks == 0 || o->disaggregate || !o->candidate.empty())) {
      return invalid_argument("--validate trains plans on this machine: it needs --local-ranks R (and neither "
                              "--disaggregate nor --candidate)");
    }
    if (o->local_ranks > 0 && !o->cluster.empty()) {
      return invalid_argument("--local-ranks plans for this machine; drop --cluster/--nodes, or drop --local-ranks");
    }
    if (o->local_ranks == 0 && o->cluster.empty()) {
      return invalid_argument(
          "--cluster is required (a preset such as h800, or a file), or --local-ranks R for "
          "this machine");
    }
    if (o->disaggregate && o->runnable) {
      return invalid_argument(
          "--runnable with --disaggregate: the allocator sizes GPU clusters, not this machine's ranks; train an "
          "af-pipe plan on this machine with piper train --strategy dp=D,ep=E,pp=P,schedule=af-pipe,disagg=1,"
          "attn_ranks=D*P,ffn_ranks=D*F --ranks D*(P+F)");
    }
    return run_plan(*o);
  });
});

}  // namespace
}  // namespace piper::cli
