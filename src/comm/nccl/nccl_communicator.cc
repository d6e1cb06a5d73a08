#include "piper/comm/nccl/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "piper/base/check.h"
#include "piper/base/log.h"
#include "piper/comm/algorithms/pairwise_all_to_all.h"

// The checking macros of this backend: every CUDA and NCCL call keeps its expression text.
#define PIPER_CUDA_RETURN_IF_ERROR(expr)                                                                    \
  do {                                                                                                      \
    cudaError_t piper_cuda_rc_ = (expr);                                                                    \
    if (piper_cuda_rc_ != cudaSuccess) [[unlikely]]                                                         \
      return ::piper::internal_error(std::string("CUDA call failed at " __FILE__ ":") +                     \
                                     std::to_string(__LINE__) + ": " #expr " -> " +                         \
                                     cudaGetErrorString(piper_cuda_rc_));                                   \
  } while (0)
#define PIPER_NCCL_RETURN_IF_ERROR(expr)                                                                    \
  do {                                                                                                      \
    ncclResult_t piper_nccl_rc_ = (expr);                                                                   \
    if (piper_nccl_rc_ != ncclSuccess) [[unlikely]]                                                         \
      return ::piper::internal_error(std::string("NCCL call failed at " __FILE__ ":") +                     \
                                     std::to_string(__LINE__) + ": " #expr " -> " +                         \
                                     ncclGetErrorString(piper_nccl_rc_));                                   \
  } while (0)

namespace piper::comm {
namespace {

constexpr int kArrivalTag = 8;

// One NCCL operation: a CUDA event recorded after it, plus the host arrival notes of a collective.
class NcclPendingOp : public PendingOp {
 public:
  NcclPendingOp(ncclComm_t comm, int peer) : comm_(comm), peer_(peer) {}
  ~NcclPendingOp() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }

  Status record(cudaStream_t stream) {
    PIPER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
    return ok_status();
  }

  Status post_notes(Communicator& host) {
    host_ = &host;
    notes_in_.assign(host.size(), 0);
    for (int p = 0; p < host.size(); ++p) {
      if (p == host.rank()) continue;
      PIPER_ASSIGN_OR_RETURN(Handle h, host.irecv(&notes_in_[p], sizeof(uint64_t), p, kArrivalTag));
      note_recv_.push_back(std::move(h));
      note_peer_.push_back(p);
    }
    for (int p = 0; p < host.size(); ++p) {
      if (p == host.rank()) continue;
      PIPER_ASSIGN_OR_RETURN(Handle h, host.isend(&note_out_, sizeof(uint64_t), p, kArrivalTag));
      note_send_.push_back(std::move(h));
    }
    return ok_status();
  }

