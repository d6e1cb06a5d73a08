// HALO MoE dispatch: a token crosses the network once per destination node (see moe_dispatch.h).
#include <chrono>
#include <cstring>
#include <vector>

#include "piper/base/check.h"
#include "piper/comm/algorithms/halo_engine.h"
#include "piper/comm/algorithms/moe_dispatch.h"

namespace piper::comm {
namespace {

// A piece for node m is [T tokens][T x G multiplicities]: byte h of a token's list says how many of its top-k
// slots go to local rank h of node m. Metadata table (all ranks): P row counts, then N token counts per node.
// Every buffer is sized from the table first and filled in place (no growing vectors), from the scratch arena.
class TokenPayload : public HaloPayload {
 public:
  TokenPayload(const NodeTopology& t, int me, std::vector<uint64_t> table, DispatchResult* result)
      : t_(t), me_(me), node_(t.node_of(me)), table_(std::move(table)), result_(result) {}

  void pack(const uint8_t* tokens, size_t token_bytes, const MoeRouting& routing, HaloScratch& scratch) {
    tb_ = token_bytes;
    const int p = t_.group_size(), g_count = t_.ranks_per_node(), nodes = t_.num_nodes();
    rdispl_.assign(p + 1, 0);
    result_->rows_from.clear();
    for (int s = 0; s < p; ++s) {
      result_->rows_from.push_back(static_cast<int64_t>(rows(s, me_)));
      rdispl_[s + 1] = rdispl_[s] + rows(s, me_) * tb_;
    }
    result_->rows.resize(rdispl_[p]);
    direct_.assign(g_count, {});
    for (int h = 0; h < g_count; ++h) {
      if (h != t_.local_of(me_)) direct_[h] = scratch.take(rows(me_, t_.rank_of(node_, h)) * tb_);
    }
    pieces_.assign(nodes, {});
    for (int m = 0; m < nodes; ++m) {
      if (m != node_) pieces_[m] = scratch.take(tokens_to_node(me_, m) * (tb_ + g_count));
    }
    std::vector<size_t> direct_fill(g_count, 0), token_fill(nodes, 0);
    std::vector<uint8_t> per_local(static_cast<size_t>(nodes) * g_count);
    uint8_t* self = result_->rows.data() + rdispl_[me_];
    for (int64_t tok = 0; tok < routing.num_tokens; ++tok) {
      const uint8_t* row = tokens + tok * tb_;
      std::fill(per_local.begin(), per_local.end(), 0);
      for (int j = 0; j < routing.top_k; ++j) {
        int d = routing.dest_ranks[tok * routing.top_k + j];
        if (d < 0) continue;
        if (d == me_) {
          std::memcpy(self, row, tb_);
          self += tb_;
        } else if (t_.node_of(d) == node_) {
          std::memcpy(direct_[t_.local_of(d)].data() + direct_fill[t_.local_of(d)], row, tb_);
          direct_fill[t_.local_of(d)] += tb_;
        } else {
          ++per_local[static_cast<size_t>(t_.node_of(d)) * g_count + t_.local_of(d)];
        }
      }
      for (int m = 0; m < nodes; ++m) {
        const uint8_t* list = per_local.data() + static_cast<size_t>(m) * g_count;
        bool any = false;
        for (int h = 0; h < g_count; ++h) any = any || list[h] != 0;
        if (!any) continue;
        const size_t num = tokens_to_node(me_, m), i = token_fill[m]++;
        std::memcpy(pieces_[m].data() + i * tb_, row, tb_);
        std::memcpy(pieces_[m].data() + num * tb_ + i * g_count, list, g_count);
      }
    }
    for (int m = 0; m < nodes; ++m) {
      PIPER_CHECK(m == node_ || token_fill[m] == tokens_to_node(me_, m), "halo dispatch: token count mismatch");
    }
  }

