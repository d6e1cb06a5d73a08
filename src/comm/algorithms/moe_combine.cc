#include "piper/comm/algorithms/moe_combine.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "piper/comm/algorithms/pairwise_all_to_all.h"
#include "piper/comm/heartbeat.h"

namespace piper::comm {
namespace {

// Step 2 metadata: the slot of a token as seen by the reducer of one remote node.
struct SlotRef {
  int32_t local;  // local rank of the slot's expert on the reducer's node, -1 when the slot is elsewhere
  float weight;
};
static_assert(sizeof(SlotRef) == 8);

Status check_inputs(const MoeRouting& routing, int group_size, int64_t hidden, std::span<const float> weights) {
  PIPER_RETURN_IF_ERROR(routing.validate(group_size));
  if (hidden < 1) return invalid_argument("moe combine: hidden=" + std::to_string(hidden) + " must be >= 1");
  const size_t slots = static_cast<size_t>(routing.num_tokens) * routing.top_k;
  if (weights.size() != slots) {
    return invalid_argument("moe combine: expected num_tokens * top_k = " + std::to_string(slots) +
                            " routing weights, got " + std::to_string(weights.size()));
  }
  return ok_status();
}

Status check_rows(std::span<const float> rows, uint64_t received_rows, int64_t hidden) {
  if (rows.size() != received_rows * static_cast<uint64_t>(hidden)) {
    return invalid_argument("moe combine: expert_rows has " + std::to_string(rows.size()) + " floats but this rank " +
                            "received " + std::to_string(received_rows) + " rows in the dispatch (expected rows * " +
                            "hidden = " + std::to_string(received_rows * hidden) +
                            "); pass the expert outputs in dispatch order");
  }
  return ok_status();
}

Status exchange(Communicator& comm, const void* send, std::span<const size_t> send_bytes, void* recv,
                std::span<const size_t> recv_bytes, double timeout_s) {
  PIPER_ASSIGN_OR_RETURN(Handle h, comm.all_to_all_v(send, send_bytes, recv, recv_bytes));
  return comm.wait(h, timeout_s);
}

void add_scaled(float* acc, const float* row, float w, int64_t hidden) {
  for (int64_t c = 0; c < hidden; ++c) acc[c] += w * row[c];
}

}  // namespace

Result<std::vector<float>> flat_combine(Communicator& comm, std::span<const float> expert_rows, int64_t hidden,
                                        const MoeRouting& routing, std::span<const float> topk_weights,
                                        FlatDispatchKind kind, double timeout_s,
                                        std::span<const int64_t> dispatch_rows_from) {
  PIPER_RETURN_IF_ERROR(check_inputs(routing, comm.size(), hidden, topk_weights));
  const int p = comm.size(), k = routing.top_k;
  const std::vector<uint64_t> rows_to = rows_to_ranks(routing, p);
  PIPER_ASSIGN_OR_RETURN(std::vector<uint64_t> rows_from,
                         rows_from_sources(comm, rows_to, dispatch_rows_from, timeout_s));
  uint64_t received = 0, sent = 0;
  std::vector<size_t> send_bytes(p), recv_bytes(p);
  std::vector<uint64_t> first_row(p);  // first row of expert rank d's block in `back`
  for (int r = 0; r < p; ++r) {
    received += rows_from[r];
    first_row[r] = sent;
    sent += rows_to[r];
    send_bytes[r] = rows_from[r] * hidden * sizeof(float);
    recv_bytes[r] = rows_to[r] * hidden * sizeof(float);
  }
  PIPER_RETURN_IF_ERROR(check_rows(expert_rows, received, hidden));
  std::vector<float> back(sent * hidden);
  if (kind == FlatDispatchKind::kPairwise) {
    PIPER_RETURN_IF_ERROR(
        pairwise_all_to_all_v(comm, expert_rows.data(), send_bytes, back.data(), recv_bytes, timeout_s));
  } else {
    PIPER_RETURN_IF_ERROR(exchange(comm, expert_rows.data(), send_bytes, back.data(), recv_bytes, timeout_s));
  }
  std::vector<float> y(static_cast<size_t>(routing.num_tokens) * hidden, 0.0f);
  for (int64_t t = 0; t < routing.num_tokens; ++t) {
    for (int j = 0; j < k; ++j) {
      int d = routing.dest_ranks[t * k + j];
      if (d < 0) continue;
      add_scaled(y.data() + t * hidden, back.data() + first_row[d]++ * hidden, topk_weights[t * k + j], hidden);
    }
  }
  return y;
}

namespace {

constexpr int kMetaTag = 21, kRowsTag = 22, kRawTag = 23, kPartialTag = 24;  // halo_engine.cc uses 1-3, 1000+

// One HALO combine on this rank. Every message is point to point on the context's data communicator, posted as
// soon as its inputs exist: slot metadata to the reducers, expert rows straight from expert_rows to their reducer
// and to same-node sources (no packing), and each reducer's partials the moment its group's metadata and rows are
// in. A reducer serves groups (remote node n, lane l): the lane's W sources, whose rows lie contiguously in every
// expert rank's expert_rows.
class HaloCombine {
 public:
  HaloCombine(HaloContext& context, std::span<const float> rows, int64_t hidden, const MoeRouting& routing,
              std::span<const float> weights)
      : comm_(context.data()),
        t_(context.topology()),
        scratch_(context.scratch()),
        stats_(context.last_stats()),
        rows_(rows),
        hidden_(hidden),
        routing_(routing),
        weights_(weights),
        me_(comm_.rank()),
        node_(t_.node_of(me_)),
        local_(t_.local_of(me_)) {}

