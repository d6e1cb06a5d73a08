#include "piper/comm/nccl/host_staged.h"

#include <numeric>
#include <vector>

#include "piper/comm/nccl/nccl_communicator.h"

namespace piper::comm {
namespace {

// A device allocation, freed (stream-ordered, without a device-wide synchronisation that could wait on another
// rank) when the operation using it has completed.
struct DeviceBlock {
  void* ptr = nullptr;
  ~DeviceBlock() {
    if (ptr != nullptr) (void)device_free_ordered(ptr);
  }
};

Result<std::shared_ptr<DeviceBlock>> device_block(const void* host, size_t bytes) {
  auto b = std::make_shared<DeviceBlock>();
  PIPER_ASSIGN_OR_RETURN(b->ptr, device_alloc_ordered(bytes));
  if (host != nullptr) PIPER_RETURN_IF_ERROR(copy_to_device(b->ptr, host, bytes));
  return b;
}

class StagedOp : public PendingOp {
 public:
  StagedOp(Communicator& device, Handle inner, std::vector<std::shared_ptr<DeviceBlock>> keep, void* host_out,
           const DeviceBlock* device_out, size_t out_bytes)
      : device_(device),
        inner_(std::move(inner)),
        keep_(std::move(keep)),
        host_out_(host_out),
        device_out_(device_out),
        out_bytes_(out_bytes) {}

  Result<bool> test() override {
    if (finished_) return true;
    PIPER_ASSIGN_OR_RETURN(bool done, device_.test(inner_));
    if (!done) return false;
    if (host_out_ != nullptr && out_bytes_ > 0) {
      PIPER_RETURN_IF_ERROR(copy_to_host(host_out_, device_out_->ptr, out_bytes_));
    }
    keep_.clear();
    finished_ = true;
    return true;
  }
  std::vector<int> missing_ranks() override { return {}; }
  bool tracks_arrivals() const override { return false; }

 private:
  Communicator& device_;
  Handle inner_;
  std::vector<std::shared_ptr<DeviceBlock>> keep_;
  void* host_out_;
  const DeviceBlock* device_out_;
  size_t out_bytes_;
  bool finished_ = false;
};

class HostStaged : public Communicator {
 public:
  explicit HostStaged(std::unique_ptr<Communicator> device)
      : Communicator(device->name(), device->world_ranks()), device_(std::move(device)) {}

  int rank() const override { return device_->rank(); }
  int size() const override { return device_->size(); }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }

  Result<std::unique_ptr<Communicator>> split(const std::vector<int>& ranks, const std::string& name) override {
    PIPER_ASSIGN_OR_RETURN(auto sub, device_->split(ranks, name));
    if (sub == nullptr) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(new HostStaged(std::move(sub)));
  }
  Result<std::unique_ptr<Communicator>> dup(const std::string& name) override {
    PIPER_ASSIGN_OR_RETURN(auto d, device_->dup(name));
    return std::unique_ptr<Communicator>(new HostStaged(std::move(d)));
  }

