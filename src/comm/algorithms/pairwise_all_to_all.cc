#include "piper/comm/algorithms/pairwise_all_to_all.h"

#include <cstring>
#include <vector>

#include "piper/base/fault.h"

namespace piper::comm {

Result<std::vector<size_t>> displacements(const Communicator& comm, std::span<const size_t> bytes, const char* what) {
  if (static_cast<int>(bytes.size()) != comm.size()) {
    return invalid_argument(std::string(what) + ": expected " + std::to_string(comm.size()) + " counts for group '" +
                            comm.name() + "', got " + std::to_string(bytes.size()));
  }
  std::vector<size_t> displ(bytes.size() + 1, 0);
  for (size_t i = 0; i < bytes.size(); ++i) displ[i + 1] = displ[i] + bytes[i];
  return displ;
}

Status pairwise_all_to_all_v(Communicator& comm, const void* send, std::span<const size_t> send_bytes, void* recv,
                             std::span<const size_t> recv_bytes, double timeout_s) {
  constexpr int kTag = 11;
  if (comm.memory_kind() == MemoryKind::kDevice) {
    return unimplemented(
        "pairwise all_to_all_v copies its own block with memcpy (host memory); on the device "
        "communicator '" +
        comm.name() +
        "' use its all_to_all_v (NCCL), or wrap it with "
        "host_staged() (comm/nccl/host_staged.h)");
  }
  PIPER_ASSIGN_OR_RETURN(auto sdispl, displacements(comm, send_bytes, "pairwise all_to_all_v send"));
  PIPER_ASSIGN_OR_RETURN(auto rdispl, displacements(comm, recv_bytes, "pairwise all_to_all_v recv"));
  const int me = comm.rank(), n = comm.size();
  if (send_bytes[me] != recv_bytes[me]) {
    return invalid_argument("pairwise all_to_all_v: rank " + std::to_string(me) + " sends itself " +
                            std::to_string(send_bytes[me]) + " bytes but expects " + std::to_string(recv_bytes[me]));
  }
  const auto* src = static_cast<const uint8_t*>(send);
  auto* dst = static_cast<uint8_t*>(recv);
  // Sends before receives, as OpenMPI's libnbc alltoallv: see the header for why.
  std::vector<Handle> handles;
  handles.reserve(2 * n);
  for (int i = 1; i < n; ++i) {
    int peer = (me + i) % n;
    PIPER_ASSIGN_OR_RETURN(Handle h, comm.isend(src + sdispl[peer], send_bytes[peer], peer, kTag));
    handles.push_back(std::move(h));
  }
  fault_point("ep_a2a");
  for (int i = 1; i < n; ++i) {
    int peer = (me + n - i) % n;
    PIPER_ASSIGN_OR_RETURN(Handle h, comm.irecv(dst + rdispl[peer], recv_bytes[peer], peer, kTag));
    handles.push_back(std::move(h));
  }
  if (send_bytes[me] > 0) std::memcpy(dst + rdispl[me], src + sdispl[me], send_bytes[me]);
  return comm.wait_all(handles, timeout_s);
}

}  // namespace piper::comm
