#include "piper/comm/algorithms/halo_engine.h"

#include <chrono>
#include <cstring>
#include <sstream>

#include "piper/base/fault.h"

namespace piper::comm {

std::span<uint8_t> HaloScratch::take(size_t bytes) {
  if (next_ == buffers_.size()) buffers_.emplace_back();
  Buffer& b = buffers_[next_++];
  if (b.bytes < bytes) {
    b.data.reset(new uint8_t[bytes]);
    b.bytes = bytes;
  }
  return {b.data.get(), bytes};
}

namespace {

constexpr int kDirectTag = 1;
constexpr int kBatchTag = 2;
constexpr int kGatherTagBase = 1000;    // + destination node
constexpr int kScatterTagBase = 17000;  // + source node
constexpr int kMaxNodes = 15000;
using Clock = std::chrono::steady_clock;

struct Pending {
  Handle handle;
  const char* phase;
  int peer;  // rank in the group
};

// A send proxy's job: gather the lane's pieces for node m, then send one batch.
struct SendJob {
  int node_m = 0;
  std::span<uint8_t> batch;
  std::vector<size_t> recv_index;  // indices into the pending list of the gather receives
  bool sent = false;
};

// A receive proxy's job: receive the batch from node n, then scatter it.
struct RecvJob {
  int node_n = 0;
  std::span<uint8_t> batch;
  std::vector<size_t> piece_bytes;
  std::vector<std::span<uint8_t>> out;  // per local rank; this rank's entry is its final_recv
  int peer = 0;                         // the send proxy of node n that sends the batch
  size_t total = 0;
  size_t recv_index = 0;
  bool posted = false;  // the batch receive is posted (deferred while this rank's own batch to `peer` waits)
  bool scattered = false;
};

class Exchange {
 public:
  Exchange(Communicator& comm, const NodeTopology& t, HaloPayload& p, HaloScratch& scratch, HaloExchangeStats& stats)
      : comm_(comm),
        t_(t),
        p_(p),
        scratch_(scratch),
        stats_(stats),
        me_(comm.rank()),
        node_(t.node_of(me_)),
        local_(t.local_of(me_)),
        lane_(t.lane_of(local_)) {}

  Status run(double timeout_s) {
    if (comm_.size() != t_.group_size()) {
      return invalid_argument("halo: group '" + comm_.name() + "' has " + std::to_string(comm_.size()) +
                              " ranks but the topology describes " + std::to_string(t_.group_size()));
    }
    if (t_.num_nodes() > kMaxNodes) return invalid_argument("halo: more than 15000 nodes are not supported");
    start_ = Clock::now();
    PIPER_RETURN_IF_ERROR(post_receives());
    PIPER_RETURN_IF_ERROR(post_sends());
    fault_point("halo");
    stats_.posted_s = since_start();
    Status status = progress(timeout_s);
    stats_.total_s = since_start();
    return status;
  }

 private:
  int lane_first() const { return lane_ * t_.lane_width(); }
  double since_start() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  Status post(Result<Handle> h, const char* phase, int peer) {
    PIPER_RETURN_IF_ERROR(h.status());
    pending_.push_back(Pending{std::move(h).value(), phase, peer});
    return ok_status();
  }

