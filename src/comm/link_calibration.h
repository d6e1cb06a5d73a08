// The link measurements of `piper calibrate --ranks R` (docs/calibration.md, "Links"): alpha-beta of
// point-to-point messages and of the collectives the runtime calls, all through the Communicator the runtime uses
// (comm/mpi with its default options: arrival notes on, the runtime's polling waits), so that what is measured is
// what a training step pays per call.
//
// Measured, collective over `world` (every rank calls; the result is complete on every rank):
//   - ping-pong between ranks 0 and 1 (same node) and, when the world spans nodes, between 0 and the first rank of
//     the second node: the half round trip at each size of `p2p_bytes`;
//   - all_reduce_sum, all_gather and all_to_all_v over the world at each size of `collective_bytes` (bytes per rank;
//     all_to_all_v sends bytes / P to every peer): the slowest rank's time, barrier before each call;
//   - compute-then-collective: every rank computes a fixed arithmetic loop (sized to `compute_s` of one core), then
//     all-reduces (or all-to-alls) and waits as the runtime's stream threads do (idle_while_polling); the time
//     from the last rank's arrival to completion, against the same collective without compute. The difference is
//     what a synchronisation costs while ranks compute on shared cores: the ranks that arrived early sleep between
//     polls, and MPI progresses a collective's rounds only inside their MPI calls. Over the world, and (R >= 4, even)
//     the all-reduce in pairs (2k, 2k+1), every pair at once, as tensor-parallel pairs synchronise (the pairs'
//     samples pooled: one figure for every pair);
//   - collectives while the cores compute: every rank keeps `compute_threads` threads spinning the same loop
//     (what the runtime's compute streams do on an oversubscribed node) while its main thread calls the world
//     all-reduce, the world all-to-all, the all-reduce in pairs and a ping-pong in pairs back to back, waiting
//     as the runtime does; the time per call (trimmed mean over calls, mean over ranks) against the same loop with no
//     compute (the difference is measured for the record; the simulator does not apply it, docs/calibration.md);
//     and the work the spinning threads lost per call against their rate alone: the CPU a collective takes from
//     compute, which the simulator adds to the node's core pool (NodeSpec::busy_cpu_*).
//   - the exchange chain (ExchangeChain): compute and all-to-all back to back as an ep layer runs them, one rank in
//     turn computing more; how much later than the others the last rank to arrive leaves each exchange, per task
//     length (NodeSpec::exchange_lag, which the simulator adds to that rank's completion of an all-to-all), and the
//     CPU a rank burns per second it waits in one (NodeSpec::a2a_wait_cpu_share);
// Times are medians over iterations (after `warmup`), but compute-then-collective's (over interleaved rounds) and
// the time per call while the cores compute, which are trimmed means (SyncUnderLoad, ContendedTiming). Nodes are told
// apart by host name (gethostname), so the two-node emulation (scripts/two-node-emulation.sh, one host name per
// namespace) counts as two nodes; ranks must be node-major (the error says so otherwise).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

