#include "piper/sim/simulate.h"

#include <chrono>

#include "piper/base/strings.h"
#include "piper/compile/strategy_directives.h"
#include "piper/cost/copy_cost.h"
#include "piper/cost/estimate.h"
#include "piper/cost/nic_split.h"
#include "piper/sim/task_time.h"

namespace piper::sim {

namespace {

// Step time, tokens/s, MFU, bubble and exposed-communication fractions and peak memory from rep.sim.
void summarise(SimReport& rep, const cost::CostModel& cm, const ClusterSpec& cluster, const TrainSpec& train,
               const Strategy& strategy, bool with_plan_hash) {
  rep.world_size = rep.compiled.plan.world_size;
  if (with_plan_hash) rep.plan_hash = compile::plan_hash(rep.compiled.plan);
  rep.step_time_s = rep.sim.step_time_s;
  const int64_t batch = train.global_batch > 0 ? train.global_batch : strategy.global_batch();
  rep.tokens_per_step = static_cast<double>(batch) * static_cast<double>(train.seq_len);
  if (rep.step_time_s > 0) {
    rep.tokens_per_s = rep.tokens_per_step / rep.step_time_s;
    rep.mfu =
        cm.flops_per_token() * rep.tokens_per_s / (static_cast<double>(rep.world_size) * cm.device().peak_flops());
    double bubble = 0, exposed = 0;
    for (const RankStats& r : rep.sim.ranks) {
      bubble += r.bubble_s;
      exposed += r.exposed_comm_s;
    }
    const double denom = static_cast<double>(rep.sim.ranks.size()) * rep.step_time_s;
    rep.bubble_fraction = bubble / denom;
    rep.exposed_comm_fraction = exposed / denom;
  }
  for (const RankStats& r : rep.sim.ranks)
    rep.peak_memory_max_bytes = std::max(rep.peak_memory_max_bytes, r.peak_bytes);
  rep.device_memory_bytes = static_cast<double>(cluster.device.memory_bytes);
}

}  // namespace

CorePool core_pool_of(const ClusterSpec& cluster, const SimOptions& options, const cost::Calibration& calibration) {
  CorePool pool;
  if (!(cluster.node.shared_cores > 0) || !options.full) return pool;
  // A machine's hosts (NodeSpec::nodes_per_machine) pool their cores.
  pool.cores = cluster.node.shared_cores * cluster.node.nodes_per_machine;
  pool.rank_cores = cluster.node.device_cores;
  // The cost model prices every task at the static share with every rank computing, the measured sharing included
  // (cost::rate_share): with all of the node busy the pool runs a task at exactly its price.
  pool.price_cores = cluster.node.device_cores * cost::rate_share(cluster.node, calibration);
  pool.ranks_per_node = cluster.node.devices_per_node * cluster.node.nodes_per_machine;
  pool.sharing = calibration.core_sharing;
  return pool;
}

SyncCost sync_cost_of(const ClusterSpec& cluster, const cost::Calibration& calibration) {
  if (!(cluster.node.shared_cores > 0)) return {};
  const NodeSpec& n = cluster.node;
  SyncCost c{n.sync_excess_all_to_all_s, n.sync_excess_other_s, n.sync_excess_pair_s, n.busy_cpu_all_to_all_s,
             n.busy_cpu_other_s,         n.busy_cpu_pair_s,     n.busy_cpu_p2p_s};
  c.cpu_per_byte_s = cost::copy_seconds_per_byte(n, cost::CopyKind::kSummed);
  c.gather_cpu_per_byte_s = cost::copy_seconds_per_byte(n, cost::CopyKind::kGathered);
  c.exchange_cpu_per_byte_s = cost::copy_seconds_per_byte(n, cost::CopyKind::kExchanged);
  c.staging_s_per_byte = cost::staging_seconds_per_byte(n, cluster.device, calibration);
  c.node_figures = n.node_figures;
  c.node_all_to_all_s = n.sync_excess_node_all_to_all_s;
  c.node_other_s = n.sync_excess_node_other_s;
  c.cpu_node_all_to_all_s = n.busy_cpu_node_all_to_all_s;
  c.cpu_node_other_s = n.busy_cpu_node_other_s;
  c.ranks_per_node = n.devices_per_node;
  c.exchange_lag = n.exchange_lag;
  c.a2a_wait_cpu_share = n.a2a_wait_cpu_share;
  return c;
}

HaloSimModel halo_sim_model(const ModelSpec& model, const TrainSpec& train) {
  HaloSimModel h;
  if (!model.is_moe()) return h;
  h.routing = cost::HaloRouting{model.moe.num_experts, model.moe.top_k, std::max(1, model.moe.num_groups),
                                std::max(1, model.moe.topk_groups)};
  h.dispatch_token_bytes = static_cast<double>(model.hidden_size) * train.dispatch_bytes();
  h.token_bytes = static_cast<double>(model.hidden_size) * train.comm_bytes();
  return h;
}

Result<SimReport> simulate_compiled(compile::CompileResult compiled, const ModelSpec& model,
                                    const ClusterSpec& cluster, const TrainSpec& train_in, const Strategy& strategy,
                                    const cost::Calibration& calibration, const SimOptions& options) {
  TrainSpec train = train_in;
  train.micro_batch_size = strategy.mbs;
  PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(model, cluster, train, calibration));
  PIPER_ASSIGN_OR_RETURN(TaskTimeFn task_time, cost_task_time(cm, strategy, calibration));
  PIPER_ASSIGN_OR_RETURN(cost::NicSplit nics, cost::nic_split(strategy, cluster));
  PIPER_ASSIGN_OR_RETURN(Network net, Network::build(cluster, nics.nic_scale));
  SimReport rep;
  rep.compiled = std::move(compiled);
  SimOptions run = options;
  if (run.halo.routing.top_k < 1) run.halo = halo_sim_model(model, train);
  run.core_pool = core_pool_of(cluster, options, calibration);
  if (run.expert_loads.on() && !run.expert_loads.expert_time) {
    PIPER_ASSIGN_OR_RETURN(run.expert_loads.expert_time, cost_expert_time(cm, strategy, calibration));
  }
  run.sync_cost = sync_cost_of(cluster, calibration);
  auto t0 = std::chrono::steady_clock::now();
  PIPER_ASSIGN_OR_RETURN(rep.sim, simulate_plan(rep.compiled.plan, net, task_time, run));
  rep.simulate_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  summarise(rep, cm, cluster, train, strategy, options.plan_hash);
  return rep;
}

