#include "piper/comm/mpi/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "piper/base/check.h"
#include "piper/comm/mpi/mpi_check.h"
#include "piper/comm/mpi/mpi_heartbeat.h"
#include "piper/comm/mpi/mpi_pending.h"
#include "piper/comm/mpi/mpi_ring.h"

namespace piper::comm {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, length);
}

Status mpi_error(int code, const char* expr, const char* file, int line) {
  return internal_error(std::string("MPI call failed at ") + file + ":" + std::to_string(line) + ": " + expr +
                        " -> " + mpi_error_string(code));
}

namespace {

Status check_int_size(size_t value, const char* what) {
  if (value > static_cast<size_t>(INT_MAX)) {
    return invalid_argument(std::string("comm/mpi: ") + what + " of " + std::to_string(value) +
                            " exceeds the MPI count limit of 2^31-1; split the operation into smaller pieces");
  }
  return ok_status();
}

// When libnbc (nbc_iallreduce.c) runs an all-reduce given a separate input as Rabenseifner's: 64 KiB or more, 4
// ranks or more (below either, every all-reduce is its binomial tree, in place or not).
constexpr size_t kInPlaceCopyBytes = 65536;
constexpr int kRabenseifnerMinRanks = 4;

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(std::string name, std::vector<int> world_ranks, MPI_Comm comm, MPI_Comm arrival_comm,
                  MPI_Comm ring_comm, MpiOptions options)
      : Communicator(std::move(name), std::move(world_ranks)),
        comm_(comm),
        arrival_(arrival_comm),
        ring_(ring_comm),
        options_(options) {
    PIPER_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    PIPER_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_NULL) PIPER_MPI_CHECK(MPI_Comm_free(&comm_));
    if (arrival_ != MPI_COMM_NULL) PIPER_MPI_CHECK(MPI_Comm_free(&arrival_));
    if (ring_ != MPI_COMM_NULL) PIPER_MPI_CHECK(MPI_Comm_free(&ring_));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }

  // Makes a communicator from `comm` (already created), with its own arrival side channel.
  static Result<std::unique_ptr<Communicator>> wrap(MPI_Comm comm, std::string name, std::vector<int> world_ranks,
                                                    MpiOptions options) {
    PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    Result<bool> rings = uses_rings(comm, options.ring);
    if (!rings.ok()) {
      MPI_Comm_free(&comm);
      return rings.status();
    }
    MPI_Comm arrival = MPI_COMM_NULL, ring = MPI_COMM_NULL;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm, &arrival));
    if (*rings) PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm, &ring));
    return std::unique_ptr<Communicator>(
        new MpiCommunicator(std::move(name), std::move(world_ranks), comm, arrival, ring, options));
  }

  // Collective over `comm`: whether its all-gathers and reduce-scatters run as rings (mpi_communicator.h).
  // Every rank must decide alike (a ring on some ranks and Open MPI's collective on others would never match):
  // ranks whose PIPER_MPI_RING or options differ are refused.
  static Result<bool> uses_rings(MPI_Comm comm, RingCollectives choice) {
    int size = 0, local_size = 0;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &size));
    MPI_Comm local = MPI_COMM_NULL;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
    const int local_rc = MPI_Comm_size(local, &local_size);
    PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_free(&local));
    PIPER_MPI_RETURN_IF_ERROR(local_rc);
    const bool mine = choice == RingCollectives::kAcrossNodes ? local_size < size : choice == RingCollectives::kAlways;
    int votes[2] = {mine ? 1 : 0, mine ? 0 : 1};  // ranks for rings, ranks against
    PIPER_MPI_RETURN_IF_ERROR(MPI_Allreduce(MPI_IN_PLACE, votes, 2, MPI_INT, MPI_SUM, comm));
    if (votes[0] > 0 && votes[1] > 0) {
      return invalid_argument("comm/mpi: " + std::to_string(votes[0]) + " of " + std::to_string(size) +
                              " ranks would run all-gather and reduce-scatter as rings and " +
                              std::to_string(votes[1]) +
                              " would not; give every rank the same PIPER_MPI_RING (or none) and the same MpiOptions");
    }
    return mine;
  }

  Result<std::unique_ptr<Communicator>> split(const std::vector<int>& ranks, const std::string& name) override {
    int color = MPI_UNDEFINED;
    int key = 0;
    if (!ranks.empty()) {
      std::set<int> seen;
      for (int r : ranks) {
        if (r < 0 || r >= size_) {
          return invalid_argument(describe("split '" + name + "'") + ": rank " + std::to_string(r) +
                                  " is out of range [0, " + std::to_string(size_) + ")");
        }
        if (!seen.insert(r).second) {
          return invalid_argument(describe("split '" + name + "'") + ": rank " + std::to_string(r) + " is listed twice");
        }
      }
      auto it = std::find(ranks.begin(), ranks.end(), rank_);
      if (it == ranks.end()) {
        return invalid_argument(describe("split '" + name + "'") + ": rank " + std::to_string(rank_) +
                                " passed a member list that does not contain itself; pass the group it joins");
      }
      color = *std::min_element(ranks.begin(), ranks.end());
      key = static_cast<int>(it - ranks.begin());
    }
    MPI_Comm sub = MPI_COMM_NULL;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_split(comm_, color, key, &sub));
    if (ranks.empty()) return std::unique_ptr<Communicator>();
    std::vector<int> world;
    for (int r : ranks) world.push_back(world_ranks()[r]);
    return wrap(sub, name, std::move(world), options_);
  }

  Result<std::unique_ptr<Communicator>> dup(const std::string& name) override {
    MPI_Comm copy = MPI_COMM_NULL;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm_, &copy));
    return wrap(copy, name, world_ranks(), options_);
  }

  Result<std::unique_ptr<Heartbeat>> start_heartbeat(const HeartbeatOptions& options) override {
    return start_mpi_heartbeat(comm_, world_ranks(), options);
  }

  Result<Handle> isend(const void* data, size_t bytes, int peer, int tag) override {
    PIPER_RETURN_IF_ERROR(check_p2p(bytes, peer, tag, "isend"));
    if (bytes == 0) return Handle::completed(CommOp::kSend, name());
    auto op = std::make_unique<MpiPendingOp>();
    MPI_Request r;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &r));
    op->add_data(r, peer);
    return Handle(CommOp::kSend, name(), std::move(op));
  }

  Result<Handle> irecv(void* data, size_t bytes, int peer, int tag) override {
    PIPER_RETURN_IF_ERROR(check_p2p(bytes, peer, tag, "irecv"));
    if (bytes == 0) return Handle::completed(CommOp::kRecv, name());
    auto op = std::make_unique<MpiPendingOp>();
    MPI_Request r;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &r));
    op->add_recv(r, peer, bytes, name());
    return Handle(CommOp::kRecv, name(), std::move(op));
  }

  Result<Handle> all_reduce_sum(const float* in, float* out, size_t count) override {
    PIPER_RETURN_IF_ERROR(check_int_size(count, "all_reduce_sum count"));
    if (count == 0) return Handle::completed(CommOp::kAllReduce, name());
    PIPER_ASSIGN_OR_RETURN(auto op, start_collective());
    MPI_Request r;
    // In place, libnbc reduces any buffer of 64 KiB or more through a binomial tree to rank 0 and back (every tree
    // edge carries the whole buffer, one after the other); given a separate input it runs Rabenseifner's
    // reduce-scatter and all-gather. So an in-place call of that size reduces a copy of its input.
    const void* src = in;
    if (in == out && size_ >= kRabenseifnerMinRanks && count * sizeof(float) >= kInPlaceCopyBytes) {
      op->scratch.assign(in, in + count);
      src = op->scratch.data();
    } else if (in == out) {
      src = MPI_IN_PLACE;
    }
    PIPER_MPI_RETURN_IF_ERROR(MPI_Iallreduce(src, out, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_, &r));
    op->add_data(r, -1);
    return Handle(CommOp::kAllReduce, name(), std::move(op));
  }

  Result<Handle> reduce_scatter_sum(const float* in, float* out, size_t count_per_rank) override {
    PIPER_RETURN_IF_ERROR(check_int_size(count_per_rank * size_, "reduce_scatter_sum count"));
    if (count_per_rank == 0) return Handle::completed(CommOp::kReduceScatter, name());
    PIPER_ASSIGN_OR_RETURN(auto op, start_collective());
    if (ring_ != MPI_COMM_NULL) {
      return ring(RingKind::kReduceScatterSum, CommOp::kReduceScatter, in, out, count_per_rank * sizeof(float),
                  std::move(op));
    }
    MPI_Request r;
    PIPER_MPI_RETURN_IF_ERROR(
        MPI_Ireduce_scatter_block(in, out, static_cast<int>(count_per_rank), MPI_FLOAT, MPI_SUM, comm_, &r));
    op->add_data(r, -1);
    return Handle(CommOp::kReduceScatter, name(), std::move(op));
  }

  Result<Handle> all_gather(const void* in, void* out, size_t bytes_per_rank) override {
    PIPER_RETURN_IF_ERROR(check_int_size(bytes_per_rank * size_, "all_gather bytes"));
    if (bytes_per_rank == 0) return Handle::completed(CommOp::kAllGather, name());
    PIPER_ASSIGN_OR_RETURN(auto op, start_collective());
    if (ring_ != MPI_COMM_NULL)
      return ring(RingKind::kAllGather, CommOp::kAllGather, in, out, bytes_per_rank, std::move(op));
    MPI_Request r;
    int n = static_cast<int>(bytes_per_rank);
    PIPER_MPI_RETURN_IF_ERROR(MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, comm_, &r));
    op->add_data(r, -1);
    return Handle(CommOp::kAllGather, name(), std::move(op));
  }

  Result<Handle> all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                              std::span<const size_t> recv_bytes) override {
    if (static_cast<int>(send_bytes.size()) != size_ || static_cast<int>(recv_bytes.size()) != size_) {
      return invalid_argument(describe("all_to_all_v") + ": expected " + std::to_string(size_) +
                              " send and receive counts, got " + std::to_string(send_bytes.size()) + " and " +
                              std::to_string(recv_bytes.size()));
    }
    PIPER_ASSIGN_OR_RETURN(auto op, start_collective());
    PIPER_RETURN_IF_ERROR(fill_counts(send_bytes, &op->counts_send, &op->displs_send));
    PIPER_RETURN_IF_ERROR(fill_counts(recv_bytes, &op->counts_recv, &op->displs_recv));
    MPI_Request r;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Ialltoallv(send, op->counts_send.data(), op->displs_send.data(), MPI_BYTE, recv,
                                             op->counts_recv.data(), op->displs_recv.data(), MPI_BYTE, comm_, &r));
    op->add_data(r, -1);
    return Handle(CommOp::kAllToAllV, name(), std::move(op));
  }

  Result<Handle> barrier() override {
    PIPER_ASSIGN_OR_RETURN(auto op, start_collective());
    MPI_Request r;
    PIPER_MPI_RETURN_IF_ERROR(MPI_Ibarrier(comm_, &r));
    op->add_data(r, -1);
    return Handle(CommOp::kBarrier, name(), std::move(op));
  }

 private:
  // A ring collective (mpi_ring.h) on the ring communicator; `notes` carries the arrival notes.
  Result<Handle> ring(RingKind kind, CommOp what, const void* in, void* out, size_t block,
                      std::unique_ptr<MpiPendingOp> notes) {
    PIPER_ASSIGN_OR_RETURN(auto op,
                           MpiRingOp::start(kind, ring_, ring_seq_++, in, out, block, std::move(notes), rings_));
    return Handle(what, name(), std::move(op));
  }

  Status check_p2p(size_t bytes, int peer, int tag, const char* what) const {
    if (peer < 0 || peer >= size_) {
      return invalid_argument(describe(what) + ": peer " + std::to_string(peer) + " is out of range [0, " +
                              std::to_string(size_) + ")");
    }
    if (tag < 0 || tag > 32767) {
      return invalid_argument(describe(what) + ": tag " + std::to_string(tag) + " is outside [0, 32767]");
    }
    return check_int_size(bytes, "message size");
  }

  Result<std::unique_ptr<MpiPendingOp>> start_collective() {
    auto op = std::make_unique<MpiPendingOp>();
    if (options_.track_arrivals) {
      PIPER_RETURN_IF_ERROR(op->post_arrival_notes(arrival_, rank_, size_));
    } else {
      op->set_tracks_arrivals(false);
    }
    return op;
  }

  static Status fill_counts(std::span<const size_t> bytes, std::vector<int>* counts, std::vector<int>* displs) {
    size_t offset = 0;
    for (size_t b : bytes) {
      PIPER_RETURN_IF_ERROR(check_int_size(offset + b, "all_to_all_v buffer"));
      counts->push_back(static_cast<int>(b));
      displs->push_back(static_cast<int>(offset));
      offset += b;
    }
    return ok_status();
  }

  MPI_Comm comm_;
  MPI_Comm arrival_;
  MPI_Comm ring_;  // MPI_COMM_NULL: Open MPI's all-gather and reduce-scatter
  // The rings' numbers: every rank calls the collectives of a communicator in the same order (communicator.h), so
  // a ring has the same number on every rank.
  uint64_t ring_seq_ = 0;
  std::shared_ptr<RingProgress> rings_ = std::make_shared<RingProgress>();
  MpiOptions options_;
  int rank_ = 0;
  int size_ = 0;
};

