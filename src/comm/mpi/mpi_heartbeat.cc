#include "piper/comm/mpi/mpi_heartbeat.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "piper/base/log.h"
#include "piper/comm/mpi/mpi_check.h"

namespace piper::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTag = 32123;  // the heartbeat communicator carries nothing else; a distinct tag all the same
constexpr uint64_t kBeat = 0x4245415400000000ULL, kBye = 0x4259450000000000ULL;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One thread: every period it drains the beats that arrived, beats to every peer still listening, and judges.
// All MPI calls on the heartbeat communicator are made by this thread.
class MpiHeartbeat : public Heartbeat {
 public:
  MpiHeartbeat(MPI_Comm comm, std::vector<int> world_ranks, HeartbeatOptions options)
      : comm_(comm), world_ranks_(std::move(world_ranks)), options_(options) {
    PIPER_MPI_CHECK(MPI_Comm_rank(comm_, &me_));
    PIPER_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    const size_t n = static_cast<size_t>(size_);
    recv_.assign(n, MPI_REQUEST_NULL);
    send_.assign(n, MPI_REQUEST_NULL);
    in_.assign(n, 0);
    heard_.assign(n, Clock::time_point());
    ever_.assign(n, false);
    gone_.assign(n, false);
    for (int p = 0; p < size_; ++p) {
      if (p != me_) post_recv(p);
    }
    thread_ = std::thread([this] { run(); });
  }

  ~MpiHeartbeat() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (reported_) {
      // This rank is about to fail because of its verdict; its exit makes mpirun stop the job. Two more periods
      // let the other survivors reach (and log) their own verdict first, so every one of them names the rank.
      std::this_thread::sleep_for(std::chrono::duration<double>(2 * options_.period_s));
      clear_silent_peer();
    }
    // The communicator is not freed: beats and goodbyes of peers may still be in flight to it, and OpenMPI
    // hands messages for a freed context id to the next communicator that reuses it (seen: a segfault in
    // mca_pml_ob1_add_comm at the next MPI_Comm_split). Left alone, they land in this communicator's queue
    // (at most two per peer) and MPI_Finalize releases it.
  }

 private:
  // An MPI error on the heartbeat communicator (a peer's node is gone and the transport says so) ends the
  // heartbeat quietly: the operations that depend on that peer report it, and the heartbeat must never abort a
  // job by itself.
  void call(int rc) {
    if (rc == MPI_SUCCESS || failed_) return;
    failed_ = true;
    PIPER_LOG(WARN) << "comm: heartbeat stopped after an MPI error: " << mpi_error_string(rc);
  }

  void post_recv(int p) {
    call(MPI_Irecv(&in_[static_cast<size_t>(p)], 1, MPI_UINT64_T, p, kTag, comm_,
                              &recv_[static_cast<size_t>(p)]));
  }

  void run() {
    auto last_round = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_ && !failed_) {
      lock.unlock();
      const auto now = Clock::now();
      // This thread was not scheduled for a long while (the process was stopped or starved): the beats it
      // missed say nothing about the peers, so it hears everyone afresh rather than judging them.
      const bool starved = seconds(now - last_round) > options_.silence_s / 2;
      last_round = now;
      drain(now, starved);
      beat();
      if (!starved) judge(now);
      lock.lock();
      cv_.wait_for(lock, std::chrono::duration<double>(options_.period_s), [this] { return stop_; });
    }
    lock.unlock();
    if (!failed_) goodbye();
  }

  void drain(Clock::time_point now, bool starved) {
    for (int p = 0; p < size_; ++p) {
      const size_t i = static_cast<size_t>(p);
      if (p == me_ || gone_[i]) continue;
      if (starved && ever_[i]) heard_[i] = now;
      while (!failed_) {
        int flag = 0;
        call(MPI_Test(&recv_[i], &flag, MPI_STATUS_IGNORE));
        if (!flag) break;
        if (in_[i] == kBye) {
          gone_[i] = true;
          break;
        }
        heard_[i] = now;
        ever_[i] = true;
        post_recv(p);
      }
    }
  }

  void beat() {
    for (int p = 0; p < size_; ++p) {
      const size_t i = static_cast<size_t>(p);
      if (p == me_ || gone_[i]) continue;
      int flag = 1;
      if (send_[i] != MPI_REQUEST_NULL) call(MPI_Test(&send_[i], &flag, MPI_STATUS_IGNORE));
      // A beat still in flight (the peer does not receive): no second one behind it.
      if (flag) call(MPI_Isend(&kBeat, 1, MPI_UINT64_T, p, kTag, comm_, &send_[i]));
    }
  }

  void judge(Clock::time_point now) {
    if (reported_) return;
    for (int p = 0; p < size_; ++p) {
      const size_t i = static_cast<size_t>(p);
      if (p == me_ || gone_[i] || !ever_[i]) continue;
      const double silent_s = seconds(now - heard_[i]);
      if (silent_s > options_.silence_s) {
        PIPER_LOG(ERROR) << "comm: no heartbeat from rank " << world_ranks_[i] << " for " << silent_s << " s";
        report_silent_peer(world_ranks_[i], silent_s, options_.silence_s);
        reported_ = true;
        return;
      }
    }
  }

  // Tells every peer still listening that this rank stops beating on purpose, then withdraws its receives.
  // Sends that do not complete within a second (a stopped peer) are released to MPI.
  void goodbye() {
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    for (int p = 0; p < size_; ++p) {
      const size_t i = static_cast<size_t>(p);
      if (p == me_ || gone_[i]) continue;
      int flag = 1;
      while (send_[i] != MPI_REQUEST_NULL && Clock::now() < deadline) {
        call(MPI_Test(&send_[i], &flag, MPI_STATUS_IGNORE));
        if (!flag) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (send_[i] != MPI_REQUEST_NULL) call(MPI_Request_free(&send_[i]));
      call(MPI_Isend(&kBye, 1, MPI_UINT64_T, p, kTag, comm_, &send_[i]));
    }
    for (int p = 0; p < size_; ++p) {
      const size_t i = static_cast<size_t>(p);
      int flag = 0;
      while (send_[i] != MPI_REQUEST_NULL && Clock::now() < deadline) {
        call(MPI_Test(&send_[i], &flag, MPI_STATUS_IGNORE));
        if (!flag) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (send_[i] != MPI_REQUEST_NULL) call(MPI_Request_free(&send_[i]));
      if (recv_[i] != MPI_REQUEST_NULL) {
        call(MPI_Cancel(&recv_[i]));
        call(MPI_Wait(&recv_[i], MPI_STATUS_IGNORE));
      }
    }
  }

  MPI_Comm comm_;
  std::vector<int> world_ranks_;
  HeartbeatOptions options_;
  int me_ = 0, size_ = 1;
  std::vector<MPI_Request> recv_, send_;
  std::vector<uint64_t> in_;
  std::vector<Clock::time_point> heard_;
  std::vector<bool> ever_, gone_;
  bool reported_ = false, failed_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<Heartbeat>> start_mpi_heartbeat(MPI_Comm comm, std::vector<int> world_ranks,
                                                       const HeartbeatOptions& options) {
  if (options.silence_s <= 0) return std::unique_ptr<Heartbeat>();
  MPI_Comm hb = MPI_COMM_NULL;
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm, &hb));
  PIPER_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(hb, MPI_ERRORS_RETURN));
  return std::unique_ptr<Heartbeat>(new MpiHeartbeat(hb, std::move(world_ranks), options));
}

}  // namespace piper::comm