  Result<std::vector<float>> run(double timeout_s) {
    start_ = Clock::now();
    stats_ = HaloExchangeStats{};
    PIPER_RETURN_IF_ERROR(gather_counts(timeout_s));
    stats_.metadata_s = since_start();
    scratch_.reset();
    PIPER_RETURN_IF_ERROR(post_sends());
    PIPER_RETURN_IF_ERROR(post_receives());
    stats_.posted_s = since_start();
    PIPER_RETURN_IF_ERROR(progress(timeout_s));
    std::vector<float> y = weighted_sum();
    stats_.total_s = since_start();
    return y;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    Handle handle;
    const char* phase;
    int peer;
  };
  // A group (remote node n, lane l) this rank reduces.
  struct Group {
    int first = 0;                              // group rank of the lane's first source
    std::vector<std::span<const SlotRef>> meta;  // per source of the lane
    std::vector<const float*> rows;              // per local expert rank: the lane's rows it holds
    std::vector<size_t> inputs;                  // pending indices of the receives the reduction waits for
    bool reduced = false;
  };

  double since_start() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  uint64_t rows(int s, int r) const { return table_[s * stride_ + r]; }
  uint64_t tokens_to(int s, int m) const { return table_[s * stride_ + t_.group_size() + m]; }
  int width() const { return t_.lane_width(); }
  // The rank of node m that reduces the slots of source s (the receive proxy of s's lane in the dispatch).
  int reducer(int s, int m) const { return t_.rank_of(m, t_.recv_proxy(t_.node_of(s), m, t_.lane_of(t_.local_of(s)))); }
  const float* my_rows(int s) const { return rows_.data() + first_row_[s] * hidden_; }
  // Rows of the lane's sources [first, first + W) held by expert rank e (contiguous in e's expert_rows).
  uint64_t lane_rows(int first, int e) const {
    uint64_t n = 0;
    for (int i = 0; i < width(); ++i) n += rows(first + i, e);
    return n;
  }

  template <typename T>
  std::span<T> take(size_t count) {
    std::span<uint8_t> b = scratch_.take(count * sizeof(T));
    return {reinterpret_cast<T*>(b.data()), count};
  }

  Status post(Result<Handle> h, const char* phase, int peer) {
    PIPER_RETURN_IF_ERROR(h.status());
    pending_.push_back(Pending{std::move(h).value(), phase, peer});
    return ok_status();
  }
  Status send(const void* data, size_t bytes, int peer, int tag, const char* phase) {
    if (bytes == 0) return ok_status();
    const bool inter = t_.node_of(peer) != node_;
    (inter ? stats_.messages_inter : stats_.messages_intra) += 1;
    (inter ? stats_.bytes_inter : stats_.bytes_intra) += static_cast<int64_t>(bytes);
    return post(comm_.isend(data, bytes, peer, tag), phase, peer);
  }
  Status recv(void* data, size_t bytes, int peer, int tag, const char* phase) {
    if (bytes == 0) return ok_status();
    return post(comm_.irecv(data, bytes, peer, tag), phase, peer);
  }

