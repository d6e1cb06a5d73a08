// Communicator: the one interface through which the runtime and the algorithms in comm/algorithms/ move bytes.
//
// A Communicator is a group of ranks (numbered 0..size()-1) with a name ("world", "ep[pp=1,dp=0]", ...). Every
// operation is asynchronous: it is posted at once and returns a Handle; the buffers belong to the operation
// until wait()/test() reports it complete. Backends: comm/mpi (CPU ranks, host memory) and comm/nccl (GPU
// ranks, device memory; see memory_kind()). This header names no MPI, NCCL or CUDA type.
//
// Contracts shared by every backend:
// - Sizes are bytes (all_reduce_sum/reduce_scatter_sum: fp32 elements). A zero-byte send or receive posts
//   nothing and completes at once; both sides must agree on the size (as in MPI), so no backend ever sees a
//   zero-byte message (some mishandle them: the RCCL zero-token hang).
// - Collectives are called by every rank of the group in the same order. all_to_all_v takes per-peer byte
//   counts; displacements are the prefix sums (blocks packed in rank order, no gaps).
// - wait(handle, timeout_s) returns DEADLINE_EXCEEDED naming the operation, the group and the ranks that did
//   not arrive (ranks whose part of the operation has not reached this rank) instead of hanging. A timed-out
//   operation is still in flight: wait again, or treat the job as broken (abort it).
// - Thread-safety: operations may be posted and waited from several threads (MPI_THREAD_MULTIPLE); a single
//   Handle is used by one thread at a time. Operations on one communicator are matched in posting order, so
//   concurrent threads should use separate communicators (dup()) — see channels.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/heartbeat.h"

namespace piper::comm {

enum class CommOp { kSend, kRecv, kAllReduce, kReduceScatter, kAllGather, kAllToAllV, kBarrier };
const char* to_string(CommOp op);

enum class MemoryKind { kHost, kDevice };

// One operation in flight; implemented by the backends.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  // Makes progress; true once the operation is complete and its buffers may be reused.
  virtual Result<bool> test() = 0;
  // Ranks of the group (communicator numbering) whose part has not arrived here yet. Called after test()
  // returned false; may be empty when the backend cannot tell (it then says so in the message).
  virtual std::vector<int> missing_ranks() = 0;
  // True when missing_ranks() is exact (arrival tracking on); false when it is only a list of suspects.
  virtual bool tracks_arrivals() const { return true; }
};

// A waitable operation. Move-only. An empty Handle (valid() == false) counts as complete.
class Handle {
 public:
  Handle() = default;
  Handle(CommOp op, std::string group, std::unique_ptr<PendingOp> pending);
  Handle(Handle&&) noexcept = default;
  Handle& operator=(Handle&&) noexcept = default;
  ~Handle();

  // An already complete operation (used for zero-byte sends and receives).
  static Handle completed(CommOp op, std::string group);

  bool valid() const { return pending_ != nullptr || done_; }
  bool done() const { return done_; }
  CommOp op() const { return op_; }
  const std::string& group() const { return group_; }

 private:
  friend class Communicator;
  CommOp op_ = CommOp::kBarrier;
  std::string group_;
  std::unique_ptr<PendingOp> pending_;
  bool done_ = false;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual MemoryKind memory_kind() const = 0;
  const std::string& name() const { return name_; }
  // World rank of every member, indexed by rank in this communicator.
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  // Collective over this communicator: every rank passes the sorted member list of the group it joins (the
  // lists of all ranks must form a partition; an empty list joins none and yields nullptr). Ranks in the new
  // communicator follow the order of `ranks` (numbers of this communicator).
  virtual Result<std::unique_ptr<Communicator>> split(const std::vector<int>& ranks, const std::string& name) = 0;
  // Collective: same members, separate matching context (its traffic never matches this one's).
  virtual Result<std::unique_ptr<Communicator>> dup(const std::string& name) = 0;

