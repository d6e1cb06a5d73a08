// A host-memory Communicator over a device-memory one (the NCCL backend): every operation copies its host
// input into a device buffer (cudaMemcpy, complete before the device operation is posted), runs the device
// communicator's operation, and copies the output back to host memory when test() sees it complete.
//
// Buffers come from the stream-ordered allocator (device_alloc_ordered): a plain cudaFree would synchronise the
// device and could wait on an NCCL kernel that waits for a peer blocked the same way.
// What it is for: the algorithms that pack rows on the host (HALO, the pairwise all-to-all) run over NCCL's
// transport (NVLink within a node, the NICs across nodes) unchanged, on host buffers. It costs two copies per
// operation and a device allocation per buffer; a device-resident HALO with device staging buffers would avoid
// them (not built: docs/gpu.md). Timeouts still come from wait(); missing_ranks() cannot see through the
// staging, so a timeout names the operation and group but not the absent ranks.
// Needs a GPU at run time; without the NCCL backend every operation fails naming the reason (the device
// memory helpers of nccl_communicator.h).
#pragma once

#include <memory>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

// Takes ownership of `device` (memory_kind() == kDevice); the result has memory_kind() == kHost, the same
// ranks and name. InvalidArgument when `device` is null or already host memory.
Result<std::unique_ptr<Communicator>> host_staged(std::unique_ptr<Communicator> device);

}  // namespace piper::comm