  // Row counts per destination rank and distinct tokens per remote node, of every rank.
  Status gather_counts(double timeout_s) {
    const int p = t_.group_size(), nodes = t_.num_nodes(), k = routing_.top_k;
    stride_ = static_cast<size_t>(p + nodes);
    std::vector<uint64_t> mine(stride_, 0);
    std::vector<char> hit(nodes);
    for (int64_t tok = 0; tok < routing_.num_tokens; ++tok) {
      std::fill(hit.begin(), hit.end(), 0);
      for (int j = 0; j < k; ++j) {
        const int d = routing_.dest_ranks[tok * k + j];
        if (d < 0) continue;
        ++mine[d];
        if (t_.node_of(d) != node_ && !hit[t_.node_of(d)]) {
          hit[t_.node_of(d)] = 1;
          ++mine[p + t_.node_of(d)];
        }
      }
    }
    table_.resize(stride_ * p);
    PIPER_ASSIGN_OR_RETURN(Handle h, comm_.all_gather(mine.data(), table_.data(), stride_ * sizeof(uint64_t)));
    PIPER_RETURN_IF_ERROR(comm_.wait(h, timeout_s));
    first_row_.assign(p + 1, 0);
    for (int s = 0; s < p; ++s) first_row_[s + 1] = first_row_[s] + rows(s, me_);
    return check_rows(rows_, first_row_[p], hidden_);
  }

  // Slot metadata to the reducers; this rank's expert rows to their reducers (per group) and to same-node sources.
  Status post_sends() {
    const int nodes = t_.num_nodes(), k = routing_.top_k;
    for (int i = 1; i < nodes; ++i) {
      const int m = (node_ + i) % nodes;
      std::span<SlotRef> meta = take<SlotRef>(tokens_to(me_, m) * k);
      size_t filled = 0;
      for (int64_t tok = 0; tok < routing_.num_tokens; ++tok) {
        bool any = false;
        for (int j = 0; j < k; ++j) {
          const int d = routing_.dest_ranks[tok * k + j];
          any = any || (d >= 0 && t_.node_of(d) == m);
        }
        if (!any) continue;
        for (int j = 0; j < k; ++j) {
          const int d = routing_.dest_ranks[tok * k + j];
          const bool here = d >= 0 && t_.node_of(d) == m;
          meta[filled++] = SlotRef{here ? t_.local_of(d) : -1, weights_[tok * k + j]};
        }
      }
      if (filled != meta.size()) return internal_error("moe combine: slot metadata count disagrees with the counts");
      PIPER_RETURN_IF_ERROR(send(meta.data(), meta.size_bytes(), reducer(me_, m), kMetaTag, "slot metadata"));
    }
    const size_t row_bytes = hidden_ * sizeof(float);
    for (int n = 0; n < nodes; ++n) {
      for (int l = 0; l < t_.lanes() && n != node_; ++l) {
        const int first = t_.rank_of(n, l * width()), rho = t_.rank_of(node_, t_.recv_proxy(n, node_, l));
        if (rho != me_) {
          PIPER_RETURN_IF_ERROR(
              send(my_rows(first), lane_rows(first, me_) * row_bytes, rho, kRowsTag, "rows to reducer"));
        }
      }
    }
    for (int g = 0; g < t_.ranks_per_node(); ++g) {
      const int s = t_.rank_of(node_, g);
      if (s != me_) PIPER_RETURN_IF_ERROR(send(my_rows(s), rows(s, me_) * row_bytes, s, kRawTag, "same-node rows"));
    }
    return ok_status();
  }

  bool sends_partial_to(int peer) const {
    for (const Group& grp : groups_) {
      if (!grp.reduced && peer >= grp.first && peer < grp.first + width() && tokens_to(peer, node_) > 0) return true;
    }
    return false;
  }
  Status post_partial_recv(int m) {
    partial_posted_[m] = 1;
    return recv(partial_in_[m].data(), partial_in_[m].size_bytes(), reducer(me_, m), kPartialTag, "partial");
  }

