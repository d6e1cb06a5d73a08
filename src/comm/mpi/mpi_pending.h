// MpiPendingOp: the requests of one MPI operation plus its arrival notes (internal to comm/mpi).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "piper/comm/communicator.h"

namespace piper::comm {

class MpiPendingOp : public PendingOp {
 public:
  MpiPendingOp() = default;
  ~MpiPendingOp() override;

  // Adds a data request; `peer` is the rank it depends on (-1 for a collective: see the arrival notes).
  void add_data(MPI_Request request, int peer);
  // Adds a receive of exactly `bytes` from `peer` of group `group`: a shorter message completes it in MPI (a
  // longer one is MPI's truncation error) and is an error here, naming both sizes.
  void add_recv(MPI_Request request, int peer, size_t bytes, const std::string& group);
  // Posts the arrival notes of a collective over `arrival_comm`: an 8-byte note to every other rank and a
  // receive of each peer's note. Called before the collective itself is posted.
  Status post_arrival_notes(MPI_Comm arrival_comm, int rank, int size);

  Result<bool> test() override;
  std::vector<int> missing_ranks() override;
  bool tracks_arrivals() const override { return tracks_arrivals_; }
  void set_tracks_arrivals(bool on) { tracks_arrivals_ = on; }

  // Count and displacement arrays of a nonblocking all-to-all-v must live until it completes.
  std::vector<int> counts_send, displs_send, counts_recv, displs_recv;
  // An all-reduce's copy of its input, when it was called in place (mpi_communicator.cc).
  std::vector<float> scratch;

 private:
  static Status test_some(std::vector<MPI_Request>& requests);
  Status test_data();
  std::vector<MPI_Request> data_;
  std::vector<int> data_peer_;
  std::vector<int64_t> data_bytes_;  // a receive's expected size; -1: a send or a collective (nothing to check)
  std::string group_;                // the communicator's name, for the size error
  Status error_;                     // test_data's failure, returned by every later test()
  std::vector<MPI_Request> arrival_recv_;
  std::vector<int> arrival_peer_;
  std::vector<MPI_Request> arrival_send_;
  std::vector<uint64_t> arrival_in_;
  uint64_t arrival_out_ = 0x5049504552ULL;  // "PIPER"
  bool complete_ = false;
  bool tracks_arrivals_ = true;
};

}  // namespace piper::comm
