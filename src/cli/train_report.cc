#include "piper/cli/train_report.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "piper/base/hash.h"
#include "piper/base/strings.h"
#include "piper/base/units.h"
#include "piper/cli/calibration_file.h"
#include "piper/cost/estimate.h"
#include "piper/report/chrome_trace.h"
#include "piper/sim/simulate.h"
#include "piper/sim/task_time.h"
#include "piper/spec/cluster_loader.h"

namespace piper::cli {

namespace {

// This process's host name and machine (the kernel's boot id), hashed.
std::array<uint64_t, 2> host_and_machine() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  if (boot.empty()) boot = host;  // no boot id: every host its own machine
  return {fnv1a64(host, std::strlen(host)), fnv1a64(boot.data(), boot.size())};
}

}  // namespace

Result<HostLayout> host_layout(comm::Communicator* world) {
  if (world == nullptr || world->size() == 1) return HostLayout{};
  const std::array<uint64_t, 2> mine = host_and_machine();
  std::vector<std::array<uint64_t, 2>> all(static_cast<size_t>(world->size()));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, world->all_gather(mine.data(), all.data(), sizeof(mine)));
  PIPER_RETURN_IF_ERROR(world->wait(h, comm::default_timeout_s()));
  // A node is a run of consecutive ranks with the same host name and machine; every run as long as the first.
  std::vector<std::array<uint64_t, 2>> nodes;
  std::vector<uint64_t> machines;
  std::vector<int> run_lengths;
  for (size_t r = 0; r < all.size(); ++r) {
    if (r == 0 || all[r] != all[r - 1]) {
      if (std::find(nodes.begin(), nodes.end(), all[r]) != nodes.end()) {
        return failed_precondition("rank " + std::to_string(r) +
                                   " runs on the host of earlier ranks after ranks of "
                                   "another host: the predictions need the ranks node-major (mpirun --map-by "
                                   "ppr:K:node)");
      }
      nodes.push_back(all[r]);
      run_lengths.push_back(0);
    }
    ++run_lengths.back();
    if (std::find(machines.begin(), machines.end(), all[r][1]) == machines.end()) machines.push_back(all[r][1]);
  }
  for (size_t n = 1; n < run_lengths.size(); ++n) {
    if (run_lengths[n] != run_lengths[0]) {
      return failed_precondition("the " + std::to_string(world->size()) + " ranks are spread unevenly over " +
                                 std::to_string(nodes.size()) + " hosts (" + std::to_string(run_lengths[0]) +
                                 " on the first, " + std::to_string(run_lengths[n]) + " on host " + std::to_string(n) +
                                 "): the predictions need as many ranks on every host");
    }
  }
  if (nodes.size() % machines.size() != 0) {
    return failed_precondition(std::to_string(nodes.size()) + " hosts on " + std::to_string(machines.size()) +
                               " machines: the predictions need as many hosts on every machine");
  }
  return HostLayout{static_cast<int>(nodes.size()), static_cast<int>(machines.size())};
}

Result<LocalMachine> local_cluster(int ranks, int kernel_threads, const std::string& calibration,
                                   const std::string& comm_calibration, HostLayout hosts) {
  PIPER_ASSIGN_OR_RETURN(DeviceCalibration device, load_device_calibration(calibration, kThisMachineCluster));
  return local_cluster(ranks, kernel_threads, device, comm_calibration, hosts);
}

