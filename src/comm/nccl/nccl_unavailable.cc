// Built when the CUDA toolkit or NCCL is missing: every entry point says how to get the NCCL backend.
#include "piper/comm/nccl/nccl_communicator.h"

namespace piper::comm {
namespace {
Status missing() {
  return unimplemented("comm/nccl: Piper was built without the CUDA toolkit or NCCL (nccl.h not found); install "
                       "the CUDA toolkit with NCCL and reconfigure to use GPU ranks");
}
}  // namespace

bool nccl_compiled_in() { return false; }
Result<int> cuda_device_count() { return missing(); }
Result<std::unique_ptr<Communicator>> nccl_create(Communicator&, const NcclOptions&) { return missing(); }
Result<void*> device_alloc(size_t) { return missing(); }
Status device_free(void*) { return missing(); }
Status copy_to_device(void*, const void*, size_t) { return missing(); }
Status copy_to_host(void*, const void*, size_t) { return missing(); }
Result<void*> device_alloc_ordered(size_t) { return missing(); }
Status device_free_ordered(void*) { return missing(); }

}  // namespace piper::comm