struct LinkCalibrationOptions {
  std::vector<size_t> p2p_bytes = {8, 4096, 65536, 1 << 20, 4 << 20};
  std::vector<size_t> collective_bytes = {8, 4096, 65536, 1 << 20, 4 << 20};
  int iterations = 15;  // per size (large sizes: a third, at least 3)
  int warmup = 2;
  double compute_s = 0.004;                   // the compute-then-collective loop's work on one core alone
  size_t sync_all_reduce_bytes = 4096;        // ... then an all-reduce of this many bytes per rank
  size_t sync_all_to_all_bytes = 512 * 1024;  // ... or an all-to-all (tiny-moe's dispatch at mbs 4)
  // The compute-then-collective loops run in rounds, idle and busy interleaved (idle, busy, idle, busy, ...), so
  // that a slow drift of the machine's load affects both alike; each round times this many iterations of each
  // (after `warmup`): 160 samples per figure, times R/2 for the pairs (docs/calibration.md, session 32).
  int sync_rounds = 8;
  int sync_iterations = 20;
  // trimmed_mean's fraction off each end, for compute-then-collective and the time per call while computing: one
  // interruption in 20 samples goes, the long tail of a descheduled rank (part of what a synchronisation costs)
  // mostly stays.
  double trim = 0.05;
  int contended_iterations = 40;            // calls per collective while the cores compute (and without)
  size_t contended_p2p_bytes = 128 * 1024;  // the ping-pong's message (tiny-moe's activations at mbs 2)
  // The world all-reduce again at this size while the cores compute, `contended_large_iterations` calls a window:
  // beyond a core's cache, as a training step's gradient buckets are; the rise of the calls' own CPU (comm_cpu_s)
  // from the 4 KiB all-reduce is the CPU per byte a rank's transfers carry (copy_cpu_s_per_byte).
  size_t contended_large_bytes = 16u << 20;
  int contended_large_iterations = 6;
  int compute_threads = 0;                  // spinning threads per rank; 0: max(1, cores / ranks per node)
  double contended_alone_s = 0.3;           // the spinning threads' rate alone is measured over this long
  // Windows of calls while the cores compute, each between two windows of the threads alone (A B A ... B A); the
  // figures are the median over windows (one window's lost work moved 3-5x between calibrations, session 34).
  int contended_windows = 5;
  double cores = 1;  // the node's cores (std::thread::hardware_concurrency of rank 0)
  // The exchange chain (ExchangeChain): each rank computes one task, then all-to-alls sync_all_to_all_bytes, then
  // computes the next at once, with no barrier, at each of these task lengths (one core's seconds alone; ascending),
  // one rank in turn computing busiest_factor times as much (an ep layer's busiest rank); chain_iterations per length.
  std::vector<double> chain_task_s = {0.0005, 0.001, 0.002, 0.004, 0.008, 0.016};
  int chain_iterations = 40;
  double chain_busiest_factor = 1.5;
  Status validate() const;
};

struct SizedTime {
  size_t bytes = 0;
  double seconds = 0;
  double cpu_s = 0;  // collectives: the process CPU of one call (user + system, its waits included), mean over ranks
};

// t(bytes) ~= alpha + bytes / bw: alpha is the time at the smallest size, bw from the largest size's excess.
struct AlphaBeta {
  bool measured = false;
  double alpha_s = 0;
  double bw_bytes_per_s = 0;
  std::vector<SizedTime> points;
};

// The mean of `samples` without the floor(trim * n) lowest and as many highest: the expected value of a quantity
// that one-off interruptions (another process, a rank descheduled for a time slice) do not move, and that, unlike a
// median, weighs both modes of a bimodal distribution by their mass. InvalidArgument (naming the fix) for no
// samples or trim outside [0, 0.5).
Result<double> trimmed_mean(std::vector<double> samples, double trim);

struct SyncTiming {
  double after_last_arrival_s = 0;  // from the last rank's arrival to completion (mean over ranks)
  double iteration_s = 0;           // compute + collective, first start to last completion
  double work_cpu_s = 0;            // CPU time of one rank's compute (median over ranks)
};

// The iterations of one round of a compute-then-collective loop (one sample of each per iteration, same order).
struct SyncRound {
  std::vector<double> after_last_arrival_s, iteration_s, work_cpu_s;
};

// A collective after compute: `idle` with no compute (the ranks arrive together), `busy` after every rank computed
// compute_s on the shared cores (they arrive as time slicing lets them; the early ones have backed off to
// sleeping polls). excess_s = busy - idle after the last arrival: what a synchronisation costs on top of the
// collective itself when the ranks compute on shared cores. busy is the expected time (a trimmed mean over every
// round's iterations, not a median: the time after the last arrival is bimodal on shared cores, whether an early
// rank sleeps in its backoff when the last arrives or not, and a median jumps between the modes from one
// calibration to the next; docs/calibration.md, session 32); idle is the collective's typical time (a median), as
// in the alpha-beta fits that price the collective itself, so that fit + excess_s is the expected time after
// compute. round_excess_s: the same difference from each round alone, in order; its min and max show how stable
// excess_s is.
struct SyncUnderLoad {
  bool measured = false;
  size_t bytes = 0;  // per rank
  SyncTiming idle, busy;
  double excess_s = 0;
  double trim = 0;                     // of busy's trimmed means
  int samples_per_round = 0;           // per condition (idle, busy): iterations, times R/2 for the pairs
  std::vector<double> round_excess_s;  // one per round
  double round_excess_min_s = 0, round_excess_max_s = 0;
};

