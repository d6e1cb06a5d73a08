#include "piper/comm/algorithms/halo_engine.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>

namespace piper::comm {
namespace {

constexpr int kDirectTag = 1;
constexpr int kBatchTag = 2;
constexpr int kGatherTagBase = 1000;   // + destination node
constexpr int kScatterTagBase = 17000;  // + source node
constexpr int kMaxNodes = 15000;

struct Pending {
  Handle handle;
  const char* phase;
  int peer;  // rank in the group
};

// A send proxy's job: gather the lane's pieces for node m, then send one batch.
struct SendJob {
  int node_m = 0;
  std::vector<uint8_t> batch;
  std::vector<size_t> recv_index;  // indices into the pending list of the gather receives
  bool sent = false;
};

// A receive proxy's job: receive the batch from node n, then scatter it.
struct RecvJob {
  int node_n = 0;
  std::vector<uint8_t> batch;
  std::vector<size_t> piece_bytes;
  size_t recv_index = 0;
  bool scattered = false;
  std::vector<std::vector<uint8_t>> out;
};

class Exchange {
 public:
  Exchange(Communicator& comm, const NodeTopology& t, HaloPayload& p)
      : comm_(comm), t_(t), p_(p), me_(comm.rank()), node_(t.node_of(me_)), local_(t.local_of(me_)),
        lane_(t.lane_of(local_)) {}

  Status run(double timeout_s) {
    if (comm_.size() != t_.group_size()) {
      return invalid_argument("halo: group '" + comm_.name() + "' has " + std::to_string(comm_.size()) +
                              " ranks but the topology describes " + std::to_string(t_.group_size()));
    }
    if (t_.num_nodes() > kMaxNodes) return invalid_argument("halo: more than 15000 nodes are not supported");
    PIPER_RETURN_IF_ERROR(post_receives());
    PIPER_RETURN_IF_ERROR(post_sends());
    return progress(timeout_s);
  }

 private:
  int lane_first() const { return lane_ * t_.lane_width(); }

  Status post(Result<Handle> h, const char* phase, int peer) {
    PIPER_RETURN_IF_ERROR(h.status());
    pending_.push_back(Pending{std::move(h).value(), phase, peer});
    return ok_status();
  }

  Status post_receives() {
    const int nodes = t_.num_nodes(), width = t_.lane_width();
    // Phase III at the final destination: one message per (remote node, lane) unless this rank is the proxy.
    for (int n = 0; n < nodes; ++n) {
      if (n == node_) continue;
      for (int l = 0; l < t_.lanes(); ++l) {
        int proxy = t_.recv_proxy(n, node_, l);
        if (proxy == local_) continue;
        std::span<uint8_t> dst = p_.final_recv(n, l);
        int peer = t_.rank_of(node_, proxy);
        PIPER_RETURN_IF_ERROR(post(comm_.irecv(dst.data(), dst.size(), peer, kScatterTagBase + n), "III", peer));
      }
    }
    // Phase I direct blocks.
    for (int h = 0; h < t_.ranks_per_node(); ++h) {
      if (h == local_) continue;
      std::span<uint8_t> dst = p_.direct_recv(h);
      int peer = t_.rank_of(node_, h);
      PIPER_RETURN_IF_ERROR(post(comm_.irecv(dst.data(), dst.size(), peer, kDirectTag), "I", peer));
    }
    // Send proxy: gather the lane's pieces for each node m it serves.
    for (int m = 0; m < nodes; ++m) {
      if (m == node_ || t_.send_proxy(node_, m, lane_) != local_) continue;
      SendJob job;
      job.node_m = m;
      size_t total = 0;
      for (int i = 0; i < width; ++i) total += p_.local_piece_bytes(lane_first() + i, m);
      job.batch.resize(total);
      size_t offset = 0;
      for (int i = 0; i < width; ++i) {
        int g = lane_first() + i;
        size_t bytes = p_.local_piece_bytes(g, m);
        if (g == local_) {
          std::span<const uint8_t> mine = p_.piece(m);
          if (mine.size() != bytes) return internal_error("halo: payload piece size disagrees with its metadata");
          if (bytes > 0) std::memcpy(job.batch.data() + offset, mine.data(), bytes);
        } else {
          job.recv_index.push_back(pending_.size());
          int peer = t_.rank_of(node_, g);
          PIPER_RETURN_IF_ERROR(
              post(comm_.irecv(job.batch.data() + offset, bytes, peer, kGatherTagBase + m), "I-gather", peer));
        }
        offset += bytes;
      }
      send_jobs_.push_back(std::move(job));
    }
    // Receive proxy: one batch per remote node whose lane traffic lands here.
    for (int n = 0; n < nodes; ++n) {
      if (n == node_ || t_.recv_proxy(n, node_, lane_) != local_) continue;
      RecvJob job;
      job.node_n = n;
      size_t total = 0;
      for (int i = 0; i < width; ++i) {
        job.piece_bytes.push_back(p_.remote_piece_bytes(n, lane_first() + i));
        total += job.piece_bytes.back();
      }
      job.batch.resize(total);
      job.recv_index = pending_.size();
      int peer = t_.rank_of(n, t_.send_proxy(n, node_, lane_));
      PIPER_RETURN_IF_ERROR(post(comm_.irecv(job.batch.data(), total, peer, kBatchTag), "II", peer));
      recv_jobs_.push_back(std::move(job));
    }
    return ok_status();
  }