Result<LocalMachine> local_cluster(int ranks, int kernel_threads, const DeviceCalibration& device,
                                   const std::string& comm_calibration, HostLayout hosts) {
  if (ranks < 1) return invalid_argument("local cluster: ranks must be >= 1, got " + std::to_string(ranks));
  if (hosts.nodes < 1 || ranks % hosts.nodes != 0 || hosts.machines < 1 || hosts.machines > hosts.nodes) {
    return invalid_argument("local cluster: " + std::to_string(ranks) + " ranks on " + std::to_string(hosts.nodes) +
                            " hosts of " + std::to_string(hosts.machines) + " machines");
  }
  LocalMachine m;
  PIPER_ASSIGN_OR_RETURN(m.cluster, load_cluster("local-cpu", 1));
  // The preset is one machine (max_nodes 1); the MPI job's hosts, emulated or real, are copies of it.
  m.cluster.num_nodes = m.cluster.max_nodes = hosts.nodes;
  if (hosts.nodes > 1) m.cluster.fabric.topology = FabricTopology::kFatTree;  // hosts behind one switch
  m.cluster.node.devices_per_node = ranks / hosts.nodes;
  // Hosts of one machine (network namespaces) share its cores: each is priced with its part of them (host_layout
  // checked that every machine holds as many hosts).
  m.cores = static_cast<double>(std::max(1u, std::thread::hardware_concurrency())) * hosts.machines / hosts.nodes;
  // Across hosts the ranks talk over a NIC, whose rate only a link calibration across them can give.
  if (hosts.nodes > 1 && m.cluster.node.nics.empty()) m.cluster.node.nics.push_back(NicSpec{});
  m.rank_cores = std::min(static_cast<double>(std::max(1, kernel_threads)), m.cores);
  m.cluster.node.shared_cores = m.cores;
  m.cluster.node.nodes_per_machine = hosts.nodes / hosts.machines;
  m.cluster.node.device_cores = m.rank_cores;
  m.cores_per_rank = m.rank_cores * m.cluster.node.static_core_share();
  DeviceSpec& d = m.cluster.device;
  d.peak_flops_fp32 *= m.rank_cores;
  d.peak_flops_bf16 *= m.rank_cores;
  d.peak_flops_fp8 *= m.rank_cores;
  d.memory_bw_bytes_per_s *= m.rank_cores;
  std::vector<std::string> sources;
  Result<std::string> links = apply_link_calibration(comm_calibration, &m.cluster);
  if (hosts.nodes > 1 && !(m.cluster.node.nics[0].bw_bytes_per_s > 0)) {
    // No file, or one measured on one host (which then fails the cluster's check of its NIC): say what is missing.
    return failed_precondition(
        "the ranks run on " + std::to_string(hosts.nodes) +
        " hosts, and the predictions need the link between them, which the link calibration (" +
        (links.ok() ? *links : links.status().message()) + ") did not measure: run `piper calibrate --ranks " +
        std::to_string(ranks) +
        " --links-out FILE` launched the same way (e.g. scripts/two-node-emulation.sh -- calibrate ...) and set "
        "PIPER_COMM_CALIBRATION=FILE");
  }
  PIPER_RETURN_IF_ERROR(links.status());
  m.links_source = *links;
  sources.push_back("links: " + m.links_source);
  if (hosts.nodes > 1) {
    sources.push_back(std::to_string(hosts.nodes) + " hosts on " + std::to_string(hosts.machines) + " machine" +
                      (hosts.machines == 1 ? "" : "s"));
  }
  m.calibration = device.calibration;
  const bool measured_threads = scale_to_rank_cores(&m.calibration, m.rank_cores);
  sources.push_back((device.path.empty() ? "device: " + device.source : "device from " + device.source) +
                    (measured_threads ? " (measured at " + std::to_string(static_cast<int>(m.rank_cores)) +
                                            " thread" + (m.rank_cores == 1 ? "" : "s") + ")"
                                      : ""));
  m.calibration.workspace_bytes = 0;  // no CUDA context or cuBLAS/NCCL workspace on a CPU rank
  PIPER_RETURN_IF_ERROR(m.cluster.validate());
  m.calibration_source = join(sources, ", ");
  return m;
}

std::function<Result<compile::CostFn>(const Strategy&, const TrainSpec&)> local_plan_prices(const LocalMachine& machine,
                                                                                           const ModelSpec& model) {
  return [machine, model](const Strategy& strategy, const TrainSpec& train_in) -> Result<compile::CostFn> {
    TrainSpec train = train_in;
    train.micro_batch_size = strategy.mbs;
    PIPER_ASSIGN_OR_RETURN(cost::CostModel cm,
                           cost::CostModel::create(model, machine.cluster, train, machine.calibration));
    return sim::cost_annotations(cm, strategy, machine.calibration);
  };
}

