// The MPI heartbeat (internal to comm/mpi; the contract is in comm/heartbeat.h).
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "piper/comm/heartbeat.h"

namespace piper::comm {

// Collective over `comm` (it is duplicated): starts this rank's heartbeat thread. world_ranks[r] is the world
// rank of rank r of `comm`, used in the verdict.
Result<std::unique_ptr<Heartbeat>> start_mpi_heartbeat(MPI_Comm comm, std::vector<int> world_ranks,
                                                       const HeartbeatOptions& options);

}  // namespace piper::comm
