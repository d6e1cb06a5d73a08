// The NCCL backend: GPU ranks exchanging device memory (memory_kind() == kDevice).
//
// nccl_create() is collective over a host `bootstrap` communicator (usually the MPI world or a sub-group of
// it): rank 0 makes the NCCL unique id, every rank receives it through an all-gather, selects its GPU
// (options.device, or bootstrap rank modulo the visible GPUs) and joins with ncclCommInitRank. Each
// communicator owns one non-blocking CUDA stream; an operation is enqueued on it and its Handle completes when
// a CUDA event recorded after it has fired. all_to_all_v is a group of ncclSend/ncclRecv pairs that skips
// zero-byte blocks. split()/dup() use ncclCommSplit (collective over the parent).
//
// Arrival tracking: every collective also exchanges 8-byte host notes over a duplicate of the bootstrap
// communicator, so a wait that times out names the ranks that never posted the operation, as with MPI.
// Available only when Piper was built with the CUDA toolkit and NCCL (nccl_compiled_in()); needs a GPU at run
// time (cuda_device_count() says how many). This header names no NCCL or CUDA type.
#pragma once

#include <memory>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"

namespace piper::comm {

struct NcclOptions {
  int device = -1;  // -1: bootstrap rank modulo the number of visible GPUs
};

bool nccl_compiled_in();
// Number of visible CUDA devices; an error (naming the CUDA error) when there is no driver or no GPU.
Result<int> cuda_device_count();
Result<std::unique_ptr<Communicator>> nccl_create(Communicator& bootstrap, const NcclOptions& options = {});

// Device memory helpers for tests and benchmarks (cudaMalloc/cudaMemcpy through the checking macros).
Result<void*> device_alloc(size_t bytes);
Status device_free(void* ptr);
Status copy_to_device(void* dst, const void* src, size_t bytes);
Status copy_to_host(void* dst, const void* src, size_t bytes);
// Stream-ordered allocation on the legacy default stream (cudaMallocAsync/cudaFreeAsync): unlike cudaFree, the
// free does not synchronise the device, so it cannot wait on an NCCL kernel that waits on a peer (host_staged.h).
Result<void*> device_alloc_ordered(size_t bytes);
Status device_free_ordered(void* ptr);

}  // namespace piper::comm
