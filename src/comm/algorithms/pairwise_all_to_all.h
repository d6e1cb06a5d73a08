// Flat pairwise all-to-all-v over point-to-point messages: the baseline every other algorithm must equal byte
// for byte. Rank r posts all receives, then sends to r+1, r+2, ... (mod P) so that no peer is hit by everyone
// at once; its own block is copied locally; zero-byte blocks post no message.
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
