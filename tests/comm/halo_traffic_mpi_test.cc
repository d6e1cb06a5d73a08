// The one HALO model against the runtime: on 2-8 ranks, the messages the runtime's HALO dispatch and combine send
// (every point-to-point message and every block of an all-to-all-v, recorded per destination rank by a wrapping
// communicator, the way `piper bench comm` counts HaloExchangeStats) equal, per (source, destination) pair, in
// bytes and in count, both the traffic model (cost/halo_traffic.h) and the simulator's flows built from it
// (sim/collectives.h add_halo_traffic). The routing enumerates every top-k subset (and every group choice for
// group-limited routing) once per rank, so the model's expectations are exact counts.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "comm_test_util.h"
#include "piper/comm/algorithms/moe_combine.h"
#include "piper/comm/algorithms/moe_dispatch.h"
#include "piper/cost/halo_traffic.h"
#include "piper/sim/collectives.h"
#include "piper/sim/network.h"

namespace piper::comm {
namespace {

using testing::kTestTimeoutS;

// Per destination world rank: bytes and non-empty messages this rank sent.
struct SentLog {
  std::map<int, std::pair<double, int>> to;
  void add(int dst, size_t bytes) {
    if (bytes == 0) return;
    to[dst].first += static_cast<double>(bytes);
    to[dst].second += 1;
  }
};

// Forwards everything to `inner`, logging point-to-point sends and all-to-all-v blocks (not to itself). Splits and
// duplicates log into the same SentLog. The count all-gathers are not logged (the model leaves them out).
class Recording : public Communicator {
 public:
  Recording(std::unique_ptr<Communicator> inner, std::shared_ptr<SentLog> log)
      : Communicator(inner->name(), inner->world_ranks()), inner_(std::move(inner)), log_(std::move(log)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  MemoryKind memory_kind() const override { return inner_->memory_kind(); }
  Result<std::unique_ptr<Communicator>> split(const std::vector<int>& ranks, const std::string& name) override {
    PIPER_ASSIGN_OR_RETURN(auto c, inner_->split(ranks, name));
    if (!c) return c;
    return std::unique_ptr<Communicator>(new Recording(std::move(c), log_));
  }
  Result<std::unique_ptr<Communicator>> dup(const std::string& name) override {
    PIPER_ASSIGN_OR_RETURN(auto c, inner_->dup(name));
    return std::unique_ptr<Communicator>(new Recording(std::move(c), log_));
  }
  Result<Handle> isend(const void* data, size_t bytes, int peer, int tag) override {
    if (peer != rank()) log_->add(world_ranks()[peer], bytes);
    return inner_->isend(data, bytes, peer, tag);
  }
  Result<Handle> irecv(void* data, size_t bytes, int peer, int tag) override { return inner_->irecv(data, bytes, peer, tag); }
  Result<Handle> all_reduce_sum(const float* in, float* out, size_t count) override {
    return inner_->all_reduce_sum(in, out, count);
  }
  Result<Handle> reduce_scatter_sum(const float* in, float* out, size_t count) override {
    return inner_->reduce_scatter_sum(in, out, count);
  }
  Result<Handle> all_gather(const void* in, void* out, size_t bytes) override { return inner_->all_gather(in, out, bytes); }
  Result<Handle> all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                              std::span<const size_t> recv_bytes) override {
    for (int p = 0; p < size(); ++p) {
      if (p != rank()) log_->add(world_ranks()[p], send_bytes[p]);
    }
    return inner_->all_to_all_v(send, send_bytes, recv, recv_bytes);
  }
  Result<Handle> barrier() override { return inner_->barrier(); }