  // Point to point. tag in [0, 32767]. Matching is by (peer, tag) in posting order. A receive takes exactly
  // `bytes`: the MPI backend fails the wait (kDataLoss, both sizes named) on a shorter message as MPI fails a
  // longer one; NCCL requires the sizes to match and cannot check them.
  virtual Result<Handle> isend(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual Result<Handle> irecv(void* data, size_t bytes, int peer, int tag) = 0;
  // out[i] = sum over ranks of in[i]; in == out is allowed.
  virtual Result<Handle> all_reduce_sum(const float* in, float* out, size_t count) = 0;
  // in holds size() * count_per_rank floats; out[i] = sum over ranks of in[rank() * count_per_rank + i].
  virtual Result<Handle> reduce_scatter_sum(const float* in, float* out, size_t count_per_rank) = 0;
  // out holds size() * bytes_per_rank bytes, rank r's contribution at r * bytes_per_rank.
  virtual Result<Handle> all_gather(const void* in, void* out, size_t bytes_per_rank) = 0;
  // send_bytes[p] bytes go to peer p, recv_bytes[p] come from peer p; both spans have size() entries.
  virtual Result<Handle> all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                                      std::span<const size_t> recv_bytes) = 0;
  virtual Result<Handle> barrier() = 0;

  // Collective: starts this rank's heartbeat over a duplicate of this communicator (comm/heartbeat.h); it runs
  // until the returned object is destroyed. nullptr when options.silence_s is 0 or the backend has none.
  virtual Result<std::unique_ptr<Heartbeat>> start_heartbeat(const HeartbeatOptions& options);

  // Progress without blocking: true once complete (the handle is then done()).
  Result<bool> test(Handle& handle);
  // Blocks until complete or timeout_s passed (DEADLINE_EXCEEDED naming op, group and missing ranks, and the
  // seconds actually waited), or until the heartbeat declared a rank stopped (Unavailable naming it).
  Status wait(Handle& handle, double timeout_s);
  // Waits for all handles with one deadline; the error names the first one still incomplete.
  Status wait_all(std::span<Handle> handles, double timeout_s);
  // The DEADLINE_EXCEEDED of an operation that made no progress for waited_s seconds (op, group, the ranks
  // that did not arrive); for callers with polling loops of their own. `handle` must be incomplete.
  Status stalled_error(Handle& handle, double waited_s);

 protected:
  Communicator(std::string name, std::vector<int> world_ranks)
      : name_(std::move(name)), world_ranks_(std::move(world_ranks)) {}
  // "what on group 'name' (N ranks)"; used by backends in error messages.
  std::string describe(const std::string& what) const;

 private:
  std::string name_;
  std::vector<int> world_ranks_;
};

// What a polling loop does between two tests of its operations, `waited_s` seconds after it started (or last
// made progress): yields the core during the first 100 us, then sleeps waited_s / 16, clamped to 20 us .. 1 ms.
// Ranks are often oversubscribed (8 ranks on 2 cores): a waiting rank that only yields still takes its fair
// share of the core from the rank it waits for (docs/comm.md, "Where the time went"). Every polling loop of Piper
// waits this way: Communicator::wait, the runtime's stream threads (Core::wait_comm), the HALO and MoE engines and
// `piper calibrate --ranks`, which so measures what a training step pays. A sleep in proportion to the wait keeps
// the added latency near 1/16 of it: a fixed 1 ms sleep after a few polls (the stream threads' earlier policy)
// added up to 1 ms to each round of a collective whose peers had finished theirs (docs/comm.md).
void idle_while_polling(double waited_s);

// Default timeout for waits whose caller has no better figure (seconds); PIPER_COMM_TIMEOUT_S overrides it.
double default_timeout_s();
// PIPER_COMM_TIMEOUT_S checked: the default (300 s) when unset, else a number of seconds in (0, 1e6];
// InvalidArgument naming the value and the range otherwise (default_timeout_s() ignores a bad value).
Result<double> timeout_from_env();

}  // namespace piper::comm