  std::span<const uint8_t> direct_send(int h) override { return direct_[h]; }
  std::span<uint8_t> direct_recv(int h) override { return out_span(t_.rank_of(node_, h), 1); }
  std::span<const uint8_t> piece(int m) override { return pieces_[m]; }
  size_t local_piece_bytes(int g, int m) override { return tokens_to_node(t_.rank_of(node_, g), m) * (tb_ + gpn()); }
  size_t remote_piece_bytes(int n, int g) override { return tokens_to_node(t_.rank_of(n, g), node_) * (tb_ + gpn()); }
  size_t scatter_bytes(int n, int lane, int h) override {
    size_t total = 0;
    for (int i = 0; i < t_.lane_width(); ++i) total += rows(t_.rank_of(n, lane * t_.lane_width() + i), t_.rank_of(node_, h));
    return total * tb_;
  }
  void scatter(int, int, std::span<const std::span<const uint8_t>> pieces,
               std::span<const std::span<uint8_t>> out) override {
    std::vector<size_t> filled(out.size(), 0);
    for (std::span<const uint8_t> piece : pieces) {
      size_t num = piece.size() / (tb_ + gpn());
      const uint8_t* lists = piece.data() + num * tb_;
      for (size_t tok = 0; tok < num; ++tok) {
        const uint8_t* row = piece.data() + tok * tb_;
        for (int h = 0; h < gpn(); ++h) {
          for (int c = 0; c < lists[tok * gpn() + h]; ++c) {
            std::memcpy(out[h].data() + filled[h], row, tb_);
            filled[h] += tb_;
          }
        }
      }
    }
  }
  std::span<uint8_t> final_recv(int n, int lane) override {
    return out_span(t_.rank_of(n, lane * t_.lane_width()), t_.lane_width());
  }

 private:
  int gpn() const { return t_.ranks_per_node(); }
  size_t stride() const { return static_cast<size_t>(t_.group_size() + t_.num_nodes()); }
  size_t rows(int src, int dst) const { return table_[src * stride() + dst]; }
  size_t tokens_to_node(int src, int node) const { return table_[src * stride() + t_.group_size() + node]; }
  std::span<uint8_t> out_span(int first, int count) {
    return {result_->rows.data() + rdispl_[first], rdispl_[first + count] - rdispl_[first]};
  }

  const NodeTopology& t_;
  int me_, node_;
  size_t tb_ = 0;
  std::vector<uint64_t> table_;
  DispatchResult* result_;
  std::vector<size_t> rdispl_;
  std::vector<std::span<uint8_t>> direct_;
  std::vector<std::span<uint8_t>> pieces_;
};

}  // namespace

Result<DispatchResult> halo_dispatch(HaloContext& context, const void* tokens, size_t token_bytes,
                                     const MoeRouting& routing, double timeout_s) {
  DispatchResult result;
  PIPER_RETURN_IF_ERROR(halo_dispatch(context, tokens, token_bytes, routing, timeout_s, &result));
  return result;
}

Status halo_dispatch(HaloContext& context, const void* tokens, size_t token_bytes, const MoeRouting& routing,
                     double timeout_s, DispatchResult* out) {
  Communicator& comm = context.data();
  const NodeTopology& t = context.topology();
  PIPER_RETURN_IF_ERROR(routing.validate(comm.size()));
  const auto start = std::chrono::steady_clock::now();
  const int p = t.group_size(), nodes = t.num_nodes(), me = comm.rank();
  // Metadata of this rank: rows per destination rank, distinct tokens per destination node (remote ones).
  std::vector<uint64_t> mine(p + nodes, 0);
  std::vector<char> hit(nodes);
  for (int64_t tok = 0; tok < routing.num_tokens; ++tok) {
    std::fill(hit.begin(), hit.end(), 0);
    for (int j = 0; j < routing.top_k; ++j) {
      int d = routing.dest_ranks[tok * routing.top_k + j];
      if (d < 0) continue;
      ++mine[d];
      int m = t.node_of(d);
      if (m != t.node_of(me) && !hit[m]) {
        hit[m] = 1;
        ++mine[p + m];
      }
    }
  }
  std::vector<uint64_t> table(mine.size() * p);
  PIPER_ASSIGN_OR_RETURN(Handle h, comm.all_gather(mine.data(), table.data(), mine.size() * sizeof(uint64_t)));
  PIPER_RETURN_IF_ERROR(comm.wait(h, timeout_s));
  HaloExchangeStats& stats = context.last_stats();
  stats = HaloExchangeStats{};
  stats.metadata_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  context.scratch().reset();
  TokenPayload payload(t, me, std::move(table), out);
  payload.pack(static_cast<const uint8_t*>(tokens), token_bytes, routing, context.scratch());
  stats.pack_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - stats.metadata_s;
  return run_halo_exchange(comm, t, payload, timeout_s, &context.scratch(), &stats);
}

}  // namespace piper::comm