  Status send(std::span<const uint8_t> data, int peer, int tag, const char* phase) {
    if (!data.empty()) {
      bool inter = t_.node_of(peer) != node_;
      (inter ? stats_.messages_inter : stats_.messages_intra) += 1;
      (inter ? stats_.bytes_inter : stats_.bytes_intra) += static_cast<int64_t>(data.size());
    }
    return post(comm_.isend(data.data(), data.size(), peer, tag), phase, peer);
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
    // Send proxy: gather the lane's pieces for each node m it serves, straight into the batch.
    for (int m = 0; m < nodes; ++m) {
      if (m == node_ || t_.send_proxy(node_, m, lane_) != local_) continue;
      SendJob job;
      job.node_m = m;
      size_t total = 0;
      for (int i = 0; i < width; ++i) total += p_.local_piece_bytes(lane_first() + i, m);
      job.batch = scratch_.take(total);
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
    // Receive proxy: one batch per remote node whose lane traffic lands here, and the parts it scatters.
    for (int n = 0; n < nodes; ++n) {
      if (n == node_ || t_.recv_proxy(n, node_, lane_) != local_) continue;
      RecvJob job;
      job.node_n = n;
      size_t total = 0;
      for (int i = 0; i < width; ++i) {
        job.piece_bytes.push_back(p_.remote_piece_bytes(n, lane_first() + i));
        total += job.piece_bytes.back();
      }
      job.batch = scratch_.take(total);
      for (int h = 0; h < t_.ranks_per_node(); ++h) {
        size_t bytes = p_.scatter_bytes(n, lane_, h);
        std::span<uint8_t> part = h == local_ ? p_.final_recv(n, lane_) : scratch_.take(bytes);
        if (part.size() != bytes) return internal_error("halo: scatter size disagrees with the payload's metadata");
        job.out.push_back(part);
      }
      job.peer = t_.rank_of(n, t_.send_proxy(n, node_, lane_));
      job.total = total;
      recv_jobs_.push_back(std::move(job));
      // When this rank also sends a batch to that proxy, its receive waits until that batch is posted: over
      // OpenMPI's TCP BTL a receive posted before the send of the opposite direction can make the two batches
      // cross the link one after the other (see pairwise_all_to_all.h).
      if (!sends_batch_to(recv_jobs_.back().peer)) PIPER_RETURN_IF_ERROR(post_batch_recv(recv_jobs_.back()));
    }
    return ok_status();
  }

  int batch_dest(const SendJob& job) const { return t_.rank_of(job.node_m, t_.recv_proxy(node_, job.node_m, lane_)); }

  bool sends_batch_to(int peer) const {
    for (const SendJob& job : send_jobs_) {
      if (!job.sent && batch_dest(job) == peer) return true;
    }
    return false;
  }

  Status post_batch_recv(RecvJob& job) {
    job.recv_index = pending_.size();
    job.posted = true;
    return post(comm_.irecv(job.batch.data(), job.total, job.peer, kBatchTag), "II", job.peer);
  }

  Status post_sends() {
    for (int i = 1; i < t_.ranks_per_node(); ++i) {
      int h = (local_ + i) % t_.ranks_per_node();
      PIPER_RETURN_IF_ERROR(send(p_.direct_send(h), t_.rank_of(node_, h), kDirectTag, "I"));
    }
    for (int i = 1; i < t_.num_nodes(); ++i) {
      int m = (node_ + i) % t_.num_nodes();
      int proxy = t_.send_proxy(node_, m, lane_);
      if (proxy == local_) continue;  // copied into the batch already
      PIPER_RETURN_IF_ERROR(send(p_.piece(m), t_.rank_of(node_, proxy), kGatherTagBase + m, "I-gather"));
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
      int peer = batch_dest(job);
      PIPER_RETURN_IF_ERROR(send(job.batch, peer, kBatchTag, "II"));
      job.sent = moved = true;
      stats_.batches_out_s = since_start();
      for (RecvJob& r : recv_jobs_) {
        if (!r.posted && !sends_batch_to(r.peer)) PIPER_RETURN_IF_ERROR(post_batch_recv(r));
      }
    }
    for (RecvJob& job : recv_jobs_) {
      if (job.scattered || !job.posted || !pending_[job.recv_index].handle.done()) continue;
      std::vector<std::span<const uint8_t>> pieces;
      size_t offset = 0;
      for (size_t b : job.piece_bytes) {
        pieces.emplace_back(job.batch.data() + offset, b);
        offset += b;
      }
      const double scatter_start = since_start();
      p_.scatter(job.node_n, lane_, pieces, job.out);
      stats_.scatter_s += since_start() - scatter_start;
      for (int h = 0; h < t_.ranks_per_node(); ++h) {
        if (h == local_) continue;
        PIPER_RETURN_IF_ERROR(send(job.out[h], t_.rank_of(node_, h), kScatterTagBase + job.node_n, "III"));
      }
      job.scattered = moved = true;
      stats_.batches_in_s = since_start();
    }
    return moved;
  }

  bool jobs_done() const {
    for (const SendJob& j : send_jobs_) {
      if (!j.sent) return false;
    }
    for (const RecvJob& j : recv_jobs_) {
      if (!j.scattered) return false;
    }
    return true;
  }

  Status progress(double timeout_s) {
    const auto deadline =
        start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    auto idle_since = Clock::now();
    while (true) {
      // Test the handles that gate a proxy job, then the first other incomplete one (each test progresses
      // every transfer; see Communicator::wait_all for why not every handle is tested each round).
      for (const SendJob& job : send_jobs_) {
        if (job.sent) continue;
        for (size_t idx : job.recv_index) PIPER_RETURN_IF_ERROR(comm_.test(pending_[idx].handle).status());
      }
      for (const RecvJob& job : recv_jobs_) {
        if (job.posted && !job.scattered) PIPER_RETURN_IF_ERROR(comm_.test(pending_[job.recv_index].handle).status());
      }
      while (first_ < pending_.size()) {
        PIPER_ASSIGN_OR_RETURN(bool done, comm_.test(pending_[first_].handle));
        if (!done) break;
        ++first_;
      }
      PIPER_ASSIGN_OR_RETURN(bool moved, advance_jobs());
      if (moved) {
        idle_since = Clock::now();
        continue;
      }
      if (first_ == pending_.size() && jobs_done()) return ok_status();
      if (Status live = peer_liveness(); !live.ok()) {
        return live.with_context("halo exchange on group '" + comm_.name() + "' rank " + std::to_string(me_));
      }
      auto now = Clock::now();
      if (now >= deadline) return timeout_error(std::chrono::duration<double>(now - start_).count());
      ++stats_.idle_rounds;
      // The back-off restarts whenever a job moves, so a proxy polls its fresh batch promptly.
      idle_while_polling(std::chrono::duration<double>(now - idle_since).count());
    }
  }

  Status timeout_error(double waited_s) const {
    std::ostringstream os;
    os << "halo exchange on group '" << comm_.name() << "' rank " << me_ << " timed out after " << waited_s
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
  HaloScratch& scratch_;
  HaloExchangeStats& stats_;
  int me_, node_, local_, lane_;
  Clock::time_point start_;
  std::vector<Pending> pending_;
  size_t first_ = 0;  // every pending_[i] with i < first_ is complete
  std::vector<SendJob> send_jobs_;
  std::vector<RecvJob> recv_jobs_;
};

}  // namespace

Status run_halo_exchange(Communicator& comm, const NodeTopology& topology, HaloPayload& payload, double timeout_s,
                         HaloScratch* scratch, HaloExchangeStats* stats) {
  HaloScratch local_scratch;
  HaloExchangeStats local_stats;
  Exchange exchange(comm, topology, payload, scratch ? *scratch : local_scratch, stats ? *stats : local_stats);
  return exchange.run(timeout_s);
}

}  // namespace piper::comm
