#include "piper/cost/halo_traffic.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace piper::cost {
namespace {

// C(a - x, k) / C(a, k): the chance that k distinct picks out of a avoid x given ones.
double avoid_ratio(double a, double x, int k) {
  double p = 1;
  for (int i = 0; i < k; ++i) {
    if (a - x - i <= 0) return 0;
    p *= (a - x - i) / (a - i);
  }
  return p;
}

double log_choose(double n, double k) {
  if (k < 0 || k > n) return -INFINITY;
  return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1);
}

bool group_limited(const HaloRouting& r) { return r.num_groups > 1 && r.topk_groups < r.num_groups; }

struct Layout {
  const HaloGroupShape& g;
  int w() const { return g.ranks_per_node / g.lanes; }
  int rank(int node, int local) const { return node * g.ranks_per_node + local; }
  int node_of(int rank) const { return rank / g.ranks_per_node; }
  int local_of(int rank) const { return rank % g.ranks_per_node; }
  int lane_of(int local) const { return local / w(); }
  int send_proxy(int m, int lane) const { return lane * w() + m % w(); }
  int recv_proxy(int n, int lane) const { return lane * w() + n % w(); }
};

int add(HaloTraffic* t, const HaloGroupShape& g, int src, int dst, double bytes, HaloStep step, std::vector<int> after) {
  if (bytes <= 0 || src == dst) return -1;
  const bool inter = src / g.ranks_per_node != dst / g.ranks_per_node;
  (inter ? t->bytes_inter : t->bytes_intra) += bytes;
  (inter ? t->messages_inter : t->messages_intra) += 1;
  t->messages.push_back(HaloMessage{src, dst, bytes, step, std::move(after)});
  return static_cast<int>(t->messages.size()) - 1;
}

}  // namespace

const char* to_string(HaloStep step) {
  switch (step) {
    case HaloStep::kDirect: return "direct";
    case HaloStep::kGather: return "gather";
    case HaloStep::kBatch: return "batch";
    case HaloStep::kScatter: return "scatter";
    case HaloStep::kRemoteDirect: return "remote_direct";
    case HaloStep::kSlotMeta: return "slot_meta";
    case HaloStep::kToReducer: return "to_reducer";
    case HaloStep::kPartial: return "partial";
  }
  return "?";
}

Status validate_halo(const HaloGroupShape& g, const HaloRouting& r) {
  if (g.nodes < 1 || g.ranks_per_node < 1 || g.lanes < 1 || g.ranks_per_node % g.lanes != 0) {
    return invalid_argument("halo traffic: lanes=" + std::to_string(g.lanes) + " must divide ranks_per_node=" +
                            std::to_string(g.ranks_per_node) + " (nodes=" + std::to_string(g.nodes) + ")");
  }
  if (r.num_experts < 1 || r.num_experts % g.size() != 0) {
    return invalid_argument("halo traffic: num_experts=" + std::to_string(r.num_experts) +
                            " must be a positive multiple of the ep group's " + std::to_string(g.size()) + " ranks");
  }
  if (group_limited(r) && (r.num_experts % r.num_groups != 0 || r.topk_groups < 1)) {
    return invalid_argument("halo traffic: num_groups=" + std::to_string(r.num_groups) + " must divide num_experts=" +
                            std::to_string(r.num_experts) + " and topk_groups=" + std::to_string(r.topk_groups) +
                            " be >= 1");
  }
  const int usable = group_limited(r) ? r.topk_groups * (r.num_experts / r.num_groups) : r.num_experts;
  if (r.top_k < 1 || r.top_k > usable) {
    return invalid_argument("halo traffic: top_k=" + std::to_string(r.top_k) + " must be in [1, " +
                            std::to_string(usable) + "] (the experts a token may use)");
  }
  return ok_status();
}