namespace {

// The compile options every simulation shares, for a plan priced as `pricing` on `cm`'s cluster: the
// interleaved-overlap, recompute-collective and 2021 Megatron pipeline choices (p2p_blocking, p2p_scatter_gather,
// dp_reduce_after_backward) the simulator executes, and this cluster's cost annotations.
// What applies to a compiled strategy only (overlap_param_gather, the capacity check) the caller adds.
Result<compile::CompileOptions> sim_compile_options(const cost::CostModel& cm, const Strategy& pricing,
                                                    const cost::Calibration& calibration, const SimOptions& options) {
  compile::CompileOptions copts;
  copts.interleave_overlap = options.interleave_overlap;
  copts.recompute_reruns_tp_collectives = calibration.recompute_reruns_tp_collectives;
  copts.p2p_blocking = calibration.p2p_blocking;
  copts.p2p_scatter_gather = calibration.p2p_scatter_gather;
  copts.dp_reduce_after_backward = calibration.dp_reduce_after_backward;
  copts.data_edges = options.data_edges;
  copts.expert_load = calibration.memory_load();  // the experts' buffers of the rank holding the most
  copts.materialised_scores = calibration.attention_score_bytes > 0;
  PIPER_ASSIGN_OR_RETURN(copts.cost, cost_annotations(cm, pricing, calibration));
  return copts;
}

}  // namespace

Result<compile::CompileResult> compile_for_simulation(const ModelSpec& model, const ClusterSpec& cluster,
                                                      const TrainSpec& train_in, const Strategy& strategy,
                                                      const cost::Calibration& calibration, const SimOptions& options,
                                                      int64_t capacity_bytes) {
  TrainSpec train = train_in;
  train.micro_batch_size = strategy.mbs;
  PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(model, cluster, train, calibration));
  PIPER_RETURN_IF_ERROR(strategy.validate_for(model, train, cluster.world_size()));
  PIPER_ASSIGN_OR_RETURN(compile::CompileOptions copts, sim_compile_options(cm, strategy, calibration, options));
  copts.target.overlap_param_gather = options.overlap_param_gather;
  copts.capacity_bytes = capacity_bytes;
  return compile::compile_strategy(model, train, strategy, copts);
}

Status check_simulated_order(const Strategy& strategy) {
  // The compiler lays global ranks out tp innermost, then ep inside dp, then pp (compile/lower.cc, Plan::rank_of),
  // and the simulator's groups and representative ranks follow that layout.
  if (strategy.order_without_unit_axes(strategy.order) != strategy.order_without_unit_axes(Strategy{}.order)) {
    return invalid_argument("simulate: order=" + join(strategy.order, "-") +
                            " is priced by the closed form only (piper estimate): the compiler lays ranks out "
                            "tp-ep-dp-pp and the simulator executes that layout; drop order= to simulate it");
  }
  return ok_status();
}

