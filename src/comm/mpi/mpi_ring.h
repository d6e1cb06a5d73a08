// Ring all-gather and ring reduce-scatter over point-to-point messages, for MPI groups that span several nodes
// (internal to comm/mpi; MpiCommunicator picks them, see mpi_communicator.h "Collectives across nodes").
//
// Why: Open MPI 4.1's nonblocking collectives (libnbc) gather linearly (or by recursive doubling) and
// reduce-scatter through a binomial reduce to rank 0 and a linear scatter. Across two nodes of four ranks an
// all-gather of 4 MiB per rank then puts 64 MiB per direction on the link between them, where a ring in rank
// order puts 28 MiB: measured 682 ms against about 225 ms on the emulated 1 Gbit/s link (docs/calibration.md
// "Two emulated nodes"), and the simulator prices the ring. NCCL runs rings too. The ring follows the
// communicator's rank order, so it crosses each node boundary once per direction when ranks are node-major (what
// `piper train` requires of the hosts it runs on, cli/train_report.h host_layout).
//
// The algorithms (P ranks, block = bytes of one rank's part, r = this rank, left = r - 1, right = r + 1):
//   all-gather      out[r] = in; step k = 0..P-2: send out[r - k] to the right, receive out[r - k - 1] from the left.
//   reduce-scatter  step k: send the partial sum of block r - k - 1 (at k = 0 this rank's own part of the input)
//                   to the right; receive the left's partial of block r - k - 2 and add this rank's part to it;
//                   after P - 1 steps that block is r and the sum is every rank's: out. Two block-sized buffers of
//                   partial sums alternate (a buffer is refilled only once its send completed), so a call holds
//                   three blocks, not the P of its input.
// Step k + 1 sends what step k received, so each step waits for the previous receive. Every test() of any ring of
// the communicator advances all of its rings in flight (RingProgress), as any MPI call advances libnbc's
// collectives: ranks may wait for two rings in different orders. The sums run in a fixed order (the ring's), so
// the same inputs give the same bits.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "piper/comm/communicator.h"
#include "piper/comm/mpi/mpi_pending.h"

namespace piper::comm {

enum class RingKind { kAllGather, kReduceScatterSum };

class MpiRingOp;

// The rings in flight on one communicator; shared by the communicator and its rings.
class RingProgress {
 public:
  void add(MpiRingOp* op);
  void remove(MpiRingOp* op);
  // Advances every ring in flight as far as its completed requests allow (an error stays with its ring), then
  // tells whether `caller`'s messages are all done (or its error).
  Result<bool> advance_all(MpiRingOp* caller);

 private:
  std::mutex mu_;
  std::vector<MpiRingOp*> ops_;
};

class MpiRingOp : public PendingOp {
 public:
  // `comm`: the communicator the ring's messages use (a duplicate kept for them); `seq`: this collective's number
  // on it (every rank numbers its collectives alike, as it calls them in the same order), which keeps the tags
  // of rings in flight together apart. `notes`: the arrival notes of the collective, or null.
  // all-gather: `in` holds `block` bytes, `out` size * block. reduce-scatter: `in` holds size * block bytes of
  // floats, `out` block bytes (it may be this rank's part of `in`). Both stay the caller's until completion.
  static Result<std::unique_ptr<MpiRingOp>> start(RingKind kind, MPI_Comm comm, uint64_t seq, const void* in, void* out,
                                                  size_t block, std::unique_ptr<MpiPendingOp> notes,
                                                  std::shared_ptr<RingProgress> progress);
  ~MpiRingOp() override;

  Result<bool> test() override;
  std::vector<int> missing_ranks() override;
  bool tracks_arrivals() const override { return notes_ != nullptr && notes_->tracks_arrivals(); }

 private:
  friend class RingProgress;
  MpiRingOp() = default;
  Status advance();                  // under the RingProgress lock
  bool messages_done() const;        // likewise
  Result<bool> consume_receive();    // step_'s receive completed: false while a buffer it needs is still sent
  Status post_step();                // posts step_'s send and receive
  const uint8_t* send_data() const;  // what step_ sends
  const uint8_t* in_block(int index) const { return in_ + static_cast<size_t>(index) * block_; }
  uint8_t* out_block(int index) { return out_ + static_cast<size_t>(index) * block_; }
  int tag(int step) const;

  RingKind kind_ = RingKind::kAllGather;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 0;
  uint64_t seq_ = 0;
  size_t block_ = 0;
  const uint8_t* in_ = nullptr;
  uint8_t* out_ = nullptr;
  std::vector<uint8_t> incoming_, partial_[2];  // reduce-scatter: the left's block and the sums sent on
  int step_ = 0;                                // the step whose receive is awaited; size_ - 1 when all are done
  MPI_Request recv_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> sends_;  // one per step
  std::unique_ptr<MpiPendingOp> notes_;
  std::shared_ptr<RingProgress> progress_;
  Status error_;  // the first failure, returned by every later test()
  bool complete_ = false;
};

}  // namespace piper::comm
