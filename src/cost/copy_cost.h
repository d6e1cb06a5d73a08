// What a transfer's bytes cost the cores of a CPU node whose ranks share them (NodeSpec::shared_cores): MPI's
// shared-memory transport (and the TCP stack between emulated nodes) copies every byte with those cores: the CPU per
// byte `piper calibrate --ranks R` measures beside computing threads (NodeSpec::copy_cpu_s_per_byte), or without it
// one copy at the rate the node's intra-node link is measured at with idle cores. The simulator adds it to
// the node's core pool per transfer (sim::SyncCost::cpu_per_byte_s), the closed form to each kind of a rank's
// communication at its static share of the cores (estimate.cc). docs/simulator.md "The bytes themselves".
// Besides the transfer, the runtime stages every data-parallel collective with copies of its own (dp_staged_bytes,
// priced at one thread's measured copy rate: staging_seconds_per_byte). They are charged as CPU taken from the
// node's cores, not as time on the collective's own path (the runtime runs them on the dp stream before and after
// the transfer): a ZeRO-3 forward that waits for its gather's unpack waits for it in the runtime only.
#pragma once

#include <algorithm>

#include "piper/cost/device_model.h"
#include "piper/spec/cluster_spec.h"

namespace piper::cost {

// What a transfer does with its bytes, which decides what a byte costs the cores: summed (all-reduce,
// reduce-scatter: MPI adds what it receives), gathered (all-gather) or exchanged (all-to-all, point-to-point, m2n).
// `piper calibrate --ranks R` measures each beside computing threads; summed bytes cost about 1.5x the others on the
// build machines (docs/calibration.md, session 39).
enum class CopyKind { kSummed, kGathered, kExchanged };

// One core's seconds per byte carried: the kind's measured figure (NodeSpec::gather_copy_cpu_s_per_byte,
// exchange_copy_cpu_s_per_byte), else the measured NodeSpec::copy_cpu_s_per_byte, else 1 / the intra-node
// bandwidth; 0 on a node that does not share its cores or has none of them.
inline double copy_seconds_per_byte(const NodeSpec& node, CopyKind kind) {
  if (!(node.shared_cores > 0)) return 0.0;
  if (kind == CopyKind::kGathered && node.gather_copy_cpu_s_per_byte > 0) return node.gather_copy_cpu_s_per_byte;
  if (kind == CopyKind::kExchanged && node.exchange_copy_cpu_s_per_byte > 0) return node.exchange_copy_cpu_s_per_byte;
  if (node.copy_cpu_s_per_byte > 0) return node.copy_cpu_s_per_byte;
  return node.intra.bw_bytes_per_s > 0 ? 1.0 / node.intra.bw_bytes_per_s : 0.0;
}

// A data-parallel collective as runtime/exec/executor_dp.cc stages it: which copies surround the transfer.
enum class DpStaging {
  kAllReduce,                  // zero=0: the gradient all-reduce
  kReduceScatter,              // ZeRO-1: once per step, the share scaled into the gradient
  kAccumulatingReduceScatter,  // ZeRO-2/3: per microbatch, the share added to the accumulated gradient shard
  kGatherAfterUpdate,          // ZeRO-1/2: the updated shards gathered into the parameters
  kGatherForCompute,           // ZeRO-3: the parameters gathered into tensors cleared first, before an F or B
};

// The bytes one rank's own copies move (read plus written) to stage one data-parallel collective of a chunk's
// `bytes` (N) over `members` (p) ranks: the chunk's tensors are packed into one buffer and the result copied back.
// All-reduce: pack and unpack the whole (4 N). Reduce-scatter: pack the whole, then scale its share into the
// gradient (2 N + 2 N/p), or add it to the accumulated shard (2 N + 3 N/p). All-gather: pack its share and unpack
// the whole (2 N/p + 2 N), ZeRO-3's into parameters it clears first (2 N/p + 3 N; an upper bound: a gather whose
// earlier copy is still live drops its data, 2 N/p). The unpacks that scale or add run at about the triad's rate,
// priced here at the copy's. (The all-reduce is out of place: in place, MPI's path copies a large input first.)
inline double dp_staged_bytes(DpStaging kind, double bytes, int members) {
  const double share = bytes / std::max(1, members);
  switch (kind) {
    case DpStaging::kAllReduce:
      return 4 * bytes;
    case DpStaging::kReduceScatter:
      return 2 * bytes + 2 * share;
    case DpStaging::kAccumulatingReduceScatter:
      return 2 * bytes + 3 * share;
    case DpStaging::kGatherAfterUpdate:
      return 2 * share + 2 * bytes;
    case DpStaging::kGatherForCompute:
      return 2 * share + 3 * bytes;
  }
  return 0;
}

// One thread's seconds per byte a copy moves on a node whose ranks share its cores: the copy rate measured by
// `piper calibrate` (Calibration::copy_bw_bytes_per_s), else the triad's one-thread bandwidth (thread_figures), else
// the rank's streaming bandwidth over its cores; 0 on a node that does not share its cores (as
// copy_seconds_per_byte) or knows none of them.
inline double staging_seconds_per_byte(const NodeSpec& node, const DeviceSpec& device, const Calibration& cal) {
  if (!(node.shared_cores > 0)) return 0.0;
  if (cal.copy_bw_bytes_per_s > 0) return 1.0 / cal.copy_bw_bytes_per_s;
  for (const Calibration::ThreadFigures& f : cal.thread_figures) {
    if (f.threads == 1 && f.memory_bw_bytes_per_s > 0) return 1.0 / f.memory_bw_bytes_per_s;
  }
  const double bw = (cal.memory_bw_bytes_per_s > 0 ? cal.memory_bw_bytes_per_s : device.memory_bw_bytes_per_s) *
                    cal.memory_bw_efficiency / std::max(1.0, node.device_cores);
  return bw > 0 ? 1.0 / bw : 0.0;
}

}  // namespace piper::cost