Result<SimReport> simulate(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train_in,
                           const Strategy& strategy, const cost::Calibration& calibration, const SimOptions& options) {
  PIPER_RETURN_IF_ERROR(check_simulated_order(strategy));
  TrainSpec train = train_in;
  train.micro_batch_size = strategy.mbs;
  PIPER_RETURN_IF_ERROR(cost::CostModel::create(model, cluster, train, calibration).status());
  PIPER_RETURN_IF_ERROR(strategy.validate_for(model, train, cluster.world_size()));
  auto t0 = std::chrono::steady_clock::now();
  auto compiled = compile_for_simulation(model, cluster, train, strategy, calibration, options, 0);
  if (!compiled.ok()) return compiled.status().with_context("simulate");
  auto t1 = std::chrono::steady_clock::now();
  if (t1 >= options.deadline) {
    return deadline_exceeded("not simulated: budget: the wall-clock deadline passed while compiling (" +
                             std::to_string(std::chrono::duration<double>(t1 - t0).count()) +
                             " s); give it more time (plan --sim-budget-s)");
  }
  PIPER_ASSIGN_OR_RETURN(SimReport rep, simulate_compiled(std::move(compiled).value(), model, cluster, train,
                                                          strategy, calibration, options));
  rep.compile_wall_s = std::chrono::duration<double>(t1 - t0).count();
  return rep;
}

Result<SimReport> simulate_directives(const ModelSpec& model, const ClusterSpec& cluster, const TrainSpec& train_in,
                                      const ir::MeshInfo& mesh, const std::vector<ir::Directive>& directives,
                                      const Strategy& pricing, const cost::Calibration& calibration,
                                      const SimOptions& options) {
  TrainSpec train = train_in;
  train.micro_batch_size = pricing.mbs;
  PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(model, cluster, train, calibration));
  PIPER_RETURN_IF_ERROR(pricing.validate_for(model, train, cluster.world_size()));
  PIPER_ASSIGN_OR_RETURN(compile::CompileOptions copts, sim_compile_options(cm, pricing, calibration, options));
  auto t0 = std::chrono::steady_clock::now();
  auto compiled = compile::compile_directives(model, train, mesh, directives, copts);
  if (!compiled.ok()) return compiled.status().with_context("simulate");
  auto t1 = std::chrono::steady_clock::now();
  PIPER_ASSIGN_OR_RETURN(SimReport rep, simulate_compiled(std::move(compiled).value(), model, cluster, train,
                                                          pricing, calibration, options));
  rep.compile_wall_s = std::chrono::duration<double>(t1 - t0).count();
  return rep;
}

Json SimReport::to_json() const {
  Json j;
  j["step_time_s"] = step_time_s;
  j["tokens_per_step"] = tokens_per_step;
  j["tokens_per_s"] = tokens_per_s;
  j["mfu"] = mfu;
  j["bubble_fraction"] = bubble_fraction;
  j["exposed_comm_fraction"] = exposed_comm_fraction;
  if (!sim.load_step_times_s.empty()) j["load_step_times_s"] = sim.load_step_times_s;
  Json per_rank = Json::array();
  Json ranks = Json::array();
  for (const RankStats& r : sim.ranks) {
    per_rank.push_back(r.peak_bytes);
    Json exposed = Json::object();
    for (const auto& [group, sec] : r.exposed_by_group_s) exposed[group] = sec;
    ranks.push_back({{"rank", r.rank},
                     {"pp_rank", r.pp_rank},
                     {"finish_s", r.finish_s},
                     {"busy_s", r.busy_s},
                     {"exposed_comm_s", r.exposed_comm_s},
                     {"bubble_s", r.bubble_s},
                     {"comm_s", r.comm_s},
                     {"exposed_by_group_s", exposed},
                     {"static_bytes", r.static_bytes},
                     {"peak_bytes", r.peak_bytes}});
  }
  j["peak_memory_bytes"] = {{"per_rank", per_rank}, {"max", peak_memory_max_bytes}};
  j["device_memory_bytes"] = device_memory_bytes;
  j["fits"] = static_cast<double>(peak_memory_max_bytes) <= device_memory_bytes;
  j["world_size"] = world_size;
  j["simulated_ranks"] = sim.ranks.size();
  j["representative"] = sim.reduced;
  j["ranks"] = ranks;
  j["counters"] = {{"instructions", sim.instructions}, {"flows", sim.flows},
                   {"rate_updates", sim.rate_updates}, {"full_rate_updates", sim.full_rate_updates},
                   {"comm_templates", sim.comm_templates},
                   {"compile_wall_s", compile_wall_s}, {"simulate_wall_s", simulate_wall_s}};
  return j;
}

}  // namespace piper::sim
