// simulate_plan: discrete-event execution of a compiled Plan on a modelled cluster.
//
// Execution model (the runtime's, src/runtime/):
//  - every simulated rank runs each of its streams' instructions in order; a stream blocks on its head instruction
//    until it completes;
//  - each device has one compute engine: compute and update instructions of all its streams queue for it in the
//    order they become ready (ties: stream order) and run one at a time for TaskTimeFn seconds;
//  - record completes at once and stamps its event; wait completes once the event of the same rank is recorded;
//  - alloc/free complete at once and move the rank's live bytes (on top of Program::static_bytes);
//  - send and recv with the same (sender, receiver, tag) rendezvous: the transfer starts when both are at the head
//    of their streams and both complete when its flows are done; a collective starts when every simulated member of
//    its group has reached it and completes for all of them together. Communication runs on the network, not on
//    the compute engine: all transfers in flight share links max-min fairly (FluidNet), so a DP all-reduce and an
//    EP all-to-all crossing the same NIC slow each other down.
// Representative ranks (SimOptions::full = false, the default): ranks of one pipeline slice run the same Program
// template, so only one rank per pipeline rank is simulated (coordinates dp = tp = 0); its collectives and sends
// load the links with the aggregate flows of every rank of the slice (comm_templates.h). Exact on symmetric
// clusters; full = true simulates every rank (tests compare both on small meshes).
//
// CPU ranks sharing cores (SimOptions::core_pool, off by default): the ranks of a node share pool.cores cores. A
// compute or update instruction is priced (TaskTimeFn) at pool.price_cores cores; while `busy` ranks of its node
// have one running, each runs on min(pool.rank_cores, pool.cores / busy) cores (processor sharing: a rank waiting
// in a bubble or on a transfer leaves its cores to the others), so its work advances at that many cores over
// price_cores times wall-clock speed, times pool.sharing_at(busy) (what running together costs each rank beyond its
// processor share: caches, memory bandwidth and context switches, measured). Exact: a node keeps a virtual clock
// of work done per running task (all of its running tasks advance alike) and one completion event, moved whenever
// busy changes (stale events carry an old version and are dropped); a change costs O(log tasks running on the
// node). It needs every rank of a node
// simulated (full = true; simulate_plan refuses representative ranks with a pool), and a pool that can never slow
// a rank (pool.cores >= rank_cores * ranks_per_node, price_cores = rank_cores and no sharing below 1) is off, to
// the bit.
//
// Accounting per simulated rank, over the step [0, step_time_s]: busy = compute engine running; exposed_comm = engine
// idle while a transfer of the rank is in flight; bubble = the rest (idle, nothing of its own on the wire, including
// waiting at a rendezvous for a peer that is late and the tail after the rank finished). busy + exposed_comm +
// bubble = step_time_s.
// Thread-safety: a pure function of its inputs.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "piper/base/status.h"
#include "piper/compile/plan.h"
#include "piper/compile/timeline.h"
#include "piper/cost/copy_cost.h"
#include "piper/sim/comm_templates.h"
#include "piper/sim/expert_rank_loads.h"
#include "piper/sim/network.h"
#include "piper/sim/task_time.h"