void abort_hook() { MPI_Abort(MPI_COMM_WORLD, 134); }

}  // namespace

Status mpi_init(int* argc, char*** argv) {
  int initialized = 0;
  PIPER_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  int provided = 0;
  if (initialized) {
    PIPER_MPI_RETURN_IF_ERROR(MPI_Query_thread(&provided));
  } else {
    PIPER_MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    return failed_precondition("comm/mpi: the MPI library gives thread level " + std::to_string(provided) +
                               " but Piper needs MPI_THREAD_MULTIPLE; use OpenMPI (libopenmpi-dev)");
  }
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0;
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  set_process_rank(rank);
  set_fatal_hook(&abort_hook);
  return ok_status();
}

bool mpi_initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

namespace {
// PIPER_MPI_RING over the options' choice (mpi_communicator.h).
Result<MpiOptions> with_ring_env(MpiOptions options) {
  const char* env = std::getenv("PIPER_MPI_RING");
  if (env == nullptr || *env == '\0' || options.ring != RingCollectives::kAcrossNodes) return options;
  const std::string v = env;
  if (v == "across-nodes") {
    options.ring = RingCollectives::kAcrossNodes;
  } else if (v == "always") {
    options.ring = RingCollectives::kAlways;
  } else if (v == "never") {
    options.ring = RingCollectives::kNever;
  } else {
    return invalid_argument("PIPER_MPI_RING='" + v +
                            "' is not one of across-nodes (the default), always, never; unset it or pick one");
  }
  return options;
}
}  // namespace

Result<std::unique_ptr<Communicator>> mpi_world(const MpiOptions& given) {
  if (!mpi_initialized()) return failed_precondition("comm/mpi: mpi_world() called before mpi_init()");
  PIPER_ASSIGN_OR_RETURN(const MpiOptions options, with_ring_env(given));
  MPI_Comm world = MPI_COMM_NULL;
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  int size = 0;
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_size(world, &size));
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  return MpiCommunicator::wrap(world, "world", std::move(ranks), options);
}

Status mpi_finalize() {
  if (!mpi_initialized()) return ok_status();
  set_fatal_hook(nullptr);
  PIPER_MPI_RETURN_IF_ERROR(MPI_Finalize());
  return ok_status();
}

void mpi_abort_job(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();
}

double mpi_wtime() { return MPI_Wtime(); }

}  // namespace piper::comm