  Result<Handle> isend(const void* data, size_t bytes, int peer, int tag) override {
    if (bytes == 0) return device_->isend(nullptr, 0, peer, tag);
    PIPER_ASSIGN_OR_RETURN(auto in, device_block(data, bytes));
    PIPER_ASSIGN_OR_RETURN(Handle h, device_->isend(in->ptr, bytes, peer, tag));
    return wrap(CommOp::kSend, std::move(h), {in}, nullptr, nullptr, 0);
  }
  Result<Handle> irecv(void* data, size_t bytes, int peer, int tag) override {
    if (bytes == 0) return device_->irecv(nullptr, 0, peer, tag);
    PIPER_ASSIGN_OR_RETURN(auto out, device_block(nullptr, bytes));
    PIPER_ASSIGN_OR_RETURN(Handle h, device_->irecv(out->ptr, bytes, peer, tag));
    return wrap(CommOp::kRecv, std::move(h), {out}, data, out.get(), bytes);
  }
  Result<Handle> all_reduce_sum(const float* in, float* out, size_t count) override {
    const size_t bytes = count * sizeof(float);
    if (bytes == 0) return device_->all_reduce_sum(nullptr, nullptr, 0);
    PIPER_ASSIGN_OR_RETURN(auto din, device_block(in, bytes));
    PIPER_ASSIGN_OR_RETURN(auto dout, device_block(nullptr, bytes));
    PIPER_ASSIGN_OR_RETURN(
        Handle h, device_->all_reduce_sum(static_cast<const float*>(din->ptr), static_cast<float*>(dout->ptr), count));
    return wrap(CommOp::kAllReduce, std::move(h), {din, dout}, out, dout.get(), bytes);
  }
  Result<Handle> reduce_scatter_sum(const float* in, float* out, size_t count_per_rank) override {
    const size_t out_bytes = count_per_rank * sizeof(float), in_bytes = out_bytes * static_cast<size_t>(size());
    if (out_bytes == 0) return device_->reduce_scatter_sum(nullptr, nullptr, 0);
    PIPER_ASSIGN_OR_RETURN(auto din, device_block(in, in_bytes));
    PIPER_ASSIGN_OR_RETURN(auto dout, device_block(nullptr, out_bytes));
    PIPER_ASSIGN_OR_RETURN(Handle h, device_->reduce_scatter_sum(static_cast<const float*>(din->ptr),
                                                                 static_cast<float*>(dout->ptr), count_per_rank));
    return wrap(CommOp::kReduceScatter, std::move(h), {din, dout}, out, dout.get(), out_bytes);
  }
  Result<Handle> all_gather(const void* in, void* out, size_t bytes_per_rank) override {
    const size_t out_bytes = bytes_per_rank * static_cast<size_t>(size());
    if (bytes_per_rank == 0) return device_->all_gather(nullptr, nullptr, 0);
    PIPER_ASSIGN_OR_RETURN(auto din, device_block(in, bytes_per_rank));
    PIPER_ASSIGN_OR_RETURN(auto dout, device_block(nullptr, out_bytes));
    PIPER_ASSIGN_OR_RETURN(Handle h, device_->all_gather(din->ptr, dout->ptr, bytes_per_rank));
    return wrap(CommOp::kAllGather, std::move(h), {din, dout}, out, dout.get(), out_bytes);
  }
  Result<Handle> all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                              std::span<const size_t> recv_bytes) override {
    const size_t sent = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
    const size_t received = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
    std::shared_ptr<DeviceBlock> din, dout;
    if (sent > 0) {
      PIPER_ASSIGN_OR_RETURN(din, device_block(send, sent));
    }
    if (received > 0) {
      PIPER_ASSIGN_OR_RETURN(dout, device_block(nullptr, received));
    }
    PIPER_ASSIGN_OR_RETURN(
        Handle h, device_->all_to_all_v(din ? din->ptr : nullptr, send_bytes, dout ? dout->ptr : nullptr, recv_bytes));
    return wrap(CommOp::kAllToAllV, std::move(h), {din, dout}, received > 0 ? recv : nullptr, dout.get(), received);
  }
  Result<Handle> barrier() override {
    PIPER_ASSIGN_OR_RETURN(Handle h, device_->barrier());
    return wrap(CommOp::kBarrier, std::move(h), {}, nullptr, nullptr, 0);
  }

 private:
  Handle wrap(CommOp op, Handle inner, std::vector<std::shared_ptr<DeviceBlock>> keep, void* host_out,
              const DeviceBlock* device_out, size_t bytes) {
    return Handle(op, name(),
                  std::make_unique<StagedOp>(*device_, std::move(inner), std::move(keep), host_out, device_out, bytes));
  }
  std::unique_ptr<Communicator> device_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> host_staged(std::unique_ptr<Communicator> device) {
  if (device == nullptr) return invalid_argument("host_staged: no device communicator");
  if (device->memory_kind() != MemoryKind::kDevice) {
    return invalid_argument("host_staged: '" + device->name() + "' is already a host-memory communicator");
  }
  return std::unique_ptr<Communicator>(new HostStaged(std::move(device)));
}

}  // namespace piper::comm
