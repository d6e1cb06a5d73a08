#include "piper/comm/algorithms/halo_all_to_all.h"

#include <chrono>
#include <cstring>
#include <vector>

#include "piper/comm/algorithms/pairwise_all_to_all.h"

namespace piper::comm {

Result<std::unique_ptr<HaloContext>> HaloContext::create(Communicator& group, const NodeTopology& topology) {
  if (group.memory_kind() == MemoryKind::kDevice) {
    return unimplemented("halo: the HALO engine packs rows in host buffers; the device communicator '" + group.name() +
                         "' needs device staging buffers, which are not implemented (issue 11): wrap it with "
                         "host_staged() (comm/nccl/host_staged.h) to run HALO on host buffers over NCCL");
  }
  if (group.size() != topology.group_size()) {
    return invalid_argument("halo: group '" + group.name() + "' has " + std::to_string(group.size()) +
                            " ranks but the topology describes " + std::to_string(topology.group_size()));
  }
  std::unique_ptr<HaloContext> context(new HaloContext(topology));
  PIPER_ASSIGN_OR_RETURN(context->data_, group.dup(group.name() + "/halo"));
  int node = topology.node_of(group.rank());
  std::vector<int> members;
  for (int l = 0; l < topology.ranks_per_node(); ++l) members.push_back(topology.rank_of(node, l));
  PIPER_ASSIGN_OR_RETURN(context->node_, group.split(members, group.name() + "/node" + std::to_string(node)));
  return context;
}

namespace {

constexpr int kRemoteDirectTag = 3;  // not used by halo_engine.cc (1, 2, 1000+, 17000+)

// Whether a block between ranks of different nodes bypasses the proxies (HaloContext::direct_pair_bytes = threshold;
// 0 batches every block). Both ends decide from the block's size alone, which both know.
bool direct_block(size_t bytes, size_t threshold) { return threshold > 0 && bytes >= threshold; }

// Plain byte blocks. Tables sizes_send_[g][p] / sizes_recv_[g][p] hold the counts of local rank g of this node.
// A block between different nodes of at least `direct` bytes (direct > 0) is not part of the exchange
// (halo_all_to_all_v sends it directly); when a piece or a final receive then skips blocks, it is packed into
// or unpacked from scratch instead of aliasing the caller's buffers.
class BlockPayload : public HaloPayload {
 public:
  BlockPayload(const NodeTopology& t, int me, const uint8_t* send, const std::vector<size_t>& sdispl, uint8_t* recv,
               const std::vector<size_t>& rdispl, std::vector<uint64_t> table, size_t direct, HaloScratch& scratch)
      : t_(t),
        node_(t.node_of(me)),
        local_(t.local_of(me)),
        send_(send),
        sdispl_(sdispl),
        recv_(recv),
        rdispl_(rdispl),
        table_(std::move(table)),
        direct_(direct),
        scratch_(scratch) {}

  bool is_direct(size_t bytes) const { return direct_block(bytes, direct_); }

  std::span<const uint8_t> direct_send(int h) override { return send_block(t_.rank_of(node_, h), 1); }
  std::span<uint8_t> direct_recv(int h) override {
    int p = t_.rank_of(node_, h);
    return {recv_ + rdispl_[p], rdispl_[p + 1] - rdispl_[p]};
  }
  std::span<const uint8_t> piece(int m) override {
    const int first = t_.rank_of(m, 0), count = t_.ranks_per_node();
    bool skips = false;
    for (int h = 0; h < count; ++h) skips = skips || is_direct(sent(local_, first + h));
    if (!skips) return send_block(first, count);
    std::span<uint8_t> packed = scratch_.take(local_piece_bytes(local_, m));
    size_t offset = 0;
    for (int h = 0; h < count; ++h) {
      size_t bytes = sent(local_, first + h);
      if (is_direct(bytes) || bytes == 0) continue;
      std::memcpy(packed.data() + offset, send_ + sdispl_[first + h], bytes);
      offset += bytes;
    }
    return packed;
  }
  size_t local_piece_bytes(int g, int m) override {
    size_t total = 0;
    for (int h = 0; h < t_.ranks_per_node(); ++h) total += batched(sent(g, t_.rank_of(m, h)));
    return total;
  }
  size_t remote_piece_bytes(int n, int g) override {
    size_t total = 0;
    for (int h = 0; h < t_.ranks_per_node(); ++h) total += batched(received(h, t_.rank_of(n, g)));
    return total;
  }
  size_t scatter_bytes(int n, int lane, int h) override {
    size_t total = 0;
    for (int i = 0; i < t_.lane_width(); ++i) total += batched(received(h, t_.rank_of(n, lane * t_.lane_width() + i)));
    return total;
  }
  void scatter(int n, int lane, std::span<const std::span<const uint8_t>> pieces,
               std::span<const std::span<uint8_t>> out) override {
    std::vector<size_t> filled(out.size(), 0);
    for (size_t i = 0; i < pieces.size(); ++i) {
      int src = t_.rank_of(n, lane * t_.lane_width() + static_cast<int>(i));
      size_t offset = 0;
      for (int h = 0; h < t_.ranks_per_node(); ++h) {
        size_t bytes = batched(received(h, src));
        if (bytes > 0) std::memcpy(out[h].data() + filled[h], pieces[i].data() + offset, bytes);
        filled[h] += bytes;
        offset += bytes;
      }
    }
  }
  std::span<uint8_t> final_recv(int n, int lane) override {
    const int first = t_.rank_of(n, lane * t_.lane_width()), last = first + t_.lane_width();
    bool skips = false;
    for (int src = first; src < last; ++src) skips = skips || is_direct(received(local_, src));
    if (!skips) return {recv_ + rdispl_[first], rdispl_[last] - rdispl_[first]};
    std::span<uint8_t> staged = scratch_.take(scatter_bytes(n, lane, local_));
    unpack_.push_back(Unpack{first, last, staged});
    return staged;
  }
  // After the exchange: moves the batched blocks of staged final receives to their places.
  void finish() {
    for (const Unpack& u : unpack_) {
      size_t offset = 0;
      for (int src = u.first; src < u.last; ++src) {
        size_t bytes = batched(received(local_, src));
        if (bytes == 0) continue;
        std::memcpy(recv_ + rdispl_[src], u.staged.data() + offset, bytes);
        offset += bytes;
      }
    }
  }

