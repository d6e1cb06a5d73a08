// The measurements behind `piper bench comm`: plain all-to-all (native MPI_Alltoallv through
// Communicator::all_to_all_v, flat pairwise, HALO) at several sizes per pair, a MoE dispatch with top-k
// duplication (flat MPI_Alltoallv vs HALO with node deduplication), its combine (the reverse, with the
// reduction inside the expert's node), and alpha-beta figures from ping-pongs.
//
// Conventions (nccl-tests): each timing is the median over iterations of the slowest rank's time, each
// iteration starting after a barrier; the candidates compared in one row (MPI, pairwise, HALO) run interleaved,
// one call of each per iteration, so that load changes on a shared machine hit them alike. For an all-to-all with S
// bytes per rank (S = bytes_per_pair * P), algbw = S / t and busbw = algbw * (P - 1) / P. A dispatch's effective token
// throughput is the number of tokens dispatched by all ranks per second (each token carries top_k slots). Ratios are
// against the MPI baseline measured in the same run. Collective over `world`; the report is complete on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

struct CommBenchOptions {
  int ranks_per_node = 1;
  int lanes = 1;
  // HaloContext::direct_pair_bytes of the HALO runs (remote blocks at least this big bypass the proxies).
  size_t halo_direct_pair_bytes = 64 * 1024;
  std::vector<size_t> bytes_per_pair = {4096, 65536, 262144, 1048576};
  int iterations = 10;
  int warmup = 2;
  // true: the candidates of a row run interleaved (one call of each per iteration); false: each runs all its
  // iterations in a block (the method of the session-3/4 measurements in docs/comm.md).
  bool interleave = true;
  // MoE dispatch: tokens_per_rank tokens of token_bytes each, top_k of num_experts experts (uniform random,
  // distinct), experts spread evenly over the ranks. 0 tokens skips the dispatch benchmark.
  int64_t tokens_per_rank = 512;
  size_t token_bytes = 4096;
  int num_experts = 16;
  int top_k = 4;
  uint64_t seed = 1;
  bool calibrate = true;
  Status validate(int world_size) const;
};

// Where a HALO call spent its time, from HaloExchangeStats of the last timed iteration: phase times are the
// slowest rank's (seconds), counts and bytes are summed over ranks.
struct HaloPhases {
  double metadata_s = 0, pack_s = 0, posted_s = 0, batches_out_s = 0, batches_in_s = 0, scatter_s = 0, exchange_s = 0;
  int64_t messages_intra = 0, messages_inter = 0, bytes_intra = 0, bytes_inter = 0, idle_rounds = 0;
};

struct AllToAllTiming {
  size_t bytes_per_pair = 0;
  double mpi_s = 0, pairwise_s = 0, halo_s = 0;
  HaloPhases halo_phases;
};

struct DispatchTiming {
  int64_t tokens_total = 0;
  double mpi_s = 0, halo_s = 0;
  int64_t flat_internode_bytes = 0;  // all ranks, one dispatch
  int64_t halo_internode_bytes = 0;
  int64_t flat_internode_messages = 0;  // (source, destination) rank pairs on different nodes with rows
  int64_t flat_intranode_messages = 0;
  HaloPhases halo_phases;
};

// MoE combine, the reverse of the dispatch: expert outputs of hidden = token_bytes / 4 floats per row, weighted
// sum with the routing weights (flat: MPI_Alltoallv back + local sum; HALO: reduced inside the expert's node).
struct CombineTiming {
  int64_t tokens_total = 0;
  double mpi_s = 0, halo_s = 0;
  int64_t flat_internode_bytes = 0;  // all ranks, one combine
  int64_t halo_internode_bytes = 0;
  double max_abs_diff = 0;  // largest |HALO - flat| over all outputs (regrouped float additions)
};

struct LinkFit {
  bool measured = false;
  double latency_s = 0;       // alpha: half round trip of an 8-byte message
  double bw_bytes_per_s = 0;  // 1 / beta from a 4 MiB ping-pong
};

struct CommBenchReport {
  int ranks = 0, ranks_per_node = 0, lanes = 0;
  size_t halo_direct_pair_bytes = 0;
  std::vector<AllToAllTiming> all_to_all;
  DispatchTiming dispatch;
  CombineTiming combine;
  LinkFit intra, inter;
  CommBenchOptions options;
};

Result<CommBenchReport> run_comm_bench(Communicator& world, const CommBenchOptions& options);

OrderedJson to_json(const CommBenchReport& report);
// Human-readable table.
std::string to_text(const CommBenchReport& report);
// Calibration file: the alpha-beta figures under the ClusterSpec field names they calibrate.
OrderedJson calibration_json(const CommBenchReport& report);

}  // namespace piper::comm