  Status post_sends() {
    for (int i = 1; i < t_.ranks_per_node(); ++i) {
      int h = (local_ + i) % t_.ranks_per_node();
      std::span<const uint8_t> src = p_.direct_send(h);
      int peer = t_.rank_of(node_, h);
      PIPER_RETURN_IF_ERROR(post(comm_.isend(src.data(), src.size(), peer, kDirectTag), "I", peer));
    }
    for (int i = 1; i < t_.num_nodes(); ++i) {
      int m = (node_ + i) % t_.num_nodes();
      int proxy = t_.send_proxy(node_, m, lane_);
      if (proxy == local_) continue;  // copied into the batch already
      std::span<const uint8_t> src = p_.piece(m);
      int peer = t_.rank_of(node_, proxy);
      PIPER_RETURN_IF_ERROR(post(comm_.isend(src.data(), src.size(), peer, kGatherTagBase + m), "I-gather", peer));
    }
    return ok_status();
  }

  // Posts batches and scatters whose inputs are complete; true when something was posted.
  Result<bool> advance_jobs() {
    bool moved = false;
    for (SendJob& job : send_jobs_) {
      if (job.sent) continue;
      bool ready = true;
      for (size_t idx : job.recv_index) ready = ready && pending_[idx].handle.done();
      if (!ready) continue;
      int peer = t_.rank_of(job.node_m, t_.recv_proxy(node_, job.node_m, lane_));
      PIPER_RETURN_IF_ERROR(post(comm_.isend(job.batch.data(), job.batch.size(), peer, kBatchTag), "II", peer));
      job.sent = moved = true;
    }
    for (RecvJob& job : recv_jobs_) {
      if (job.scattered || !pending_[job.recv_index].handle.done()) continue;
      std::vector<std::span<const uint8_t>> pieces;
      size_t offset = 0;
      for (size_t b : job.piece_bytes) {
        pieces.emplace_back(job.batch.data() + offset, b);
        offset += b;
      }
      job.out.assign(t_.ranks_per_node(), {});
      p_.scatter(job.node_n, lane_, pieces, &job.out);
      for (int h = 0; h < t_.ranks_per_node(); ++h) {
        if (h == local_) {
          std::span<uint8_t> dst = p_.final_recv(job.node_n, lane_);
          if (dst.size() != job.out[h].size()) return internal_error("halo: scatter size disagrees with metadata");
          if (!dst.empty()) std::memcpy(dst.data(), job.out[h].data(), dst.size());
          continue;
        }
        int peer = t_.rank_of(node_, h);
        PIPER_RETURN_IF_ERROR(post(comm_.isend(job.out[h].data(), job.out[h].size(), peer,
                                               kScatterTagBase + job.node_n), "III", peer));
      }
      job.scattered = moved = true;
    }
    return moved;
  }

  Status progress(double timeout_s) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    while (true) {
      // Test the handles that gate a proxy job, then the first other incomplete one (each test progresses
      // every transfer; see Communicator::wait_all for why not every handle is tested each round).
      for (const SendJob& job : send_jobs_) {
        if (job.sent) continue;
        for (size_t idx : job.recv_index) PIPER_RETURN_IF_ERROR(comm_.test(pending_[idx].handle).status());
      }
      for (const RecvJob& job : recv_jobs_) {
        if (!job.scattered) PIPER_RETURN_IF_ERROR(comm_.test(pending_[job.recv_index].handle).status());
      }
      while (first_ < pending_.size()) {
        PIPER_ASSIGN_OR_RETURN(bool done, comm_.test(pending_[first_].handle));
        if (!done) break;
        ++first_;
      }
      bool all_done = first_ == pending_.size();
      PIPER_ASSIGN_OR_RETURN(bool moved, advance_jobs());
      bool jobs_done = true;
      for (const SendJob& j : send_jobs_) jobs_done = jobs_done && j.sent;
      for (const RecvJob& j : recv_jobs_) jobs_done = jobs_done && j.scattered;
      if (all_done && jobs_done && !moved) return ok_status();
      if (moved) continue;
      auto now = Clock::now();
      if (now >= deadline) return timeout_error(timeout_s);
      idle_while_polling(std::chrono::duration<double>(now - start).count());
    }
  }

  Status timeout_error(double timeout_s) const {
    std::ostringstream os;
    os << "halo exchange on group '" << comm_.name() << "' rank " << me_ << " timed out after " << timeout_s
       << " s; still waiting for:";
    for (const Pending& p : pending_) {
      if (!p.handle.done()) {
        os << " phase " << p.phase << " " << to_string(p.handle.op()) << " with rank " << p.peer << ";";
      }
    }
    os << " check that every rank of the group calls the exchange with consistent sizes";
    return deadline_exceeded(os.str());
  }

  Communicator& comm_;
  const NodeTopology& t_;
  HaloPayload& p_;
  int me_, node_, local_, lane_;
  std::vector<Pending> pending_;
  size_t first_ = 0;  // every pending_[i] with i < first_ is complete
  std::vector<SendJob> send_jobs_;
  std::vector<RecvJob> recv_jobs_;
};

}  // namespace

Status run_halo_exchange(Communicator& comm, const NodeTopology& topology, HaloPayload& payload, double timeout_s) {
  Exchange exchange(comm, topology, payload);
  return exchange.run(timeout_s);
}

}  // namespace piper::comm