double halo_node_hit_probability(const HaloGroupShape& g, const HaloRouting& r, int node) {
  const double per_node = static_cast<double>(r.num_experts) / g.nodes;
  if (!group_limited(r)) return 1 - avoid_ratio(r.num_experts, per_node, r.top_k);
  // Groups overlapping the node's experts [lo, hi) and their overlaps.
  const int size = r.num_experts / r.num_groups;
  const int lo = static_cast<int>(node * per_node), hi = static_cast<int>((node + 1) * per_node);
  std::vector<int> overlap;
  for (int grp = lo / size; grp * size < hi; ++grp) overlap.push_back(std::min(hi, (grp + 1) * size) - std::max(lo, grp * size));
  // ways[j][a]: subsets of the overlapping groups with j members and a experts on the node.
  const int q = static_cast<int>(overlap.size()), span = hi - lo;
  std::vector<std::vector<double>> ways(q + 1, std::vector<double>(span + 1, 0.0));
  ways[0][0] = 1;
  for (int o : overlap) {
    for (int j = q - 1; j >= 0; --j) {
      for (int a = span - o; a >= 0; --a) ways[j + 1][a + o] += ways[j][a];
    }
  }
  const double usable = static_cast<double>(r.topk_groups) * size;
  const double all = log_choose(r.num_groups, r.topk_groups);
  double miss = 0;
  for (int j = 0; j <= q && j <= r.topk_groups; ++j) {
    const double rest = log_choose(r.num_groups - q, r.topk_groups - j);
    if (!std::isfinite(rest)) continue;
    for (int a = 0; a <= span; ++a) {
      if (ways[j][a] > 0) miss += ways[j][a] * std::exp(rest - all) * avoid_ratio(usable, a, r.top_k);
    }
  }
  return 1 - miss;
}

double halo_expected_distinct_nodes(const HaloGroupShape& g, const HaloRouting& r) {
  double d = 0;
  for (int m = 0; m < g.nodes; ++m) d += halo_node_hit_probability(g, r, m);
  return d;
}

Result<HaloTraffic> halo_dispatch_traffic(const HaloGroupShape& g, const HaloRouting& r, double tokens_per_rank,
                                          double token_bytes) {
  PIPER_RETURN_IF_ERROR(validate_halo(g, r));
  const Layout t{g};
  const int c = g.ranks_per_node, w = t.w();
  const double rows_bytes = tokens_per_rank * r.top_k / g.size() * token_bytes;  // s -> any rank
  std::vector<double> piece(g.nodes);  // bytes of one rank's piece for node m
  for (int m = 0; m < g.nodes; ++m) piece[m] = tokens_per_rank * halo_node_hit_probability(g, r, m) * (token_bytes + c);
  HaloTraffic out;
  // gathers[(n * nodes + m) * lanes + l]: the gather messages into the send proxy of (n -> m, lane l).
  std::vector<std::vector<int>> gathers(static_cast<size_t>(g.nodes) * g.nodes * g.lanes);
  for (int n = 0; n < g.nodes; ++n) {
    for (int s = 0; s < c; ++s) {
      for (int h = 0; h < c; ++h) add(&out, g, t.rank(n, s), t.rank(n, h), rows_bytes, HaloStep::kDirect, {});
      for (int m = 0; m < g.nodes; ++m) {
        const int proxy = t.send_proxy(m, t.lane_of(s));
        if (m == n || proxy == s) continue;
        const int id = add(&out, g, t.rank(n, s), t.rank(n, proxy), piece[m], HaloStep::kGather, {});
        if (id >= 0) gathers[(static_cast<size_t>(n) * g.nodes + m) * g.lanes + t.lane_of(s)].push_back(id);
      }
    }
  }
  for (int n = 0; n < g.nodes; ++n) {
    for (int m = 0; m < g.nodes; ++m) {
      if (m == n) continue;
      for (int l = 0; l < g.lanes; ++l) {
        const int rp = t.recv_proxy(n, l);
        const int batch = add(&out, g, t.rank(n, t.send_proxy(m, l)), t.rank(m, rp), w * piece[m], HaloStep::kBatch,
                              gathers[(static_cast<size_t>(n) * g.nodes + m) * g.lanes + l]);
        if (batch < 0) continue;
        for (int h = 0; h < c; ++h) {
          if (h != rp) add(&out, g, t.rank(m, rp), t.rank(m, h), w * rows_bytes, HaloStep::kScatter, {batch});
        }
      }
    }
  }
  return out;
}