  Result<bool> test() override {
    bool notes_done = true;
    if (host_ != nullptr) {
      for (Handle& h : note_recv_) {
        PIPER_ASSIGN_OR_RETURN(bool d, host_->test(h));
        notes_done = notes_done && d;
      }
      for (Handle& h : note_send_) {
        PIPER_ASSIGN_OR_RETURN(bool d, host_->test(h));
        notes_done = notes_done && d;
      }
    }
    cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      PIPER_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        return internal_error(std::string("NCCL asynchronous error: ") + ncclGetErrorString(async));
      }
      return false;
    }
    PIPER_CUDA_RETURN_IF_ERROR(rc);
    return notes_done;
  }

  std::vector<int> missing_ranks() override {
    std::vector<int> missing;
    for (size_t i = 0; i < note_recv_.size(); ++i) {
      if (!note_recv_[i].done()) missing.push_back(note_peer_[i]);
    }
    if (host_ == nullptr && peer_ >= 0) missing.push_back(peer_);
    return missing;
  }

 private:
  ncclComm_t comm_;
  int peer_;
  cudaEvent_t event_ = nullptr;
  Communicator* host_ = nullptr;
  std::vector<uint64_t> notes_in_;
  uint64_t note_out_ = 0x4E43434CULL;  // "NCCL"
  std::vector<Handle> note_recv_, note_send_;
  std::vector<int> note_peer_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::string name, std::vector<int> world_ranks, ncclComm_t comm, cudaStream_t stream,
                   std::unique_ptr<Communicator> host, int device)
      : Communicator(std::move(name), std::move(world_ranks)), comm_(comm), stream_(stream), host_(std::move(host)),
        device_(device) {}
  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  static Result<std::unique_ptr<Communicator>> make(std::string name, std::vector<int> world_ranks, ncclComm_t comm,
                                                    std::unique_ptr<Communicator> host, int device) {
    cudaStream_t stream = nullptr;
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    PIPER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(std::move(name), std::move(world_ranks), comm, stream, std::move(host), device));
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  MemoryKind memory_kind() const override { return MemoryKind::kDevice; }

  Result<std::unique_ptr<Communicator>> split(const std::vector<int>& ranks, const std::string& name) override {
    // The host split validates the list and gives the new group's arrival channel.
    PIPER_ASSIGN_OR_RETURN(auto host, host_->split(ranks, name + "/host"));
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    if (!ranks.empty()) {
      color = *std::min_element(ranks.begin(), ranks.end());
      key = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank()) - ranks.begin());
    }
    ncclComm_t sub = nullptr;
    PIPER_NCCL_RETURN_IF_ERROR(ncclCommSplit(comm_, color, key, &sub, nullptr));
    if (ranks.empty()) return std::unique_ptr<Communicator>();
    std::vector<int> world;
    for (int r : ranks) world.push_back(world_ranks()[r]);
    return make(name, std::move(world), sub, std::move(host), device_);
  }

  Result<std::unique_ptr<Communicator>> dup(const std::string& name) override {
    PIPER_ASSIGN_OR_RETURN(auto host, host_->dup(name + "/host"));
    ncclComm_t copy = nullptr;
    PIPER_NCCL_RETURN_IF_ERROR(ncclCommSplit(comm_, 0, rank(), &copy, nullptr));
    return make(name, world_ranks(), copy, std::move(host), device_);
  }

  Result<Handle> isend(const void* data, size_t bytes, int peer, int tag) override {
    PIPER_RETURN_IF_ERROR(check_peer(peer, "isend"));
    if (bytes == 0) return Handle::completed(CommOp::kSend, name());
    // NCCL matches point-to-point operations by order per peer; the tag is not used.
    PIPER_NCCL_RETURN_IF_ERROR(ncclSend(data, bytes, ncclUint8, peer, comm_, stream_));
    return finish(CommOp::kSend, peer, false);
  }

  Result<Handle> irecv(void* data, size_t bytes, int peer, int tag) override {
    PIPER_RETURN_IF_ERROR(check_peer(peer, "irecv"));
    if (bytes == 0) return Handle::completed(CommOp::kRecv, name());
    PIPER_NCCL_RETURN_IF_ERROR(ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_));
    return finish(CommOp::kRecv, peer, false);
  }

  Result<Handle> all_reduce_sum(const float* in, float* out, size_t count) override {
    if (count == 0) return Handle::completed(CommOp::kAllReduce, name());
    PIPER_NCCL_RETURN_IF_ERROR(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm_, stream_));
    return finish(CommOp::kAllReduce, -1, true);
  }

  Result<Handle> reduce_scatter_sum(const float* in, float* out, size_t count_per_rank) override {
    if (count_per_rank == 0) return Handle::completed(CommOp::kReduceScatter, name());
    PIPER_NCCL_RETURN_IF_ERROR(ncclReduceScatter(in, out, count_per_rank, ncclFloat32, ncclSum, comm_, stream_));
    return finish(CommOp::kReduceScatter, -1, true);
  }

  Result<Handle> all_gather(const void* in, void* out, size_t bytes_per_rank) override {
    if (bytes_per_rank == 0) return Handle::completed(CommOp::kAllGather, name());
    PIPER_NCCL_RETURN_IF_ERROR(ncclAllGather(in, out, bytes_per_rank, ncclUint8, comm_, stream_));
    return finish(CommOp::kAllGather, -1, true);
  }

  Result<Handle> all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                              std::span<const size_t> recv_bytes) override {
    PIPER_ASSIGN_OR_RETURN(auto sdispl, displacements(*this, send_bytes, "nccl all_to_all_v send"));
    PIPER_ASSIGN_OR_RETURN(auto rdispl, displacements(*this, recv_bytes, "nccl all_to_all_v recv"));
    const auto* src = static_cast<const uint8_t*>(send);
    auto* dst = static_cast<uint8_t*>(recv);
    PIPER_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    for (int p = 0; p < size(); ++p) {
      // Zero-byte blocks post nothing (the zero-token hang of some backends).
      if (send_bytes[p] > 0) {
        ncclResult_t rc = ncclSend(src + sdispl[p], send_bytes[p], ncclUint8, p, comm_, stream_);
        if (rc != ncclSuccess) {
          ncclGroupEnd();
          PIPER_NCCL_RETURN_IF_ERROR(rc);
        }
      }
      if (recv_bytes[p] > 0) {
        ncclResult_t rc = ncclRecv(dst + rdispl[p], recv_bytes[p], ncclUint8, p, comm_, stream_);
        if (rc != ncclSuccess) {
          ncclGroupEnd();
          PIPER_NCCL_RETURN_IF_ERROR(rc);
        }
      }
    }
    PIPER_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    return finish(CommOp::kAllToAllV, -1, true);
  }

  Result<Handle> barrier() override {
    if (scratch_ == nullptr) PIPER_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, sizeof(float)));
    PIPER_NCCL_RETURN_IF_ERROR(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    return finish(CommOp::kBarrier, -1, true);
  }

 private:
  Status check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size()) {
      return invalid_argument(describe(what) + ": peer " + std::to_string(peer) + " is out of range [0, " +
                              std::to_string(size()) + ")");
    }
    return ok_status();
  }

  Result<Handle> finish(CommOp op, int peer, bool collective) {
    auto pending = std::make_unique<NcclPendingOp>(comm_, peer);
    if (collective && size() > 1) PIPER_RETURN_IF_ERROR(pending->post_notes(*host_));
    PIPER_RETURN_IF_ERROR(pending->record(stream_));
    return Handle(op, name(), std::move(pending));
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  std::unique_ptr<Communicator> host_;
  int device_;
  float* scratch_ = nullptr;
};

}  // namespace

