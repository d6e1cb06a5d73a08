#include "piper/comm/mpi/mpi_ring.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "piper/base/log.h"
#include "piper/comm/mpi/mpi_check.h"

namespace piper::comm {
namespace {
// MPI guarantees tags up to 32767; each ring in flight takes `size` of them.
constexpr int kMaxTag = 32767;

int mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

void RingProgress::add(MpiRingOp* op) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_.push_back(op);
}

void RingProgress::remove(MpiRingOp* op) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_.erase(std::remove(ops_.begin(), ops_.end(), op), ops_.end());
}

Result<bool> RingProgress::advance_all(MpiRingOp* caller) {
  std::lock_guard<std::mutex> lock(mu_);
  for (MpiRingOp* op : ops_) {
    if (op->error_.ok()) op->error_ = op->advance();
  }
  if (!caller->error_.ok()) return caller->error_;
  return caller->messages_done();
}

Result<std::unique_ptr<MpiRingOp>> MpiRingOp::start(RingKind kind, MPI_Comm comm, uint64_t seq, const void* in,
                                                    void* out, size_t block, std::unique_ptr<MpiPendingOp> notes,
                                                    std::shared_ptr<RingProgress> progress) {
  std::unique_ptr<MpiRingOp> op(new MpiRingOp());
  op->kind_ = kind;
  op->comm_ = comm;
  op->seq_ = seq;
  op->block_ = block;
  op->in_ = static_cast<const uint8_t*>(in);
  op->out_ = static_cast<uint8_t*>(out);
  op->notes_ = std::move(notes);
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &op->rank_));
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &op->size_));
  if (op->size_ > kMaxTag || block > static_cast<size_t>(INT_MAX)) {
    return invalid_argument("comm/mpi: a ring collective of " + std::to_string(block) + " bytes per rank over " +
                            std::to_string(op->size_) +
                            " ranks exceeds MPI's limits (2^31-1 bytes a message, 32767 tags); split the "
                            "operation into smaller pieces or use fewer ranks per group");
  }
  if (kind == RingKind::kAllGather) {
    std::memmove(op->out_block(op->rank_), in, block);
  } else {
    op->incoming_.resize(block);
    op->partial_[0].resize(block);
    op->partial_[1].resize(block);
    if (op->size_ == 1) std::memmove(op->out_, in, block);
  }
  if (op->size_ > 1) PIPER_RETURN_IF_ERROR(op->post_step());
  op->progress_ = std::move(progress);
  op->progress_->add(op.get());
  return op;
}

MpiRingOp::~MpiRingOp() {
  if (progress_ != nullptr) progress_->remove(this);
  if (complete_) return;
  // Abandoned (its wait timed out): the requests may still write into the buffers, so both are left to
  // MPI_Finalize, as MpiPendingOp leaves an abandoned collective's.
  PIPER_LOG(WARN) << "comm: destroying a ring collective that has not completed; its requests and buffers are leaked";
  new std::vector<uint8_t>(std::move(incoming_));
  new std::vector<uint8_t>(std::move(partial_[0]));
  new std::vector<uint8_t>(std::move(partial_[1]));
}

int MpiRingOp::tag(int step) const {
  const uint64_t rings = static_cast<uint64_t>(kMaxTag / size_);
  return static_cast<int>(seq_ % rings) * size_ + step;
}

const uint8_t* MpiRingOp::send_data() const {
  if (kind_ == RingKind::kAllGather) return out_ + static_cast<size_t>(mod(rank_ - step_, size_)) * block_;
  // Reduce-scatter: this rank's own part of block r - 1 first, then the sums made at the previous step.
  return step_ == 0 ? in_block(mod(rank_ - 1, size_)) : partial_[(step_ - 1) % 2].data();
}

Status MpiRingOp::post_step() {
  const int right = mod(rank_ + 1, size_), left = mod(rank_ - 1, size_);
  void* recv_into = kind_ == RingKind::kAllGather ? out_block(mod(rank_ - step_ - 1, size_)) : incoming_.data();
  const int count = static_cast<int>(block_);
  PIPER_MPI_RETURN_IF_ERROR(MPI_Irecv(recv_into, count, MPI_BYTE, left, tag(step_), comm_, &recv_));
  MPI_Request s = MPI_REQUEST_NULL;
  PIPER_MPI_RETURN_IF_ERROR(MPI_Isend(send_data(), count, MPI_BYTE, right, tag(step_), comm_, &s));
  sends_.push_back(s);
  return ok_status();
}

Result<bool> MpiRingOp::consume_receive() {
  if (kind_ != RingKind::kReduceScatterSum) return true;
  const bool last = step_ == size_ - 2;
  // partial_[step_ % 2] last went out with step step_ - 1's send.
  if (!last && step_ >= 2 && sends_[static_cast<size_t>(step_ - 1)] != MPI_REQUEST_NULL) return false;
  auto* dst = reinterpret_cast<float*>(last ? out_ : partial_[step_ % 2].data());
  const auto* mine = reinterpret_cast<const float*>(in_block(mod(rank_ - step_ - 2, size_)));
  const auto* theirs = reinterpret_cast<const float*>(incoming_.data());
  const size_t n = block_ / sizeof(float);
  for (size_t i = 0; i < n; ++i) dst[i] = mine[i] + theirs[i];
  return true;
}

Status MpiRingOp::advance() {
  for (MPI_Request& s : sends_) {
    int flag = 0;
    if (s != MPI_REQUEST_NULL) PIPER_MPI_RETURN_IF_ERROR(MPI_Test(&s, &flag, MPI_STATUS_IGNORE));
  }
  while (step_ < size_ - 1) {
    int flag = 1;
    if (recv_ != MPI_REQUEST_NULL) PIPER_MPI_RETURN_IF_ERROR(MPI_Test(&recv_, &flag, MPI_STATUS_IGNORE));
    if (!flag) break;
    PIPER_ASSIGN_OR_RETURN(const bool consumed, consume_receive());
    if (!consumed) break;  // its receive is done (recv_ is null); consumed once that send completes
    if (++step_ < size_ - 1) PIPER_RETURN_IF_ERROR(post_step());
  }
  return ok_status();
}

bool MpiRingOp::messages_done() const {
  return step_ == size_ - 1 &&
         std::all_of(sends_.begin(), sends_.end(), [](MPI_Request s) { return s == MPI_REQUEST_NULL; });
}

Result<bool> MpiRingOp::test() {
  if (complete_) return true;
  PIPER_ASSIGN_OR_RETURN(const bool done, progress_->advance_all(this));
  bool notes_done = true;
  if (notes_ != nullptr) {
    PIPER_ASSIGN_OR_RETURN(notes_done, notes_->test());
  }
  if (!done || !notes_done) return false;
  complete_ = true;
  progress_->remove(this);
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
