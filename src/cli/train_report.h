// What `piper train` reports at the end of a run besides the losses: the measured timeline as a Chrome trace
// (--trace) and, per rank, the measured step time, compute time and peak memory beside the simulator's
// (src/sim, executing the very plan the ranks ran: the trainer compiles it with this machine's prices,
// local_plan_prices, and the simulator takes it without recompiling) and the resource model's (src/cost)
// predictions on a ClusterSpec of this machine.
//
// The ClusterSpec of this machine (local_cluster): the `local-cpu` preset (one device = one CPU core) with one
// device per rank, each device's FLOP/s and memory bandwidth scaled by the cores a rank computes on when it runs
// alone, and the node's cores shared by the ranks (ClusterSpec NodeSpec::shared_cores, processor sharing):
//   rank_cores = min(kernel threads, hardware cores C)      node.shared_cores = C, node.device_cores = rank_cores
// The simulator (full, as train's prediction runs it) gives each computing rank min(rank_cores, C / busy) cores,
// busy = the ranks computing at that moment, so a rank in a pipeline bubble leaves its core to the others. The
// closed form prices every rank at the static share with all ranks busy:
//   cores_per_rank = min(rank_cores, C / ranks)             (4 ranks on 2 cores: 0.5; one rank with 2 threads: 2)
// which is what both priced before the simulator shared the cores (session 24). Representative-rank simulations of
// this cluster (none here; `piper simulate` without --full) price at the static share too.
// A calibration of this machine (`piper calibrate`) gives one core's figures and, when it measured them, those of
// a rank with t threads for t = 1..C (cost::Calibration::thread_figures): a rank is priced with the measured
// figures of rank_cores threads where the file has them, else with rank_cores x one core's (calibration_file.h
// scale_to_rank_cores).
// Its core_sharing (n single-thread ranks computing together) reaches the simulator's core pool.
// `comm_calibration` (from `piper bench comm --calibration-out F`, src/spec/comm_calibration.h) replaces the link
// latency and bandwidth; `calibration` (src/cost/device_model.h JSON) the GEMM efficiency curve. A CPU rank has no
// CUDA workspace: workspace_bytes = 0 as in Trainer::predicted_memory().
// Rank 0 calls these; the measurements of every rank are gathered by runtime::run_training.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/cli/calibration_file.h"
#include "piper/cli/scenario.h"
#include "piper/comm/communicator.h"
#include "piper/cost/device_model.h"
#include "piper/runtime/exec/trace.h"
#include "piper/runtime/trainer.h"
#include "piper/runtime/training_run.h"
#include "piper/spec/cluster_spec.h"

namespace piper::cli {

// One rank's measurements (runtime/training_run.h).
using RankMeasurement = runtime::RankMeasurement;

struct LocalMachine {
  ClusterSpec cluster;
  cost::Calibration calibration;
  double cores = 1;  // C: the cores of one host, shared by its ranks (hosts of one machine split its cores)
  double rank_cores = 1;           // cores one rank computes on alone: min(kernel threads, C)
  double cores_per_rank = 1;       // the static share: min(rank_cores, C / ranks), the closed form's price
  std::string calibration_source;  // "preset" or the files used (device and links)
  std::string links_source;        // the link calibration (cli/calibration_file.h apply_link_calibration)
};

// Where the ranks of an MPI job run: `nodes` hosts (host names; node-major, equally many ranks each) on `machines`
// physical machines (boot ids: the two-node emulation's namespaces are hosts of one machine, and share its cores).
struct HostLayout {
  int nodes = 1, machines = 1;
};

// The layout of `world`'s ranks (one all-gather of each rank's host name and boot id); one node without a world.
// Errors: ranks not node-major or unequally many per host (the predictions' cluster needs both).
Result<HostLayout> host_layout(comm::Communicator* world);

// Errors: unreadable or invalid calibration files (named); ranks spread over several hosts without a link
// calibration that measured the link between them.
Result<LocalMachine> local_cluster(int ranks, int kernel_threads, const std::string& calibration,
                                   const std::string& comm_calibration, HostLayout hosts = {});
// The same with the device calibration already read (`piper calibrate --model` prices with the figures it has just
// measured, before any file holds them): `device` as load_device_calibration returns it, one core's figures.
Result<LocalMachine> local_cluster(int ranks, int kernel_threads, const DeviceCalibration& device,
                                   const std::string& comm_calibration, HostLayout hosts = {});

// The machine's task prices for the plan the trainer compiles (runtime::TrainOptions::plan_prices).
std::function<Result<compile::CostFn>(const Strategy&, const TrainSpec&)> local_plan_prices(const LocalMachine& machine,
                                                                                           const ModelSpec& model);

struct RankComparison {
  int rank = 0, pp_rank = 0;
  RankMeasurement measured;
  double sim_step_s = 0, sim_busy_s = 0, sim_peak_bytes = 0;
  double sim_cpu_s = 0;  // the simulation's CPU of the rank per step (sim::RankStats::cpu_s_by_stream summed)
  double model_step_s = 0, model_peak_bytes = 0;
};

// Measured expert loads a prediction prices the experts from: the simulation of every rank prices each ep rank's
// experts (time and memory) from its own share, the closed form every rank as the busiest.
struct PredictionLoads {
  std::string label;  // where they come from: "FILE (an earlier run)", "this run's own"
  MeasuredLoads loads;
  // The first recorded step the simulated time averages over (sim::ExpertRankLoads::first_step): this run's own
  // loads leave out its first step, as its measured step time does; a file's loads count every step.
  size_t first_step = 0;
};

struct PredictionReport {
  std::string title = "predicted vs measured";
  std::string experts_note;  // with PredictionLoads: which loads, priced how
  // Rank 0's simulated CPU per step by stream name (sim::RankStats::cpu_s_by_stream), beside the runtime's
  // measured RunSummary::stream_cpu_s; empty where the simulation priced no CPU (no core pool).
  std::vector<std::pair<std::string, double>> sim_stream_cpu_s;
  Json experts_json;         // the same for --json (null without)
  LocalMachine machine;
  std::vector<RankComparison> ranks;  // ascending rank
  double sim_step_s = 0, model_step_s = 0;
  uint64_t sim_plan_hash = 0;  // the hash of the plan simulated: the trainer's (compile::plan_hash)
  // Set when a prediction is missing or comes from elsewhere (af-pipe: the compiled plan's peak).
  std::string note;

  void print() const;
  Json to_json() const;
};

// Simulates the trainer's compiled plan and estimates its strategy on `machine` and pairs it with `measured` (one per
// rank). With `loads`: the experts priced from them (PredictionLoads), else as balanced (or the calibration's
// expert_load_imbalance). `sim_trace` (empty: none): also write the simulated step of that plan as a Chrome
// trace there (the measured timeline's twin, for comparing task by task).
Result<PredictionReport> predict_vs_measured(const runtime::Trainer& trainer, const LocalMachine& machine,
                                             const std::vector<RankMeasurement>& measured,
                                             const PredictionLoads* loads = nullptr,
                                             const std::string& sim_trace = "");

// The gathered timelines in the simulator's trace form (report/chrome_trace.h), written to `path`.
Status write_train_trace(const std::string& path, const compile::Plan& plan,
                         const std::vector<runtime::RankTimeline>& timelines, double step_time_s);

}  // namespace piper::cli