// SyncUnderLoad from rounds measured in order idle[0], busy[0], idle[1], busy[1], ... (samples_per_round from
// idle[0]; bytes left 0 for the caller), the samples of every round pooled: busy's after_last_arrival_s and
// iteration_s are trimmed means, idle's medians, work_cpu_s medians; excess_s and each round's excess (the same
// from that round alone) are at least 0. InvalidArgument when the rounds are missing, unequal in number, empty, or
// trim is outside [0, 0.5).
Result<SyncUnderLoad> sync_under_load(const std::vector<SyncRound>& idle, const std::vector<SyncRound>& busy,
                                      double trim);

// A collective called back to back while every rank's compute threads spin (busy_s) and without (idle_s): the time
// per call, trimmed mean over calls (a call waits for a time slice or not; a median jumps between the two), mean
// over ranks; excess_s = busy_s - idle_s (>= 0). cpu_s: the CPU seconds of compute the spinning threads of a rank
// lost per call (their work beside the calls against their rate alone, the rank's main thread asleep), mean over
// ranks: what a collective takes from the compute of an oversubscribed node (its thread's polls, MPI's progress,
// the context switches). comm_cpu_s: the CPU seconds per call of everything in the rank's process but the spinning
// threads while they spin beside the calls (its calling thread's polls and waits, MPI's work inside the calls and its
// own threads), mean over ranks: what the communication itself burns, counted by the kernel's clocks rather than
// inferred from lost work; recorded beside cpu_s (the model prices cpu_s).
struct ContendedTiming {
  bool measured = false;
  size_t bytes = 0;         // per rank (ping-pong: per message)
  int compute_threads = 0;  // per rank
  double idle_s = 0, busy_s = 0, excess_s = 0;
  double cpu_s = 0;
  double comm_cpu_s = 0;
  // cpu_s of each window (LinkCalibrationOptions::contended_windows), mean over ranks: cpu_s is their median.
  std::vector<double> cpu_s_windows;
};

// The runtime's chain of compute and all-to-all (an ep layer's expert tasks and exchanges) on shared cores, per
// task length: the last rank to arrive at an exchange leaves it lag_s after the others (the last rank's completion
// less the other ranks' mean, trimmed mean over iterations; the ranks' clocks must be one, as for the
// compute-then-collective loop: one host, or the two-node emulation's one kernel), because the ranks that left first
// have woken their compute and taken the cores from it; period_s is the chain's measured time per iteration and
// fluid_period_s what processor sharing of the cores predicts for it (the tasks alone, without the exchange), for the
// record.
struct ExchangeChain {
  bool measured = false;
  size_t bytes = 0;  // per rank
  double busiest_factor = 1;
  std::vector<double> task_s, lag_s, period_s, fluid_period_s;
  // Per task length, mean over ranks and exchanges: the time a rank spends in an exchange (from its entry to its
  // exit) and the CPU its thread burns there (polling as the runtime does, MPI's progress inside the polls).
  std::vector<double> wait_s, wait_cpu_s;
  // The rise of wait_cpu_s with wait_s (least squares over the task lengths, in [0, 1]): the CPU seconds a rank's
  // waiting thread burns per second it waits in an all-to-all (NodeSpec::a2a_wait_cpu_share).
  double wait_cpu_share = 0;
};