 private:
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<SentLog> log_;
};

// Every token routing of the model, once: all top-k subsets of the experts (of every topk_groups-subset of groups
// when group-limited), in an order rotated by `rank` so that ranks differ.
MoeRouting enumerate_routing(const cost::HaloRouting& r, int ranks, int rank) {
  const int groups = r.num_groups > 1 && r.topk_groups < r.num_groups ? r.num_groups : 1;
  const int chosen = groups == 1 ? 1 : r.topk_groups, size = r.num_experts / groups;
  std::vector<std::vector<int>> tokens;
  std::vector<int> pick;
  auto subsets = [&](const std::vector<int>& pool, int k, auto&& emit) {
    auto rec = [&](auto&& self, size_t from) -> void {
      if (static_cast<int>(pick.size()) == k) return emit(pick);
      for (size_t i = from; i < pool.size(); ++i) {
        pick.push_back(pool[i]);
        self(self, i + 1);
        pick.pop_back();
      }
    };
    rec(rec, 0);
  };
  std::vector<int> all_groups;
  for (int g = 0; g < groups; ++g) all_groups.push_back(g);
  subsets(all_groups, chosen, [&](const std::vector<int>& gs) {
    std::vector<int> experts;
    for (int g : gs) {
      for (int e = g * size; e < (g + 1) * size; ++e) experts.push_back(e);
    }
    std::vector<int> saved = pick;
    pick.clear();
    subsets(experts, r.top_k, [&](const std::vector<int>& slots) { tokens.push_back(slots); });
    pick = saved;
  });
  MoeRouting routing;
  routing.num_tokens = static_cast<int64_t>(tokens.size());
  routing.top_k = r.top_k;
  const int per_rank = r.num_experts / ranks;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::vector<int>& slots = tokens[(t + static_cast<size_t>(rank) * 5) % tokens.size()];
    for (int j = 0; j < r.top_k; ++j) routing.dest_ranks.push_back(slots[(j + rank) % r.top_k] / per_rank);
  }
  return routing;
}

// Same destinations, same message counts, bytes equal up to the model's rounding (probabilities in double).
void expect_equal(const SentLog& got, const SentLog& want, const std::string& what) {
  ASSERT_EQ(got.to.size(), want.to.size()) << what;
  for (const auto& [dst, sent] : want.to) {
    auto it = got.to.find(dst);
    ASSERT_NE(it, got.to.end()) << what << ": nothing to rank " << dst;
    EXPECT_NEAR(it->second.first, sent.first, 1e-9 * sent.first) << what << ": bytes to rank " << dst;
    EXPECT_EQ(it->second.second, sent.second) << what << ": messages to rank " << dst;
  }
}

// The model's and the simulator's messages from `me`, per destination, against what the runtime sent.
void expect_same_sends(const cost::HaloTraffic& model, const cost::HaloGroupShape& g, const SentLog& sent, int me,
                       const std::string& what) {
  SentLog modelled;
  for (const cost::HaloMessage& m : model.messages) {
    if (m.src != me) continue;
    modelled.to[m.dst].first += m.bytes;
    modelled.to[m.dst].second += 1;
  }
  expect_equal(modelled, sent, what + " rank " + std::to_string(me));
  // The simulator's flows of the same traffic, on a cluster of that shape.
  ClusterSpec c;
  c.name = "test";
  c.num_nodes = g.nodes;
  c.node.devices_per_node = g.ranks_per_node;
  c.node.intra = {100e9, 1e-6};
  c.node.nics.assign(g.lanes, NicSpec{10e9, {}});
  c.node.nic_latency_s = 5e-6;
  c.fabric.topology = g.nodes > 1 ? FabricTopology::kFatTree : FabricTopology::kSingleNode;
  sim::Network net = sim::Network::build(c).value();
  sim::FlowSim flows(net.link_bandwidths());
  std::vector<int> devices;
  for (int d = 0; d < g.size(); ++d) devices.push_back(d);
  ASSERT_TRUE(sim::add_halo_traffic(net, &flows, devices, model).ok());
  SentLog simulated;
  for (int f = 0; f < flows.num_flows(); ++f) {
    const sim::FlowSpec& s = flows.flow(f);
    if (s.src_device != me) continue;
    simulated.to[s.dst_device].first += s.bytes;
    simulated.to[s.dst_device].second += 1;
  }
  expect_equal(simulated, sent, what + " (simulator) rank " + std::to_string(me));
}

struct Layout {
  int ranks_per_node, lanes;
};

std::vector<Layout> layouts(int p) {
  std::vector<Layout> out;
  for (int k = 1; k <= p; ++k) {
    if (p % k != 0 || k == p) continue;  // at least two nodes
    for (int lanes = 1; lanes <= k; ++lanes) {
      if (k % lanes == 0) out.push_back({k, lanes});
    }
  }
  return out;
}

TEST(HaloTrafficMpi, DispatchAndCombineSendWhatTheModelSays) {
  auto w = testing::world();
  ASSERT_NE(w, nullptr);
  const int p = w->size(), me = w->rank();
  if (p < 2) GTEST_SKIP() << "needs 2+ ranks";
  for (const cost::HaloRouting& r :
       {cost::HaloRouting{2 * p, 2, 1, 1}, cost::HaloRouting{2 * p, 3, 1, 1}, cost::HaloRouting{2 * p, 2, 4, 2}}) {
    const int experts = r.num_experts;
    if (r.num_groups > 1 && experts % r.num_groups != 0) continue;
    for (const Layout& layout : layouts(p)) {
      const cost::HaloGroupShape g{p / layout.ranks_per_node, layout.ranks_per_node, layout.lanes};
      const std::string what = std::to_string(g.nodes) + " nodes x " + std::to_string(g.ranks_per_node) + ", " +
                               std::to_string(g.lanes) + " lanes, E=" + std::to_string(experts) +
                               " k=" + std::to_string(r.top_k) + " G=" + std::to_string(r.num_groups);
      ASSERT_TRUE(cost::validate_halo(g, r).ok()) << what;
      auto log = std::make_shared<SentLog>();
      auto dup = w->dup("recorded").value();
      Recording rec(std::move(dup), log);
      auto topo = NodeTopology::create(p, layout.ranks_per_node, layout.lanes).value();
      auto ctx = HaloContext::create(rec, topo).value();
      const MoeRouting routing = enumerate_routing(r, p, me);
      const double tokens = static_cast<double>(routing.num_tokens);
      const int64_t hidden = 16;
      const size_t token_bytes = hidden * sizeof(float);
      std::vector<float> x(static_cast<size_t>(routing.num_tokens * hidden), 1.0f);

      log->to.clear();
      auto rows = halo_dispatch(*ctx, x.data(), token_bytes, routing, kTestTimeoutS);
      ASSERT_TRUE(rows.ok()) << rows.status().message();
      auto model = cost::halo_dispatch_traffic(g, r, tokens, static_cast<double>(token_bytes));
      ASSERT_TRUE(model.ok()) << model.status().message();
      expect_same_sends(*model, g, *log, me, "dispatch, " + what);
      // What `piper bench comm` sums (HaloExchangeStats) is the same count.
      double model_bytes = 0;
      for (const cost::HaloMessage& m : model->messages) model_bytes += m.src == me ? m.bytes : 0;
      EXPECT_NEAR(static_cast<double>(ctx->last_stats().bytes_inter + ctx->last_stats().bytes_intra), model_bytes,
                  1e-9 * model_bytes)
          << what;

      const std::vector<float> weights(static_cast<size_t>(routing.num_tokens * routing.top_k), 0.5f);
      const std::vector<float> outputs(rows->rows.size() / sizeof(float), 1.0f);
      for (size_t direct : {size_t{0}, size_t{1024}, size_t{64 * 1024}}) {
        ctx->set_direct_pair_bytes(direct);
        log->to.clear();
        auto y = halo_combine(*ctx, outputs, hidden, routing, weights, kTestTimeoutS);
        ASSERT_TRUE(y.ok()) << y.status().message();
        // The combine sends its partials directly whatever the all-to-all-v's threshold (the model has none).
        auto combine = cost::halo_combine_traffic(g, r, tokens, static_cast<double>(token_bytes));
        ASSERT_TRUE(combine.ok());
        expect_same_sends(*combine, g, *log, me, "combine, direct " + std::to_string(direct) + ", " + what);
      }
    }
  }
}

}  // namespace
}  // namespace piper::comm
