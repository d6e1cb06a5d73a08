// Ring all-gather and ring reduce-scatter over point-to-point messages, for MPI groups that span several nodes
// (internal to comm/mpi; MpiCommunicator picks them, see mpi_communicator.h "Collectives across nodes").
//
// Why: Open MPI 4.1's nonblocking collectives (libnbc) gather linearly (or by recursive doubling) and
// reduce-scatter through a binomial reduce to rank 0 and a linear scatter. Across two nodes of four ranks an
// all-gather of 4 MiB per rank then puts 64 MiB per direction on the link between them, where a ring in rank
// order (ranks are node-major) puts 28 MiB: measured 682 ms against about 225 ms on the emulated 1 Gbit/s link
// (docs/calibration.md "Two emulated nodes"), and the simulator prices the ring. NCCL runs rings too.
//
// The algorithms (P ranks, block b = bytes of one rank's part, r = this rank, left = r - 1, right = r + 1):
//   all-gather      out[r] = in; step k = 0..P-2: send out[r - k] to the right, receive out[r - k - 1] from the left.
//   reduce-scatter  acc = in; step k: send acc[r - k - 1] to the right, receive the left's partial of
//                   acc[r - k - 2] and add it in; after P - 1 steps acc[r] holds the sum over every rank: out.
// Step k + 1 sends what step k received, so each step waits for the previous receive; test() advances as far as
// the completed requests allow (MPI progresses only inside calls, as for libnbc). The sums run in a fixed order
// (the ring's), so the same inputs give the same bits.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "piper/comm/communicator.h"
#include "piper/comm/mpi/mpi_pending.h"

namespace piper::comm {

enum class RingKind { kAllGather, kReduceScatterSum };

class MpiRingOp : public PendingOp {
 public:
  // `comm`: the communicator the ring's messages use (a duplicate kept for them); `seq`: this collective's number
  // on it (every rank numbers its collectives alike), which keeps the tags of rings in flight together apart.
  // `notes`: the arrival notes of the collective (MpiPendingOp::post_arrival_notes), or null.
  // all-gather: `in` holds `block` bytes, `out` size * block. reduce-scatter: `in` holds size * block bytes of
  // floats, `out` block bytes.
  static Result<std::unique_ptr<MpiRingOp>> start(RingKind kind, MPI_Comm comm, uint64_t seq, const void* in, void* out,
                                                  size_t block, std::unique_ptr<MpiPendingOp> notes);
  ~MpiRingOp() override;

  Result<bool> test() override;
  std::vector<int> missing_ranks() override;
  bool tracks_arrivals() const override { return notes_ != nullptr && notes_->tracks_arrivals(); }

 private:
  MpiRingOp() = default;
  Status post_step();  // posts step_'s send and receive
  uint8_t* block_at(int index);
  Status finish_receive();  // the receive of step_ completed: add it in (reduce-scatter)
  int tag(int step) const;

  RingKind kind_ = RingKind::kAllGather;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 0;
  uint64_t seq_ = 0;
  size_t block_ = 0;
  uint8_t* out_ = nullptr;
  std::vector<uint8_t> acc_, incoming_;  // reduce-scatter: the partial sums and the block from the left
  int step_ = 0;                         // the step whose receive is awaited; size_ - 1 when every step is done
  MPI_Request recv_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> sends_;
  std::unique_ptr<MpiPendingOp> notes_;
  bool complete_ = false;
};

}  // namespace piper::comm