namespace piper::sim {

// Cores shared by the CPU ranks of a node (ClusterSpec NodeSpec::shared_cores; simulate_compiled fills it).
struct CorePool {
  // C: cores of one node, shared by its ranks (of a machine's hosts, NodeSpec::nodes_per_machine, shared by all of
  // theirs); 0 = off (every rank computes alone)
  double cores = 0;
  double rank_cores = 1;   // T: cores one rank's kernels use when it computes alone, in (0, cores]
  double price_cores = 1;  // cores a TaskTimeFn price stands for (rank_cores: the rank alone), > 0
  // consecutive global ranks per pool (ClusterSpec node.devices_per_node x node.nodes_per_machine)
  int ranks_per_node = 1;
  // sharing[n - 2]: the share of its speed each of n ranks computing together keeps beyond its processor share
  // (measured by `piper calibrate`: cost::Calibration::core_sharing); the last entry for larger n; empty: 1.
  std::vector<double> sharing;
  double sharing_at(int busy) const {
    if (busy <= 1 || sharing.empty()) return 1.0;
    return sharing[std::min(static_cast<size_t>(busy - 2), sharing.size() - 1)];
  }
};

// What a synchronisation costs on top of its transfer on CPU ranks sharing their node's cores (measured by
// `piper calibrate --ranks R`, comm/link_calibration.h: the time from the last rank's arrival to completion after
// the ranks computed, less the same collective without compute). The ranks that arrived early sleep between
// polls and MPI progresses a collective only inside their calls, so each collective finishes this much after its
// flows would. pair_s (when > 0) applies to every collective of two ranks, all_to_all_s to the other all-to-alls,
// other_s to every other collective; point-to-point transfers get none. simulate_compiled() fills it from
// NodeSpec::sync_excess_* and busy_cpu_*.
struct SyncCost {
  double all_to_all_s = 0;
  double other_s = 0;
  double pair_s = 0;
  // CPU seconds each member rank's communication takes from its node's cores (NodeSpec::busy_cpu_*): with the pool
  // on, every member adds that much single-core work to its node's pool as the transfer starts, which slows the
  // node's tasks when its cores are full (and costs nothing on a free core).
  double cpu_all_to_all_s = 0;
  double cpu_other_s = 0;
  double cpu_pair_s = 0;
  double cpu_p2p_s = 0;
  // CPU seconds of one core per byte a transfer moves: the ranks of a node that shares its cores move their bytes
  // with those cores (MPI's shared-memory transport copies every byte; the TCP stack between emulated nodes too),
  // so a transfer's bytes, shared equally by its members, are added to the pool as work like the figures above.
  // cpu_per_byte_s prices the bytes of all-reduces and reduce-scatters, gather_cpu_per_byte_s those of all-gathers,
  // exchange_cpu_per_byte_s those of all-to-alls and point-to-point transfers (0: cpu_per_byte_s); simulate_compiled()
  // sets them to cost::copy_seconds_per_byte of each kind.
  double cpu_per_byte_s = 0;
  double gather_cpu_per_byte_s = 0;
  double exchange_cpu_per_byte_s = 0;
  // The figure above for the bytes of a transfer of this kind.
  double per_byte_s(cost::CopyKind kind) const {
    const double k = kind == cost::CopyKind::kGathered    ? gather_cpu_per_byte_s
                     : kind == cost::CopyKind::kExchanged ? exchange_cpu_per_byte_s
                                                          : 0.0;
    return k > 0 ? k : cpu_per_byte_s;
  }
  // One thread's seconds per byte a streaming copy moves (cost::staging_seconds_per_byte): each member of a
  // data-parallel collective (CommRole kGradReduce, kParamGather) also adds the copies the runtime stages it with
  // (cost::dp_staged_bytes) to its node's pool, as single-core work of its stream: CPU taken from the node's
  // tasks, not time on the collective's own path (which the runtime's dp stream spends before and after the
  // transfer). 0 = none.
  double staging_s_per_byte = 0;
  // With node_figures, a collective whose members all lie on one node (of ranks_per_node consecutive global ranks)
  // takes these instead of all_to_all_s / other_s and cpu_all_to_all_s / cpu_other_s (NodeSpec::*_node_*: measured
  // over each node's own ranks when the calibration spans nodes, whatever the group's size inside the node; the
  // world's figures carry the transport between nodes), and the pair figures apply to pairs inside one node only (the
  // calibration's pairs are); a collective across nodes takes the world's. Without: every collective takes the
  // figures above, pairs pair_s / cpu_pair_s.
  bool node_figures = false;
  double node_all_to_all_s = 0;
  double node_other_s = 0;
  double cpu_node_all_to_all_s = 0;
  double cpu_node_other_s = 0;
  int ranks_per_node = 0;
  // NodeSpec::exchange_lag: the last member to arrive at an all-to-all completes it this much after the others, by
  // the mean length of the other members' compute tasks (their template's mean compute instruction); empty: none.
  std::vector<std::pair<double, double>> exchange_lag = {};
  // The lag at `task_s`: linear between the measured points, the end points' beyond them; 0 when empty.
  double exchange_lag_at(double task_s) const;
  // NodeSpec::a2a_wait_cpu_share: with the pool on, each member of an all-to-all adds this share of its wait (from its
  // arrival to the completion) to its node's pool as CPU of its stream when the all-to-all completes.
  double a2a_wait_cpu_share = 0;
};

struct SimOptions {
  bool full = false;             // simulate every rank instead of one per pipeline rank
  bool zero_comm = false;        // communication takes no time (schedule checks)
  bool record_timeline = false;  // keep every instruction's span and the memory samples (for traces)
  // simulate() only: compile with LowerOptions::interleave_overlap (DualPipeV/AF-Pipe F&B slots alternate chunk by
  // chunk). On by default, as in `piper compile`, so the simulated plan is the compiled one.
  bool interleave_overlap = true;
  // simulate() only: compile with CompileOptions::overlap_param_gather (ZeRO-1/2 parameters gathered by the next
  // step's forward, Megatron's --overlap-param-gather, as both compile targets; false: right after the update).
  bool overlap_param_gather = true;
  // Wall-clock deadline (steady_clock): the event loop checks it every 1,024 event-loop rounds and gives up with
  // StatusCode::kDeadlineExceeded ("not simulated: budget ...", naming the simulated time reached and the events
  // run) once it has passed. The default (time_point::max()) never stops. Callers with a time budget
  // (plan/rescore.h) set it so that one long simulation cannot overrun the budget.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Recompute every flow's max-min rate whenever a transfer starts or ends (FluidNet's reference form) instead
  // of only the flows connected to it through saturated links (fluid.h). Same step times up to rounding; tests
  // and bench/sim compare the two.
  bool reference_rates = false;
  // false: FluidNet tests every flow in flight for completion at each step instead of only those due (fluid.h's
  // due_filter; the same simulation, for bench/sim's ratio).
  bool due_filter = true;
  // simulate() / simulate_compiled(): fill SimReport::plan_hash (compile::plan_hash serialises the whole plan to
  // JSON: about as long as the simulation itself and several times its memory on a 2,048-rank DualPipeV plan).
  // Only `piper train`'s predicted-against-measured report reads it; the planner and `piper simulate` turn it off.
  bool plan_hash = true;
  // Representative ranks: translate a collective's flow template from another pipeline slice's instead of building
  // it from every group instance of the slice (CommTemplates::set_reuse_slices; same templates, so the same step
  // times). false: the former path, for tests and bench/sim's baseline.
  bool reuse_slice_templates = true;
  // simulate() / compile_for_simulation(): compile with CompileOptions::data_edges (Instruction::inputs/outputs,
  // which the simulator does not read). The planner turns it off (a cheaper compile, the same step times:
  // tests/compile/data_edges_test.cc); on by default so that SimReport::compiled is the plan `piper compile` makes.
  bool data_edges = true;
  // The MoE routing behind a2a=halo templates (comm_templates.h); simulate() and simulate_compiled() fill it from
  // the model and train spec (halo_sim_model in simulate.h). A plan with a HALO all_to_all needs it.
  HaloSimModel halo;
  // CPU ranks sharing their node's cores (processor sharing, above); off by default. Needs full = true.
  CorePool core_pool;
  // Measured expert loads per ep rank (expert_rank_loads.h): each simulated rank's experts priced and their
  // activation buffers sized from its own share of the routed tokens; off by default. Needs full = true and
  // loads.ep equal to the plan's ep.
  ExpertRankLoads expert_loads;
  // Extra latency of each collective on such ranks (SyncCost); zero by default.
  SyncCost sync_cost;
};

using compile::InstrSpan;     // compile/timeline.h: the measured timeline's type too
using compile::MemorySample;

struct RankStats {
  int rank = 0;     // global rank
  int pp_rank = 0;  // its pipeline rank (= Plan template)
  double finish_s = 0;
  double busy_s = 0;
  double exposed_comm_s = 0;
  double bubble_s = 0;
  double comm_s = 0;  // time with a transfer of this rank in flight (overlapped or not)
  // Exposed communication by group (dp, edp, ep, tp, pp, a2f): time the engine is idle while a transfer of that
  // group is in flight. Groups can overlap, so the values may add up to more than exposed_comm_s.
  std::vector<std::pair<std::string, double>> exposed_by_group_s;
  int64_t static_bytes = 0;
  int64_t peak_bytes = 0;
  // CPU ranks (SimOptions::core_pool.cores > 0), per stream of its program: the core-seconds its tasks held, and
  // those of the transfers it ran (SyncCost::cpu_*), as the runtime's per-stream thread CPU is measured
  // (runtime StepResult::stream_cpu_s). Empty without a core pool.
  std::vector<double> cpu_s_by_stream;
  std::vector<InstrSpan> spans;      // record_timeline only, in completion order
  std::vector<MemorySample> memory;  // record_timeline only
};

struct SimResult {
  double step_time_s = 0;
  bool reduced = true;           // representative ranks only
  std::vector<RankStats> ranks;  // simulated ranks, ascending global rank
  int64_t instructions = 0;      // instructions executed
  int64_t flows = 0;             // flows started in the network model
  int64_t rate_updates = 0;      // max-min recomputations
  int64_t full_rate_updates = 0;  // of which over every flow in flight (reference_rates, or a shared link saturated)
  int comm_templates = 0;
  // With per-step expert loads (ExpertRankLoads::first_step, load_steps()): each simulated step's time, in step
  // order. step_time_s and every rank's finish, busy, exposed, bubble, comm and CPU seconds are then their means;
  // the timeline (whose spans end at that simulation's own step, not the mean), memory, peaks and the counters
  // above are those of one simulation at the run's mean loads. Empty otherwise.
  std::vector<double> load_step_times_s;
};

// Errors: a plan that needs more devices than the network has, an instruction the TaskTimeFn cannot price, an unknown
// group axis, a deadlock (names every blocked rank, stream and instruction), and kDeadlineExceeded when
// options.deadline passed before the step was simulated.
Result<SimResult> simulate_plan(const compile::Plan& plan, const Network& net,
                                const TaskTimeFn& task_time, const SimOptions& options = {});

}  // namespace piper::sim
