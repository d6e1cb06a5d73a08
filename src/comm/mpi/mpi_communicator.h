// The MPI backend (OpenMPI, MPI_THREAD_MULTIPLE): CPU ranks exchanging host memory.
//
// mpi_init() initialises MPI once per process (idempotent), checks that the library gives
// MPI_THREAD_MULTIPLE, sets the rank printed by logs and checks, and registers a fatal hook so that a failed
// PIPER_CHECK calls MPI_Abort and no other rank hangs. mpi_world() returns a communicator over all ranks
// (a duplicate of MPI_COMM_WORLD: its traffic never matches anyone else's); call it as often as needed, all
// ranks in the same order. mpi_finalize() must be called by every rank after its communicators are destroyed.
//
// Arrival tracking: every collective also sends an 8-byte "arrived" note to each peer over a side
// communicator, so a timed-out wait can name the ranks that never posted the operation. It costs 2(P-1)
// tiny messages per collective; MpiOptions::track_arrivals = false turns it off (benchmarks of the raw MPI
// collective do so). Point-to-point operations need no notes: the missing rank is the peer.
// This header names no MPI type.
#pragma once

#include <memory>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

// Collectives across nodes: all_gather and reduce_scatter_sum of a group whose ranks sit on more than one node
// (MPI_COMM_TYPE_SHARED) run as rings over point-to-point messages (mpi_ring.h: Open MPI 4.1's nonblocking
// all-gather and reduce-scatter put up to P/2 times the ring's bytes on the link between nodes); inside one node
// and for the other collectives, Open MPI's own. PIPER_MPI_RING=across-nodes (default) | always | never
// overrides the default for every communicator of the process (`always`: measurements on one node); options that
// name kAlways or kNever keep it. Every rank of a communicator must decide alike (refused otherwise, naming both).
enum class RingCollectives { kAcrossNodes, kAlways, kNever };

struct MpiOptions {
  bool track_arrivals = true;
  RingCollectives ring = RingCollectives::kAcrossNodes;
};

Status mpi_init(int* argc, char*** argv);
bool mpi_initialized();
// Collective over all processes. Reads PIPER_MPI_RING (an unknown value is an error naming the choices).
Result<std::unique_ptr<Communicator>> mpi_world(const MpiOptions& options = {});
Status mpi_finalize();
// Aborts every rank of the job (MPI_Abort on the world); used by the fatal hook.
[[noreturn]] void mpi_abort_job(int exit_code);
// Wall-clock time in seconds (MPI_Wtime), for benchmarks.
double mpi_wtime();

}  // namespace piper::comm