void append_halo_all_to_all_v(const HaloGroupShape& g, const std::vector<std::vector<double>>& bytes,
                              double direct_pair_bytes, const std::vector<std::vector<int>>& after_of,
                              HaloTraffic* out) {
  const Layout t{g};
  const int c = g.ranks_per_node, w = t.w(), p = g.size();
  auto after = [&](int src) { return after_of.empty() ? std::vector<int>{} : after_of[src]; };
  auto direct = [&](double b) { return direct_pair_bytes > 0 && b >= direct_pair_bytes; };
  auto batched = [&](int i, int j) { return direct(bytes[i][j]) ? 0.0 : bytes[i][j]; };
  // Large blocks between nodes go first, straight to their destination (halo_all_to_all_v).
  for (int i = 0; i < p; ++i) {
    for (int j = 0; j < p; ++j) {
      if (t.node_of(i) != t.node_of(j) && direct(bytes[i][j])) add(out, g, i, j, bytes[i][j], HaloStep::kRemoteDirect, after(i));
    }
  }
  std::map<std::tuple<int, int, int>, std::vector<int>> gathers;  // (n, m, lane) -> gather messages
  for (int n = 0; n < g.nodes; ++n) {
    for (int s = 0; s < c; ++s) {
      const int i = t.rank(n, s);
      for (int h = 0; h < c; ++h) add(out, g, i, t.rank(n, h), bytes[i][t.rank(n, h)], HaloStep::kDirect, after(i));
      for (int m = 0; m < g.nodes; ++m) {
        const int proxy = t.send_proxy(m, t.lane_of(s));
        if (m == n || proxy == s) continue;
        double piece = 0;
        for (int h = 0; h < c; ++h) piece += batched(i, t.rank(m, h));
        const int id = add(out, g, i, t.rank(n, proxy), piece, HaloStep::kGather, after(i));
        if (id >= 0) gathers[{n, m, t.lane_of(s)}].push_back(id);
      }
    }
  }
  for (int n = 0; n < g.nodes; ++n) {
    for (int m = 0; m < g.nodes; ++m) {
      if (m == n) continue;
      for (int l = 0; l < g.lanes; ++l) {
        const int sp = t.rank(n, t.send_proxy(m, l)), rp = t.recv_proxy(n, l);
        std::vector<double> part(c, 0.0);
        double total = 0;
        for (int s = l * w; s < (l + 1) * w; ++s) {
          for (int h = 0; h < c; ++h) part[h] += batched(t.rank(n, s), t.rank(m, h));
        }
        for (double b : part) total += b;
        // The batch waits for its gathers, or for the proxy's own start when it has none.
        std::vector<int> deps = gathers[{n, m, l}];
        if (deps.empty()) deps = after(sp);
        const int batch = add(out, g, sp, t.rank(m, rp), total, HaloStep::kBatch, deps);
        if (batch < 0) continue;
        for (int h = 0; h < c; ++h) {
          if (h != rp) add(out, g, t.rank(m, rp), t.rank(m, h), part[h], HaloStep::kScatter, {batch});
        }
      }
    }
  }
}

