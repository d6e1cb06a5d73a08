#include "piper/comm/mpi/mpi_pending.h"

#include <algorithm>

#include "piper/base/log.h"
#include "piper/comm/mpi/mpi_check.h"

namespace piper::comm {
namespace {
constexpr int kArrivalTag = 7;

bool all_null(const std::vector<MPI_Request>& requests) {
  return std::all_of(requests.begin(), requests.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
}
}  // namespace

MpiPendingOp::~MpiPendingOp() {
  if (complete_) return;
  // An abandoned operation (its wait timed out and the caller gave up). MPI forbids freeing a pending
  // collective request, and the buffers may still be written, so the requests are left to MPI_Finalize.
  PIPER_LOG(WARN) << "comm: destroying an MPI operation that has not completed; its requests are leaked";
}

void MpiPendingOp::add_data(MPI_Request request, int peer) {
  data_.push_back(request);
  data_peer_.push_back(peer);
  data_bytes_.push_back(-1);
}

void MpiPendingOp::add_recv(MPI_Request request, int peer, size_t bytes, const std::string& group) {
  add_data(request, peer);
  data_bytes_.back() = static_cast<int64_t>(bytes);
  group_ = group;
}

Status MpiPendingOp::post_arrival_notes(MPI_Comm arrival_comm, int rank, int size) {
  arrival_in_.assign(size, 0);
  arrival_recv_.reserve(size);
  arrival_send_.reserve(size);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    MPI_Request r;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Irecv(&arrival_in_[p], 1, MPI_UINT64_T, p, kArrivalTag, arrival_comm, &r));
    arrival_recv_.push_back(r);
    arrival_peer_.push_back(p);
  }
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    MPI_Request r;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Isend(&arrival_out_, 1, MPI_UINT64_T, p, kArrivalTag, arrival_comm, &r));
    arrival_send_.push_back(r);
  }
  return ok_status();
}

Status MpiPendingOp::test_some(std::vector<MPI_Request>& requests) {
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    int flag = 0;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Test(&r, &flag, MPI_STATUS_IGNORE));
  }
  return ok_status();
}

Status MpiPendingOp::test_data() {
  for (size_t i = 0; i < data_.size(); ++i) {
    if (data_[i] == MPI_REQUEST_NULL) continue;
    int flag = 0, got = 0;
    MPI_Status status;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Test(&data_[i], &flag, &status));
    if (!flag || data_bytes_[i] < 0) continue;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Get_count(&status, MPI_BYTE, &got));
    if (got != data_bytes_[i]) {
      return data_loss("comm: a message of " + std::to_string(got) + " bytes arrived from rank " +
                       std::to_string(data_peer_[i]) + " of group '" + group_ + "' where " +
                       std::to_string(data_bytes_[i]) +
                       " bytes were expected: the two ranks disagree on what they exchange (a routing's row counts "
                       "or the plan's tensor sizes differ between them); the received data is not used");
    }
  }
  return ok_status();
}

Result<bool> MpiPendingOp::test() {
  if (complete_) return true;
  if (!error_.ok()) return error_;  // a receive of the wrong size stays an error
  error_ = test_data();
  PIPER_RETURN_IF_ERROR(error_);
  PIPER_RETURN_IF_ERROR(test_some(arrival_recv_));
  PIPER_RETURN_IF_ERROR(test_some(arrival_send_));
  complete_ = all_null(data_) && all_null(arrival_recv_) && all_null(arrival_send_);
  return complete_;
}

std::vector<int> MpiPendingOp::missing_ranks() {
  std::vector<int> missing;
  for (size_t i = 0; i < arrival_recv_.size(); ++i) {
    if (arrival_recv_[i] != MPI_REQUEST_NULL) missing.push_back(arrival_peer_[i]);
  }
  for (size_t i = 0; i < data_.size(); ++i) {
    if (data_[i] != MPI_REQUEST_NULL && data_peer_[i] >= 0) missing.push_back(data_peer_[i]);
  }
  std::sort(missing.begin(), missing.end());
  missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
  return missing;
}

}  // namespace piper::comm