 private:
  struct Unpack {
    int first, last;
    std::span<uint8_t> staged;
  };
  size_t batched(size_t bytes) const { return is_direct(bytes) ? 0 : bytes; }
  std::span<const uint8_t> send_block(int first, int count) const {
    return {send_ + sdispl_[first], sdispl_[first + count] - sdispl_[first]};
  }
  size_t sent(int g, int p) const { return table_[(static_cast<size_t>(g) * 2) * t_.group_size() + p]; }
  size_t received(int g, int p) const { return table_[(static_cast<size_t>(g) * 2 + 1) * t_.group_size() + p]; }

  const NodeTopology& t_;
  int node_, local_;
  const uint8_t* send_;
  const std::vector<size_t>& sdispl_;
  uint8_t* recv_;
  const std::vector<size_t>& rdispl_;
  std::vector<uint64_t> table_;
  size_t direct_;
  HaloScratch& scratch_;
  std::vector<Unpack> unpack_;
};

}  // namespace

Status halo_all_to_all_v(HaloContext& context, const void* send, std::span<const size_t> send_bytes, void* recv,
                         std::span<const size_t> recv_bytes, double timeout_s) {
  Communicator& comm = context.data();
  const NodeTopology& t = context.topology();
  PIPER_ASSIGN_OR_RETURN(auto sdispl, displacements(comm, send_bytes, "halo all_to_all_v send"));
  PIPER_ASSIGN_OR_RETURN(auto rdispl, displacements(comm, recv_bytes, "halo all_to_all_v recv"));
  const int me = comm.rank(), p = comm.size();
  if (send_bytes[me] != recv_bytes[me]) {
    return invalid_argument("halo all_to_all_v: rank " + std::to_string(me) + " sends itself " +
                            std::to_string(send_bytes[me]) + " bytes but expects " + std::to_string(recv_bytes[me]));
  }
  const auto start = std::chrono::steady_clock::now();
  context.last_stats() = HaloExchangeStats{};
  HaloExchangeStats& stats = context.last_stats();
  const auto* src = static_cast<const uint8_t*>(send);
  auto* dst = static_cast<uint8_t*>(recv);
  // Large blocks between nodes: straight to their destination. Whether a block is direct depends only on its
  // own size, which both ends know, so they are posted first, before the node's size exchange, and overlap it
  // and the batched exchange of the smaller blocks (every test of the engine progresses them too). Sends
  // before receives, as in pairwise_all_to_all_v (see its header: with receives first, OpenMPI's TCP
  // rendezvous serializes the two directions of a node pair).
  const size_t direct_bytes = context.direct_pair_bytes();
  auto remote_direct = [&](int peer, size_t bytes) {
    return t.node_of(peer) != t.node_of(me) && direct_block(bytes, direct_bytes);
  };
  std::vector<Handle> direct;
  for (int i = 1; i < p; ++i) {
    int peer = (me + i) % p;
    if (!remote_direct(peer, send_bytes[peer])) continue;
    PIPER_ASSIGN_OR_RETURN(Handle s, comm.isend(src + sdispl[peer], send_bytes[peer], peer, kRemoteDirectTag));
    direct.push_back(std::move(s));
    stats.messages_inter += 1;
    stats.bytes_inter += static_cast<int64_t>(send_bytes[peer]);
  }
  for (int i = 1; i < p; ++i) {
    int peer = (me + p - i) % p;
    if (!remote_direct(peer, recv_bytes[peer])) continue;
    PIPER_ASSIGN_OR_RETURN(Handle r, comm.irecv(dst + rdispl[peer], recv_bytes[peer], peer, kRemoteDirectTag));
    direct.push_back(std::move(r));
  }
  // Size tables of the node: for each local rank, its P send counts then its P receive counts.
  std::vector<uint64_t> mine(2 * p);
  for (int i = 0; i < p; ++i) {
    mine[i] = send_bytes[i];
    mine[p + i] = recv_bytes[i];
  }
  std::vector<uint64_t> table(mine.size() * t.ranks_per_node());
  PIPER_ASSIGN_OR_RETURN(Handle h, context.node().all_gather(mine.data(), table.data(), mine.size() * 8));
  PIPER_RETURN_IF_ERROR(context.node().wait(h, timeout_s));
  context.scratch().reset();
  stats.metadata_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (send_bytes[me] > 0) std::memcpy(dst + rdispl[me], src + sdispl[me], send_bytes[me]);
  BlockPayload payload(t, me, src, sdispl, dst, rdispl, std::move(table), direct_bytes, context.scratch());
  // The engine adds its own messages to the counts of the direct sends.
  PIPER_RETURN_IF_ERROR(run_halo_exchange(comm, t, payload, timeout_s, &context.scratch(), &stats));
  PIPER_RETURN_IF_ERROR(comm.wait_all(direct, timeout_s));
  payload.finish();
  return ok_status();
}

}  // namespace piper::comm