  Status post_receives() {
    const int nodes = t_.num_nodes(), gpn = t_.ranks_per_node(), k = routing_.top_k;
    for (int n = 0; n < nodes; ++n) {
      for (int l = 0; l < t_.lanes() && n != node_; ++l) {
        if (t_.recv_proxy(n, node_, l) != local_) continue;
        Group grp;
        grp.first = t_.rank_of(n, l * width());
        for (int i = 0; i < width(); ++i) {
          const int s = grp.first + i;
          std::span<SlotRef> meta = take<SlotRef>(tokens_to(s, node_) * k);
          grp.inputs.push_back(pending_.size());
          PIPER_RETURN_IF_ERROR(recv(meta.data(), meta.size_bytes(), s, kMetaTag, "slot metadata"));
          if (grp.inputs.back() == pending_.size()) grp.inputs.pop_back();
          grp.meta.push_back(meta);
        }
        for (int g = 0; g < gpn; ++g) {
          const int e = t_.rank_of(node_, g);
          if (e == me_) {
            grp.rows.push_back(my_rows(grp.first));
            continue;
          }
          std::span<float> in = take<float>(lane_rows(grp.first, e) * hidden_);
          grp.inputs.push_back(pending_.size());
          PIPER_RETURN_IF_ERROR(recv(in.data(), in.size_bytes(), e, kRowsTag, "rows to reducer"));
          if (grp.inputs.back() == pending_.size()) grp.inputs.pop_back();
          grp.rows.push_back(in.data());
        }
        groups_.push_back(std::move(grp));
      }
    }
    raw_in_.assign(gpn, nullptr);
    for (int g = 0; g < gpn; ++g) {
      const int e = t_.rank_of(node_, g);
      if (e == me_) {
        raw_in_[g] = my_rows(me_);
        continue;
      }
      std::span<float> in = take<float>(rows(me_, e) * hidden_);
      PIPER_RETURN_IF_ERROR(recv(in.data(), in.size_bytes(), e, kRawTag, "same-node rows"));
      raw_in_[g] = in.data();
    }
    partial_in_.assign(nodes, {});
    partial_posted_.assign(nodes, 0);
    for (int m = 0; m < nodes; ++m) {
      if (m == node_) continue;
      partial_in_[m] = take<float>(tokens_to(me_, m) * hidden_);
      // Sends before receives across nodes: a partial from a rank this rank also sends partials to is received only
      // once those are posted (see pairwise_all_to_all.h: OpenMPI's TCP rendezvous would serialize the directions).
      if (!sends_partial_to(reducer(me_, m))) PIPER_RETURN_IF_ERROR(post_partial_recv(m));
    }
    return ok_status();
  }

  // partial(t) = sum over t's slots on this node, in slot order, of w * row; one partial per (source, token).
  Status reduce(Group& grp) {
    const int k = routing_.top_k;
    std::vector<const float*> cursor = grp.rows;
    for (int i = 0; i < width(); ++i) {
      const int s = grp.first + i;
      const uint64_t num = tokens_to(s, node_);
      std::span<float> out = take<float>(num * hidden_);
      std::fill(out.begin(), out.end(), 0.0f);
      const SlotRef* ref = grp.meta[i].data();
      for (uint64_t tok = 0; tok < num; ++tok, ref += k) {
        for (int j = 0; j < k; ++j) {
          if (ref[j].local < 0) continue;
          if (ref[j].local >= t_.ranks_per_node()) return internal_error("moe combine: bad slot metadata");
          add_scaled(out.data() + tok * hidden_, cursor[ref[j].local], ref[j].weight, hidden_);
          cursor[ref[j].local] += hidden_;
        }
      }
      PIPER_RETURN_IF_ERROR(send(out.data(), out.size_bytes(), s, kPartialTag, "partial"));
    }
    for (int g = 0; g < t_.ranks_per_node(); ++g) {
      if (cursor[g] != grp.rows[g] + lane_rows(grp.first, t_.rank_of(node_, g)) * hidden_) {
        return internal_error("moe combine: slot metadata and row counts disagree");
      }
    }
    grp.reduced = true;
    for (int m = 0; m < t_.num_nodes(); ++m) {
      if (m != node_ && !partial_posted_[m] && !sends_partial_to(reducer(me_, m))) {
        PIPER_RETURN_IF_ERROR(post_partial_recv(m));
      }
    }
    return ok_status();
  }

  Status progress(double timeout_s) {
    const auto deadline =
        start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    auto idle_since = Clock::now();
    while (true) {
      bool moved = false;
      for (Group& grp : groups_) {
        if (grp.reduced) continue;
        bool ready = true;
        for (size_t idx : grp.inputs) {
          PIPER_ASSIGN_OR_RETURN(bool done, comm_.test(pending_[idx].handle));
          ready = ready && done;
        }
        if (!ready) continue;
        PIPER_RETURN_IF_ERROR(reduce(grp));
        moved = true;
      }
      while (first_ < pending_.size()) {
        PIPER_ASSIGN_OR_RETURN(bool done, comm_.test(pending_[first_].handle));
        if (!done) break;
        ++first_;
        moved = true;
      }
      if (moved) {
        idle_since = Clock::now();
        continue;
      }
      bool all_reduced = true;
      for (const Group& grp : groups_) all_reduced = all_reduced && grp.reduced;
      if (first_ == pending_.size() && all_reduced) return ok_status();
      if (Status live = peer_liveness(); !live.ok()) {
        return live.with_context("halo combine on group '" + comm_.name() + "' rank " + std::to_string(me_));
      }
      const auto now = Clock::now();
      if (now >= deadline) return timeout_error(std::chrono::duration<double>(now - start_).count());
      ++stats_.idle_rounds;
      idle_while_polling(std::chrono::duration<double>(now - idle_since).count());
    }
  }