namespace {

// The note and JSON of a prediction priced from measured expert loads; step_times: the simulation's per-step times
// (sim::SimResult::load_step_times_s; empty when it priced the run's mean loads).
void describe_loads(const PredictionLoads& l, int ep, const std::vector<double>& step_times, PredictionReport* r) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), " (busiest ep rank %.3f x the mean at ep=%d, %.3f at its peak)", l.loads.imbalance,
                ep, l.loads.memory_load);
  std::string how = "its own share";
  if (!step_times.empty()) {
    const auto [lo, hi] = std::minmax_element(step_times.begin(), step_times.end());
    how = "its own share in each step (the mean of " + std::to_string(step_times.size()) +
          " steps simulated one by one, " + format_seconds(*lo) + " .. " + format_seconds(*hi) + ")";
  }
  r->experts_note = "experts   loads: " + l.label + buf + ": sim prices each ep rank's experts (time, memory) from " +
                    how + "; model prices every rank as the busiest";
  r->experts_json = Json{{"source", l.label},
                         {"file", l.loads.file},
                         {"imbalance", l.loads.imbalance},
                         {"memory_load", l.loads.memory_load},
                         {"ep", ep},
                         {"simulated", step_times.empty() ? "per_rank" : "per_rank_per_step"},
                         {"simulated_step_times_s", step_times},
                         {"resource_model", "busiest"}};
}

// The closed form's estimate of the trainer's strategy into *e; false when it has none (a registered schedule, a
// directive file's own order, or a strategy estimate() answers Unimplemented for: the 'model' peak is then the
// compiled plan's, static bytes + the planned activations of the rank's program, and there is no modelled step time;
// *note says so). af-pipe has one (cost/estimate_af.cc), per pipeline rank of either side.
Result<bool> closed_form(const runtime::Trainer& trainer, const LocalMachine& machine, cost::Estimate* e,
                         std::string* note) {
  const bool custom = trainer.strategy().schedule_kind() == ScheduleKind::kCustom;
  const bool own_order = !trainer.options().directives.empty() && trainer.predicted_memory().total() <= 0;
  if (custom || own_order) {
    *note = std::string(custom ? "schedule=" + trainer.strategy().schedule : "the directive file's own schedule") +
            ": estimate() has no closed form; the 'model' peak is the compiled plan's, no modelled step";
    return false;
  }
  PIPER_ASSIGN_OR_RETURN(cost::CostModel cm, cost::CostModel::create(trainer.options().model, machine.cluster,
                                                                     trainer.train_spec(), machine.calibration));
  Result<cost::Estimate> got = cm.estimate(trainer.strategy());
  if (got.ok()) {
    *e = std::move(got).value();
    return true;
  }
  if (got.status().code() != StatusCode::kUnimplemented) return got.status();
  *note = got.status().message() + "; the 'model' peak is the compiled plan's, no modelled step";
  return false;
}

// One rank's measured figures beside the simulation's and the closed form's (or the compiled plan's peak).
RankComparison compare_rank(const runtime::Trainer& trainer, const sim::SimReport& sim, const cost::Estimate& e,
                            bool no_closed_form, int rank, const RankMeasurement& measured) {
  const compile::Plan& plan = trainer.compiled().plan;
  RankComparison c;
  c.rank = rank;
  c.pp_rank = plan.coords[static_cast<size_t>(rank)].pp;
  c.measured = measured;
  c.sim_step_s = sim.step_time_s;
  c.model_step_s = e.step_time_s;
  for (const sim::RankStats& s : sim.sim.ranks) {
    if (s.rank != rank) continue;
    c.sim_busy_s = s.busy_s;
    c.sim_peak_bytes = static_cast<double>(s.peak_bytes);
    for (double cpu : s.cpu_s_by_stream) c.sim_cpu_s += cpu;
  }
  if (no_closed_form) {
    const size_t tmpl = static_cast<size_t>(plan.rank_template[static_cast<size_t>(rank)]);
    if (tmpl < trainer.compiled().stats.peak_bytes.size()) {
      c.model_peak_bytes = static_cast<double>(trainer.compiled().stats.peak_bytes[tmpl]);
    }
  } else if (c.pp_rank < static_cast<int>(e.ranks.size())) {
    c.model_peak_bytes = e.ranks[static_cast<size_t>(c.pp_rank)].total();
  }
  return c;
}

}  // namespace