struct LinkCalibration {
  int ranks = 0, ranks_per_node = 0;
  double cores = 0;
  std::vector<std::string> hosts;  // one per node, in node order
  AlphaBeta intra, inter;          // point to point
  AlphaBeta all_reduce, all_gather, all_to_all;
  SyncUnderLoad sync_all_reduce, sync_all_to_all;
  // The all-reduce in groups of two (ranks 2k, 2k+1: tensor-parallel pairs), every pair at once, the samples of
  // every pair pooled; R >= 4, even.
  SyncUnderLoad sync_pairs;
  ExchangeChain exchange_chain;  // over the world
  // While the cores compute: world all-reduce and all-to-all, the all-reduce in pairs and the ping-pong in pairs
  // (R even; point-to-point transfers, as pipelines make them).
  ContendedTiming contended_all_reduce, contended_all_to_all, contended_pairs, contended_p2p;
  // The world all-reduce, all-gather (bytes: the gathered tensor) and all-to-all (bytes: one rank's send buffer) of
  // LinkCalibrationOptions::contended_large_bytes while the cores compute.
  ContendedTiming contended_all_reduce_large, contended_all_gather_large, contended_all_to_all_large;
  // Across nodes (2 or more hosts, 2 or more ranks each): the world all-reduce's and all-to-all's figures above again
  // over each node's own ranks, every node at once (samples pooled over the nodes): what a collective inside one node
  // costs, without the transport between nodes that the world's figures carry (node.*_node_* in the file's cluster).
  SyncUnderLoad node_sync_all_reduce, node_sync_all_to_all;
  ContendedTiming node_contended_all_reduce, node_contended_all_to_all;
};

// One core's seconds per byte a rank's port carries while the cores compute: the large all-reduce's own CPU per call
// (comm_cpu_s) less the 4 KiB one's, over the rise of a ring all-reduce's port bytes (2 (n - 1) / n per byte); 0
// when either is unmeasured. Written as node.copy_cpu_s_per_byte (NodeSpec::copy_cpu_s_per_byte).
double copy_cpu_s_per_byte(const LinkCalibration& c);
// The same for bytes gathered (the large all-gather's own CPU, over (n - 1)/n of the gathered tensor) and exchanged
// (the large all-to-all's, over (n - 1)/n of a rank's send buffer): MPI's shared memory copies them on both sides
// but sums nothing. Written as node.gather_copy_cpu_s_per_byte and node.exchange_copy_cpu_s_per_byte.
double gather_copy_cpu_s_per_byte(const LinkCalibration& c);
double exchange_copy_cpu_s_per_byte(const LinkCalibration& c);

Result<LinkCalibration> measure_links(Communicator& world, const LinkCalibrationOptions& options);

// Fit of AlphaBeta from measured points (ascending bytes, at least two): exposed for tests.
AlphaBeta fit_alpha_beta(std::vector<SizedTime> points);

// The intra-node link that makes the simulator's collective algorithms (sim/collectives.h: ring all-reduce of
// 2(n-1) steps, ring all-gather of n-1 steps, flat all-to-all of one) take the measured times on one node of n
// ranks: each collective's smallest size gives a latency per step, its largest size's excess a port bandwidth;
// the link is the median of the three. Not measured (measured == false) when the world spans nodes.
struct EffectiveLink {
  bool measured = false;
  double latency_s = 0, bw_bytes_per_s = 0;
  double latency_by_kind_s[3] = {0, 0, 0};  // all-reduce, all-gather, all-to-all
  double bw_by_kind[3] = {0, 0, 0};
  // One core's seconds per byte a rank's port carries: the rise of a call's CPU from the smallest size to the largest
  // over the rise of its port bytes, per kind, and their median. Recorded (measured.intra_from_collectives), not
  // applied: with idle cores and 4 MiB buffers it came to 0.22 ns here, under half of one copy at the port's rate
  // (0.51 ns, which the simulator charges: cost/copy_cost.h), while moe-40m's ZeRO-1 dp stream burns about twice
  // that rate in training (cold buffers, the reductions' arithmetic); priced at 0.22 ns tiny-moe's median went from
  // 1.22 to 1.21 on the same calibration (docs/calibration.md, session 34).
  double cpu_per_byte_by_kind[3] = {0, 0, 0};
  double cpu_s_per_byte = 0;
};
EffectiveLink effective_intra_link(const LinkCalibration& c);

// The calibration file (spec/comm_calibration.h): ClusterSpec fields: node.intra from effective_intra_link on one
// node (from the point-to-point fit across nodes), node.nic_latency_s / nic_bw_bytes_per_s from the point-to-point
// fit between nodes; under "measured" the point-to-point and collective fits and the compute-then-collective
// timings, whose excess_s the simulator of shared-core clusters adds per collective (NodeSpec::sync_excess_*).
OrderedJson link_calibration_json(const LinkCalibration& c, const std::string& source);
std::string to_text(const LinkCalibration& c);

}  // namespace piper::comm