  Status timeout_error(double waited_s) const {
    std::string what = "halo combine on group '" + comm_.name() + "' rank " + std::to_string(me_) +
                       " timed out after " + std::to_string(waited_s) + " s; still waiting for:";
    for (const Pending& p : pending_) {
      if (!p.handle.done()) what += std::string(" ") + p.phase + " " + to_string(p.handle.op()) + " with rank " +
                                    std::to_string(p.peer) + ";";
    }
    return deadline_exceeded(what + " check that every rank of the group calls the combine with its dispatch's "
                             "routing");
  }

  // y[t] = sum over slots in slot order; a same-node slot adds w * row, the first slot on a remote node adds that
  // node's partial.
  std::vector<float> weighted_sum() {
    const int k = routing_.top_k;
    std::vector<float> y(static_cast<size_t>(routing_.num_tokens) * hidden_, 0.0f);
    std::vector<const float*> raw = raw_in_;
    std::vector<const float*> partial(t_.num_nodes());
    for (int m = 0; m < t_.num_nodes(); ++m) partial[m] = partial_in_[m].data();
    std::vector<char> hit(t_.num_nodes());
    for (int64_t tok = 0; tok < routing_.num_tokens; ++tok) {
      std::fill(hit.begin(), hit.end(), 0);
      float* acc = y.data() + tok * hidden_;
      for (int j = 0; j < k; ++j) {
        const int d = routing_.dest_ranks[tok * k + j];
        if (d < 0) continue;
        const int m = t_.node_of(d);
        if (m == node_) {
          add_scaled(acc, raw[t_.local_of(d)], weights_[tok * k + j], hidden_);
          raw[t_.local_of(d)] += hidden_;
        } else if (!hit[m]) {
          hit[m] = 1;
          for (int64_t c = 0; c < hidden_; ++c) acc[c] += partial[m][c];
          partial[m] += hidden_;
        }
      }
    }
    return y;
  }

  Communicator& comm_;
  const NodeTopology& t_;
  HaloScratch& scratch_;
  HaloExchangeStats& stats_;
  std::span<const float> rows_;
  int64_t hidden_;
  const MoeRouting& routing_;
  std::span<const float> weights_;
  int me_, node_, local_;
  Clock::time_point start_;
  size_t stride_ = 0;
  std::vector<uint64_t> table_, first_row_;
  std::vector<Pending> pending_;
  size_t first_ = 0;  // every pending_[i] with i < first_ is complete
  std::vector<Group> groups_;
  std::vector<const float*> raw_in_;
  std::vector<std::span<float>> partial_in_;
  std::vector<char> partial_posted_;
};

}  // namespace

Result<std::vector<float>> halo_combine(HaloContext& context, std::span<const float> expert_rows, int64_t hidden,
                                        const MoeRouting& routing, std::span<const float> topk_weights,
                                        double timeout_s) {
  PIPER_RETURN_IF_ERROR(check_inputs(routing, context.data().size(), hidden, topk_weights));
  HaloCombine combine(context, expert_rows, hidden, routing, topk_weights);
  return combine.run(timeout_s);
}

CombineTraffic combine_traffic(const NodeTopology& t, int rank, int64_t hidden, const MoeRouting& routing) {
  CombineTraffic traffic;
  const int node = t.node_of(rank);
  const int64_t row_bytes = hidden * static_cast<int64_t>(sizeof(float));
  std::vector<char> hit(t.num_nodes());
  for (int64_t tok = 0; tok < routing.num_tokens; ++tok) {
    std::fill(hit.begin(), hit.end(), 0);
    for (int j = 0; j < routing.top_k; ++j) {
      int d = routing.dest_ranks[tok * routing.top_k + j];
      if (d < 0 || t.node_of(d) == node) continue;
      traffic.flat_internode_bytes += row_bytes;
      if (!hit[t.node_of(d)]) {
        hit[t.node_of(d)] = 1;
        traffic.halo_internode_bytes += row_bytes + routing.top_k * static_cast<int64_t>(sizeof(SlotRef));
      }
    }
  }
  return traffic;
}

}  // namespace piper::comm