Result<PredictionReport> predict_vs_measured(const runtime::Trainer& trainer, const LocalMachine& machine_in,
                                             const std::vector<RankMeasurement>& measured,
                                             const PredictionLoads* loads, const std::string& sim_trace) {
  LocalMachine machine = machine_in;
  if (loads != nullptr) {
    machine.calibration.expert_load_imbalance = loads->loads.imbalance;
    machine.calibration.expert_memory_load = loads->loads.memory_load;
  }
  const compile::Plan& plan = trainer.compiled().plan;
  if (static_cast<int>(measured.size()) != plan.world_size) {
    return internal_error("predict_vs_measured: " + std::to_string(measured.size()) + " measurements for " +
                          std::to_string(plan.world_size) + " ranks");
  }
  const ModelSpec& model = trainer.options().model;
  const TrainSpec& train = trainer.train_spec();
  PredictionReport r;
  r.machine = machine;
  sim::SimOptions so;
  so.full = true;  // every rank: the runs here are small
  if (loads != nullptr) {
    if (loads->loads.ranks.ep != std::max(1, plan.mesh.ep)) {
      return invalid_argument("--expert-loads: loads priced for ep=" + std::to_string(loads->loads.ranks.ep) +
                              ", the plan has ep=" + std::to_string(plan.mesh.ep));
    }
    so.expert_loads.loads = loads->loads.ranks;
    so.expert_loads.plan_load = 1;  // the trainer compiled its plan for balanced experts (CompileOptions default)
    so.expert_loads.first_step = loads->first_step;
  }
  so.record_timeline = !sim_trace.empty();
  PIPER_ASSIGN_OR_RETURN(sim::SimReport sim, sim::simulate_compiled(trainer.compiled(), model, machine.cluster, train,
                                                                    trainer.strategy(), machine.calibration, so));
  if (loads != nullptr) describe_loads(*loads, plan.mesh.ep, sim.sim.load_step_times_s, &r);
  r.sim_plan_hash = sim.plan_hash;
  if (!sim_trace.empty()) {
    Status st = report::write_chrome_trace(sim_trace, plan, sim.sim, "piper train (simulated)");
    if (!st.ok()) return st.with_context("--sim-trace " + sim_trace);
  }
  cost::Estimate e;
  PIPER_ASSIGN_OR_RETURN(const bool has_closed_form, closed_form(trainer, machine, &e, &r.note));
  r.sim_step_s = sim.step_time_s;
  r.model_step_s = e.step_time_s;
  for (int rank = 0; rank < plan.world_size; ++rank) {
    r.ranks.push_back(compare_rank(trainer, sim, e, !has_closed_form, rank, measured[static_cast<size_t>(rank)]));
  }
  const auto& streams = plan.templates[static_cast<size_t>(plan.rank_template[0])].streams;
  for (const sim::RankStats& s : sim.sim.ranks) {
    if (s.rank != 0) continue;
    for (size_t k = 0; k < s.cpu_s_by_stream.size() && k < streams.size(); ++k) {
      r.sim_stream_cpu_s.emplace_back(streams[k].name, s.cpu_s_by_stream[k]);
    }
  }
  return r;
}

namespace {

std::string ratio(double measured, double predicted) {
  if (predicted <= 0) return "    -";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%5.2fx", measured / predicted);
  return buf;
}

}  // namespace

void PredictionReport::print() const {
  const int n = machine.cluster.node.devices_per_node, nodes = machine.cluster.num_nodes;
  const std::string per_node = nodes > 1 ? " on each of " + std::to_string(nodes) + " hosts" : "";
  std::printf(
      "\n%s: local-cpu, %d rank%s sharing %g core%s%s (%g each computing alone; model: %.2f each, "
      "all busy), %s\n",
      title.c_str(), n, n == 1 ? "" : "s", machine.cores, machine.cores == 1 ? "" : "s", per_node.c_str(),
      machine.rank_cores, machine.cores_per_rank, machine.calibration_source.c_str());
  if (!experts_note.empty()) std::printf("%s\n", experts_note.c_str());
  std::printf(" %4s %3s | %10s %10s %10s %7s | %10s %10s %10s %10s | %10s %10s %10s %7s\n", "rank", "pp", "step", "sim",
              "model", "x sim", "compute", "cpu", "sim cpu", "sim busy", "peak mem", "sim", "model", "x model");
  for (const RankComparison& c : ranks) {
    std::printf(" %4d %3d | %10s %10s %10s %7s | %10s %10s %10s %10s | %10s %10s %10s %7s\n", c.rank, c.pp_rank,
                format_seconds(c.measured.step_time_s).c_str(), format_seconds(c.sim_step_s).c_str(),
                format_seconds(c.model_step_s).c_str(), ratio(c.measured.step_time_s, c.sim_step_s).c_str(),
                format_seconds(c.measured.compute_s).c_str(), format_seconds(c.measured.cpu_s).c_str(),
                c.sim_cpu_s > 0 ? format_seconds(c.sim_cpu_s).c_str() : "-", format_seconds(c.sim_busy_s).c_str(),
                format_bytes(static_cast<double>(c.measured.peak_bytes)).c_str(),
                format_bytes(c.sim_peak_bytes).c_str(), format_bytes(c.model_peak_bytes).c_str(),
                ratio(static_cast<double>(c.measured.peak_bytes), c.model_peak_bytes).c_str());
  }
  std::printf(
      " (step: measured mean after the first step; compute: wall time in compute and update tasks per step; cpu: "
      "the rank's process CPU time per step, user + system; sim cpu: the core-seconds its simulated tasks and "
      "transfers held; x: measured / predicted)\n");
  if (!note.empty()) std::printf(" (%s)\n", note.c_str());
}

