#include "piper/comm/mpi/mpi_ring.h"

#include <cstring>

#include "piper/base/log.h"
#include "piper/comm/mpi/mpi_check.h"

namespace piper::comm {
namespace {
// MPI guarantees tags up to 32767; each ring in flight takes `size` of them.
constexpr int kMaxTag = 32767;

int mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

Result<std::unique_ptr<MpiRingOp>> MpiRingOp::start(RingKind kind, MPI_Comm comm, uint64_t seq, const void* in,
                                                    void* out, size_t block, std::unique_ptr<MpiPendingOp> notes) {
  std::unique_ptr<MpiRingOp> op(new MpiRingOp());
  op->kind_ = kind;
  op->comm_ = comm;
  op->seq_ = seq;
  op->block_ = block;
  op->out_ = static_cast<uint8_t*>(out);
  op->notes_ = std::move(notes);
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &op->rank_));
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &op->size_));
  if (op->size_ > kMaxTag) {
    return invalid_argument("comm/mpi: a ring collective over " + std::to_string(op->size_) +
                            " ranks needs more tags than MPI guarantees (32767); use fewer ranks per group");
  }
  const size_t n = static_cast<size_t>(op->size_);
  if (kind == RingKind::kAllGather) {
    std::memmove(op->block_at(op->rank_), in, block);
  } else {
    op->acc_.assign(static_cast<const uint8_t*>(in), static_cast<const uint8_t*>(in) + n * block);
    op->incoming_.resize(block);
  }
  if (op->size_ > 1) PIPER_RETURN_IF_ERROR(op->post_step());
  return op;
}

MpiRingOp::~MpiRingOp() {
  if (complete_) return;
  // Abandoned (its wait timed out): the requests may still write into the buffers, so both are left to
  // MPI_Finalize, as MpiPendingOp leaves an abandoned collective's.
  PIPER_LOG(WARN) << "comm: destroying a ring collective that has not completed; its requests and buffers are leaked";
  new std::vector<uint8_t>(std::move(acc_));
  new std::vector<uint8_t>(std::move(incoming_));
}

int MpiRingOp::tag(int step) const {
  const uint64_t rings = static_cast<uint64_t>(kMaxTag / size_);
  return static_cast<int>(seq_ % rings) * size_ + step;
}

uint8_t* MpiRingOp::block_at(int index) {
  uint8_t* base = kind_ == RingKind::kAllGather ? out_ : acc_.data();
  return base + static_cast<size_t>(index) * block_;
}

Status MpiRingOp::post_step() {
  const int right = mod(rank_ + 1, size_), left = mod(rank_ - 1, size_);
  const int send_block = kind_ == RingKind::kAllGather ? mod(rank_ - step_, size_) : mod(rank_ - step_ - 1, size_);
  void* recv_into = kind_ == RingKind::kAllGather ? block_at(mod(rank_ - step_ - 1, size_)) : incoming_.data();
  const int count = static_cast<int>(block_);
  PIPER_MPI_RETURN_IF_ERROR(MPI_Irecv(recv_into, count, MPI_BYTE, left, tag(step_), comm_, &recv_));
  MPI_Request s = MPI_REQUEST_NULL;
  PIPER_MPI_RETURN_IF_ERROR(MPI_Isend(block_at(send_block), count, MPI_BYTE, right, tag(step_), comm_, &s));
  sends_.push_back(s);
  return ok_status();
}

Status MpiRingOp::finish_receive() {
  if (kind_ != RingKind::kReduceScatterSum) return ok_status();
  auto* dst = reinterpret_cast<float*>(block_at(mod(rank_ - step_ - 2, size_)));
  const auto* src = reinterpret_cast<const float*>(incoming_.data());
  const size_t n = block_ / sizeof(float);
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  return ok_status();
}

Result<bool> MpiRingOp::test() {
  if (complete_) return true;
  while (step_ < size_ - 1) {
    int flag = 0;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Test(&recv_, &flag, MPI_STATUS_IGNORE));
    if (!flag) break;
    PIPER_RETURN_IF_ERROR(finish_receive());
    if (++step_ < size_ - 1) PIPER_RETURN_IF_ERROR(post_step());
  }
  for (MPI_Request& s : sends_) {
    int flag = 0;
    if (s != MPI_REQUEST_NULL) PIPER_MPI_RETURN_IF_ERROR(MPI_Test(&s, &flag, MPI_STATUS_IGNORE));
  }
  bool notes_done = true;
  if (notes_ != nullptr) {
    PIPER_ASSIGN_OR_RETURN(notes_done, notes_->test());
  }
  if (step_ < size_ - 1 || !notes_done) return false;
  for (MPI_Request s : sends_) {
    if (s != MPI_REQUEST_NULL) return false;
  }
  if (kind_ == RingKind::kReduceScatterSum) std::memcpy(out_, block_at(rank_), block_);
  complete_ = true;
  return true;
}

std::vector<int> MpiRingOp::missing_ranks() {
  if (notes_ != nullptr && notes_->tracks_arrivals()) {
    std::vector<int> missing = notes_->missing_ranks();
    if (!missing.empty()) return missing;
  }
  // Every rank came (or no notes were sent): the neighbour this rank waits on.
  if (step_ < size_ - 1) return {mod(rank_ - 1, size_)};
  return {mod(rank_ + 1, size_)};
}

}  // namespace piper::comm
