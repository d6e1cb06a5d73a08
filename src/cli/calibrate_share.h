// `piper calibrate`'s CPU stages beyond one core (cmd_calibrate.cc calls them; docs/calibration.md):
//
// - per thread count t = 1..C: the kernels' fixed cost per call (a parallel kernel with one row per thread);
// - core sharing: n = 2..2C copies of this executable (`piper calibrate --share-worker`, processes as the runtime's
//   ranks are, each on one kernel thread) run the same GEMM and then the same triad in the same window of wall-clock
//   time, and each one's throughput is compared with one copy's alone (calibrate_fit.h sharing_efficiency).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/cli/calibrate_fit.h"

namespace piper::cli {

// The fastest undisturbed call of `fn` in wall-clock seconds over a round of >= round_s (and two calls): a call
// during which no thread of this process was preempted (getrusage's involuntary context switches did not move), so
// its threads ran at once on cores of their own, on a machine that other processes load. Infinity when no call of
// the round was undisturbed.
double fastest_single_call_s(const std::function<void()>& fn, double round_s);

// Seconds of one call of a parallel runtime kernel (kernels::rmsnorm_forward) with one 128-wide row per thread on
// `threads` kernel threads: the thread wake-up and join and the dispatch that every kernel call pays; the fastest
// single call (wall clock) of `rounds` rounds of 50 ms.
double measure_task_overhead_s(int threads, int rounds);

struct SharingRow {
  int ranks = 0;
  SharingEfficiency gemm;    // C[128, 512] = A[128, 512] B[512, 512], kernels::sgemm on one thread
  SharingEfficiency stream;  // the triad over 3 x 64 MiB
};

// Rows for n = 2..max_ranks; each measurement is the best of `rounds` (a window of `window_s` seconds per kernel;
// the one-alone baseline is measured the same way, in the same rounds). `cores`: C, for the per-wall figure.
Result<std::vector<SharingRow>> measure_core_sharing(int max_ranks, int rounds, double window_s, double cores);

// The worker behind measure_core_sharing (`piper calibrate --share-worker PREFIX --share-window S`): one kernel
// thread; sets up both kernels, writes PREFIX.ready, waits for the file `go` beside it (the start time in
// CLOCK_MONOTONIC nanoseconds, written once every worker is ready), runs the GEMM until start + window and the
// triad from start + 1.25 window until start + 2.25 window (a call running at the end of a window finishes), and
// prints one line "gemm CALLS CPU_S WALL_S stream CALLS CPU_S WALL_S" (the time of its completed calls).
Status run_share_worker(const std::string& prefix, double window_s);

// Starts n copies of this executable as `calibrate ARGS`, ARGS = args(prefix) for each one's prefix in a fresh
// meeting folder (quote each word with shell_quote); once every one has said it is ready (meet_share_workers), the
// start time is written there for all, or 0 (stop) when one was not ready after ready_timeout_s. Their outputs
// (stdout and stderr), or an error naming the workers that failed or never got ready.
Result<std::vector<std::string>> run_share_workers(int n, const std::function<std::string(const std::string&)>& args,
                                                   double ready_timeout_s);

// `word` as one word of a POSIX shell command line: in single quotes, each ' as '\''.
std::string shell_quote(const std::string& word);

// A worker's side of the meeting: writes PREFIX.ready, waits for the file `go` beside it and returns the start time
// it holds (wall_s's clock); an error when told to stop (another worker never got ready) or after 120 s.
Result<double> meet_share_workers(const std::string& prefix);

}  // namespace piper::cli