Json PredictionReport::to_json() const {
  Json ranks_json = Json::array();
  for (const RankComparison& c : ranks) {
    ranks_json.push_back(
        {{"rank", c.rank},
         {"pp_rank", c.pp_rank},
         {"measured",
          {{"step_time_s", c.measured.step_time_s},
           {"compute_s", c.measured.compute_s},
           {"cpu_s", c.measured.cpu_s},
           {"peak_memory_bytes", c.measured.peak_bytes}}},
         {"simulated",
          {{"step_time_s", c.sim_step_s},
           {"busy_s", c.sim_busy_s},
           {"cpu_s", c.sim_cpu_s},
           {"peak_memory_bytes", c.sim_peak_bytes}}},
         {"resource_model", {{"step_time_s", c.model_step_s}, {"peak_memory_bytes", c.model_peak_bytes}}}});
  }
  return Json{{"cluster", machine.cluster.name},
              {"ranks_on_node", machine.cluster.node.devices_per_node},
              {"nodes", machine.cluster.num_nodes},
              {"cores", machine.cores},
              {"rank_cores", machine.rank_cores},
              {"cores_per_rank", machine.cores_per_rank},
              {"calibration", machine.calibration_source},
              {"links", machine.links_source},
              {"simulated_step_time_s", sim_step_s},
              {"simulated_plan_hash", hex64(sim_plan_hash)},
              {"resource_model_step_time_s", model_step_s},
              {"note", note},
              {"expert_loads", experts_json},
              {"ranks", ranks_json}};
}

Status write_train_trace(const std::string& path, const compile::Plan& plan,
                         const std::vector<runtime::RankTimeline>& timelines, double step_time_s) {
  sim::SimResult measured;
  measured.step_time_s = step_time_s;
  measured.reduced = false;
  for (const runtime::RankTimeline& t : timelines) {
    if (t.rank < 0 || t.rank >= plan.world_size) {
      return internal_error("--trace: timeline of rank " + std::to_string(t.rank) + " outside the plan's " +
                            std::to_string(plan.world_size) + " ranks");
    }
    const compile::Program& prog = plan.program(t.rank);
    sim::RankStats r;
    r.rank = t.rank;
    r.pp_rank = t.pp_rank;
    for (const compile::InstrSpan& s : t.spans) {
      if (s.stream < 0 || static_cast<size_t>(s.stream) >= prog.streams.size() || s.instr < 0 ||
          static_cast<size_t>(s.instr) >= prog.streams[static_cast<size_t>(s.stream)].instrs.size()) {
        return internal_error("--trace: rank " + std::to_string(t.rank) + " recorded instruction " +
                              std::to_string(s.instr) + " of stream " + std::to_string(s.stream) +
                              ", which its program lacks");
      }
      r.spans.push_back(s);
    }
    r.memory.insert(r.memory.end(), t.memory.begin(), t.memory.end());
    measured.ranks.push_back(std::move(r));
  }
  Status st = report::write_chrome_trace(path, plan, measured, "piper train");
  if (!st.ok()) return st.with_context("--trace " + path);
  return ok_status();
}

}  // namespace piper::cli