bool nccl_compiled_in() { return true; }

Result<int> cuda_device_count() {
  int count = 0;
  PIPER_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (count == 0) return unavailable("comm/nccl: no CUDA device is visible");
  return count;
}

Result<std::unique_ptr<Communicator>> nccl_create(Communicator& bootstrap, const NcclOptions& options) {
  if (bootstrap.memory_kind() != MemoryKind::kHost) {
    return invalid_argument("comm/nccl: the bootstrap communicator must be a host (MPI) communicator");
  }
  PIPER_ASSIGN_OR_RETURN(int devices, cuda_device_count());
  int device = options.device >= 0 ? options.device : bootstrap.rank() % devices;
  if (device >= devices) {
    return invalid_argument("comm/nccl: device " + std::to_string(device) + " requested but only " +
                            std::to_string(devices) + " are visible");
  }
  PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (bootstrap.rank() == 0) PIPER_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
  std::vector<ncclUniqueId> all(bootstrap.size());
  PIPER_ASSIGN_OR_RETURN(Handle h, bootstrap.all_gather(&id, all.data(), sizeof(id)));
  PIPER_RETURN_IF_ERROR(bootstrap.wait(h, default_timeout_s()));
  ncclComm_t comm = nullptr;
  PIPER_NCCL_RETURN_IF_ERROR(ncclCommInitRank(&comm, bootstrap.size(), all[0], bootstrap.rank()));
  PIPER_ASSIGN_OR_RETURN(auto host, bootstrap.dup(bootstrap.name() + "/nccl-host"));
  return NcclCommunicator::make(bootstrap.name() + "/nccl", bootstrap.world_ranks(), comm, std::move(host), device);
}

Result<void*> device_alloc(size_t bytes) {
  void* ptr = nullptr;
  PIPER_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)));
  return ptr;
}

Status device_free(void* ptr) {
  PIPER_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
  return ok_status();
}

Result<void*> device_alloc_ordered(size_t bytes) {
  void* ptr = nullptr;
  PIPER_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&ptr, std::max<size_t>(bytes, 1), cudaStreamLegacy));
  return ptr;
}

Status device_free_ordered(void* ptr) {
  PIPER_CUDA_RETURN_IF_ERROR(cudaFreeAsync(ptr, cudaStreamLegacy));
  return ok_status();
}

Status copy_to_device(void* dst, const void* src, size_t bytes) {
  PIPER_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  return ok_status();
}

Status copy_to_host(void* dst, const void* src, size_t bytes) {
  PIPER_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return ok_status();
}

}  // namespace piper::comm