Result<HaloTraffic> halo_combine_traffic(const HaloGroupShape& g, const HaloRouting& r, double tokens_per_rank,
                                         double row_bytes) {
  PIPER_RETURN_IF_ERROR(validate_halo(g, r));
  const Layout t{g};
  const int c = g.ranks_per_node, p = g.size(), w = t.w();
  const double rows_bytes = tokens_per_rank * r.top_k / p * row_bytes;  // rows of one source at one expert rank
  std::vector<double> hit(g.nodes);
  for (int m = 0; m < g.nodes; ++m) hit[m] = halo_node_hit_probability(g, r, m);
  // inputs[(m * nodes + n) * lanes + l]: what the reducer on node m of the lane-l sources of node n waits for.
  std::vector<std::vector<int>> inputs(static_cast<size_t>(g.nodes) * g.nodes * g.lanes);
  auto group = [&](int m, int n, int l) -> std::vector<int>& {
    return inputs[(static_cast<size_t>(m) * g.nodes + n) * g.lanes + l];
  };
  auto reducer = [&](int m, int n, int l) { return t.rank(m, t.recv_proxy(n, l)); };
  HaloTraffic out;
  for (int s = 0; s < p; ++s) {
    const int n = t.node_of(s), l = t.lane_of(t.local_of(s));
    for (int m = 0; m < g.nodes; ++m) {
      if (m == n) continue;
      const double meta = tokens_per_rank * hit[m] * r.top_k * 8.0;
      const int id = add(&out, g, s, reducer(m, n, l), meta, HaloStep::kSlotMeta, {});
      if (id >= 0) group(m, n, l).push_back(id);
    }
  }
  for (int e = 0; e < p; ++e) {
    const int m = t.node_of(e);
    for (int n = 0; n < g.nodes; ++n) {
      for (int l = 0; l < g.lanes && n != m; ++l) {
        const int id = add(&out, g, e, reducer(m, n, l), w * rows_bytes, HaloStep::kToReducer, {});
        if (id >= 0) group(m, n, l).push_back(id);
      }
    }
    for (int h = 0; h < c; ++h) add(&out, g, e, t.rank(m, h), rows_bytes, HaloStep::kDirect, {});
  }
  for (int s = 0; s < p; ++s) {
    const int n = t.node_of(s), l = t.lane_of(t.local_of(s));
    for (int m = 0; m < g.nodes; ++m) {
      if (m != n) {
        add(&out, g, reducer(m, n, l), s, tokens_per_rank * hit[m] * row_bytes, HaloStep::kPartial, group(m, n, l));
      }
    }
  }
  return out;
}

double halo_traffic_time_s(const HaloGroupShape& g, const HaloTraffic& t, const HaloLinkModel& link) {
  const size_t n = t.messages.size();
  if (n == 0) return 0;
  const Layout lay{g};
  std::vector<int> level(n, 0);
  int levels = 1;
  for (size_t i = 0; i < n; ++i) {
    for (int a : t.messages[i].after) level[i] = std::max(level[i], level[static_cast<size_t>(a)] + 1);
    levels = std::max(levels, level[i] + 1);
  }
  // Per level: each rank's intra-node messages and tx/rx bytes, and each (node, lane) NIC's tx/rx bytes.
  const int p = g.size(), nics = g.nodes * g.lanes;
  std::vector<double> msgs_intra(static_cast<size_t>(levels) * p), msgs_inter(msgs_intra.size());
  std::vector<double> tx(msgs_intra.size()), rx(msgs_intra.size());
  std::vector<double> nic_tx(static_cast<size_t>(levels) * nics), nic_rx(nic_tx.size());
  auto nic = [&](int rank) { return lay.node_of(rank) * g.lanes + lay.lane_of(lay.local_of(rank)); };
  for (size_t i = 0; i < n; ++i) {
    const HaloMessage& m = t.messages[i];
    const size_t base = static_cast<size_t>(level[i]);
    if (lay.node_of(m.src) == lay.node_of(m.dst)) {
      msgs_intra[base * p + m.src] += 1;
      tx[base * p + m.src] += m.bytes;
      rx[base * p + m.dst] += m.bytes;
    } else {
      msgs_inter[base * p + m.src] += 1;
      nic_tx[base * nics + nic(m.src)] += m.bytes;
      nic_rx[base * nics + nic(m.dst)] += m.bytes;
    }
  }
  // A message's duration: its sender's load of the level on the message's level (intra or NIC).
  std::vector<double> finish(n, 0.0);
  double end = 0;
  for (size_t i = 0; i < n; ++i) {
    const HaloMessage& m = t.messages[i];
    const size_t base = static_cast<size_t>(level[i]);
    double d;
    if (lay.node_of(m.src) == lay.node_of(m.dst)) {
      d = msgs_intra[base * p + m.src] * link.intra_alpha_s +
          std::max(tx[base * p + m.src], rx[base * p + m.dst]) / link.intra_bw;
    } else {
      d = msgs_inter[base * p + m.src] * link.inter_alpha_s +
          std::max(nic_tx[base * nics + nic(m.src)], nic_rx[base * nics + nic(m.dst)]) / link.lane_bw;
    }
    double ready = 0;
    for (int a : m.after) ready = std::max(ready, finish[static_cast<size_t>(a)]);
    finish[i] = ready + d;
    end = std::max(end, finish[i]);
  }
  return end;
}

}  // namespace piper::cost
