// Flat pairwise all-to-all-v over point-to-point messages: the baseline every other algorithm must equal byte
// for byte. Rank r posts its sends to r+1, r+2, ... (mod P), so that no peer is hit by everyone at once, then
// its receives; its own block is copied locally; zero-byte blocks post no message.
//
// Why sends first (as OpenMPI's libnbc alltoallv does): over OpenMPI's TCP BTL, which advertises `put`
// (btl_tcp_flags), a message above the eager limit (64 KiB) is a rendezvous the *receiver* drives: the
// sender's RNDV header goes out at isend, and the receiver answers with a PUT request on the socket of the
// reverse direction, after which the sender streams the data. With receives posted first, a rank that joins late
// answers the early rank's RNDV (PUT request) before its own RNDV is on the wire; the early rank then starts streaming
// and its PUT request for the late rank's message queues behind its own megabytes of data, so the two directions of a
// pair run one after the other (measured on the emulated 1 Gbit/s link: 4 MiB each way in 66 ms instead of
// 33 ms; with `put` removed from btl_tcp_flags the order no longer matters, docs/comm.md). Posting the sends first puts
// every rank's RNDV headers on the wire before any PUT request, so both directions stream at once.
#pragma once

#include <cstddef>
#include <span>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

// Same contract as Communicator::all_to_all_v (host memory), blocking with a timeout.
Status pairwise_all_to_all_v(Communicator& comm, const void* send, std::span<const size_t> send_bytes, void* recv,
                             std::span<const size_t> recv_bytes, double timeout_s);

// Checks counts (size() entries each) and returns the prefix-sum displacements of `bytes`.
Result<std::vector<size_t>> displacements(const Communicator& comm, std::span<const size_t> bytes, const char* what);

}  // namespace piper::comm
