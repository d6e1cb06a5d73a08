#include "piper/comm/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>

#include "piper/base/units.h"
#include "piper/comm/algorithms/halo_all_to_all.h"
#include "piper/comm/algorithms/moe_combine.h"
#include "piper/comm/algorithms/moe_dispatch.h"
#include "piper/comm/algorithms/pairwise_all_to_all.h"

namespace piper::comm {

Status CommBenchOptions::validate(int world_size) const {
  if (iterations < 1 || warmup < 0) return invalid_argument("bench comm: --iterations must be >= 1");
  if (num_experts < 1 || num_experts % world_size != 0) {
    return invalid_argument("bench comm: --experts=" + std::to_string(num_experts) +
                            " must be a positive multiple of the number of ranks " + std::to_string(world_size));
  }
  if (top_k < 1 || top_k > num_experts || top_k > 255) {
    return invalid_argument("bench comm: --top-k=" + std::to_string(top_k) + " must be in [1, min(experts, 255)]");
  }
  if (tokens_per_rank < 0 || token_bytes < 4 || token_bytes % 4 != 0) {
    return invalid_argument(
        "bench comm: --tokens must be >= 0 and --token-bytes a positive multiple of 4 (the "
        "combine moves rows of token_bytes / 4 floats)");
  }
  return ok_status();
}

namespace {
constexpr double kTimeoutS = 600.0;
using Clock = std::chrono::steady_clock;

Result<std::vector<double>> gather_doubles(Communicator& w, double value) {
  std::vector<double> all(w.size());
  PIPER_ASSIGN_OR_RETURN(Handle h, w.all_gather(&value, all.data(), sizeof(double)));
  PIPER_RETURN_IF_ERROR(w.wait(h, kTimeoutS));
  return all;
}

Status barrier(Communicator& w) {
  PIPER_ASSIGN_OR_RETURN(Handle h, w.barrier());
  return w.wait(h, kTimeoutS);
}

// For each of `fns`: the median over iterations of the slowest rank's time (barrier before each call). With
// o.interleave the candidates run one call of each per iteration, starting at a different one every
// iteration, so that a change of the machine's load during the run (other processes on a shared machine)
// shifts all of them alike instead of favouring the one that happened to run in a quiet moment; otherwise
// each runs all its iterations in a block.
Result<std::vector<double>> time_ops(Communicator& w, const CommBenchOptions& o,
                                     const std::vector<std::function<Status()>>& fns) {
  std::vector<std::vector<double>> samples(fns.size());
  auto time_one = [&](size_t f, int i) -> Status {
    PIPER_RETURN_IF_ERROR(barrier(w));
    auto t0 = Clock::now();
    PIPER_RETURN_IF_ERROR(fns[f]());
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    PIPER_ASSIGN_OR_RETURN(auto all, gather_doubles(w, dt));
    if (i >= o.warmup) samples[f].push_back(*std::max_element(all.begin(), all.end()));
    return ok_status();
  };
  if (o.interleave) {
    for (int i = 0; i < o.warmup + o.iterations; ++i) {
      for (size_t k = 0; k < fns.size(); ++k) PIPER_RETURN_IF_ERROR(time_one((k + i) % fns.size(), i));
    }
  } else {
    for (size_t f = 0; f < fns.size(); ++f) {
      for (int i = 0; i < o.warmup + o.iterations; ++i) PIPER_RETURN_IF_ERROR(time_one(f, i));
    }
  }
  std::vector<double> medians;
  for (auto& s : samples) {
    std::sort(s.begin(), s.end());
    medians.push_back(s[s.size() / 2]);
  }
  return medians;
}

// Half round trip between ranks a and b for `bytes` bytes (seen by every rank).
Result<double> ping_pong(Communicator& w, int a, int b, size_t bytes, int iterations) {
  std::vector<uint8_t> buf(bytes, 1);
  double half_rtt = 0;
  const int me = w.rank();
  PIPER_RETURN_IF_ERROR(barrier(w));
  if (me == a || me == b) {
    int peer = me == a ? b : a;
    auto t0 = Clock::now();
    for (int i = 0; i < iterations + 1; ++i) {
      if (i == 1) t0 = Clock::now();  // the first exchange is a warm-up
      for (int step = 0; step < 2; ++step) {
        bool sending = (me == a) == (step == 0);
        PIPER_ASSIGN_OR_RETURN(Handle h,
                               sending ? w.isend(buf.data(), bytes, peer, 3) : w.irecv(buf.data(), bytes, peer, 3));
        PIPER_RETURN_IF_ERROR(w.wait(h, kTimeoutS));
      }
    }
    half_rtt = std::chrono::duration<double>(Clock::now() - t0).count() / (2.0 * iterations);
  }
  PIPER_ASSIGN_OR_RETURN(auto all, gather_doubles(w, half_rtt));
  return all[a];
}

Result<LinkFit> fit_link(Communicator& w, int a, int b) {
  constexpr size_t kLarge = 4 << 20;
  LinkFit fit;
  PIPER_ASSIGN_OR_RETURN(fit.latency_s, ping_pong(w, a, b, 8, 50));
  PIPER_ASSIGN_OR_RETURN(double large_s, ping_pong(w, a, b, kLarge, 5));
  fit.bw_bytes_per_s = static_cast<double>(kLarge) / std::max(large_s - fit.latency_s, 1e-9);
  fit.measured = true;
  return fit;
}

MoeRouting random_routing(const CommBenchOptions& o, int rank, int ranks) {
  MoeRouting r;
  r.num_tokens = o.tokens_per_rank;
  r.top_k = o.top_k;
  std::mt19937_64 rng(o.seed * 1000003ULL + rank);
  std::vector<int> experts(o.num_experts);
  const int per_rank = o.num_experts / ranks;
  for (int64_t t = 0; t < r.num_tokens; ++t) {
    for (int e = 0; e < o.num_experts; ++e) experts[e] = e;
    for (int j = 0; j < o.top_k; ++j) {  // partial Fisher-Yates: top_k distinct experts
      std::uniform_int_distribution<int> pick(j, o.num_experts - 1);
      std::swap(experts[j], experts[pick(rng)]);
      r.dest_ranks.push_back(experts[j] / per_rank);
    }
  }
  return r;
}

Result<HaloPhases> summarize(Communicator& w, const HaloExchangeStats& s) {
  std::vector<double> mine = {s.metadata_s,
                              s.pack_s,
                              s.posted_s,
                              s.batches_out_s,
                              s.batches_in_s,
                              s.total_s,
                              s.scatter_s,
                              static_cast<double>(s.messages_intra),
                              static_cast<double>(s.messages_inter),
                              static_cast<double>(s.bytes_intra),
                              static_cast<double>(s.bytes_inter),
                              static_cast<double>(s.idle_rounds)};
  std::vector<double> all(mine.size() * w.size());
  PIPER_ASSIGN_OR_RETURN(Handle h, w.all_gather(mine.data(), all.data(), mine.size() * sizeof(double)));
  PIPER_RETURN_IF_ERROR(w.wait(h, kTimeoutS));
  HaloPhases out;
  for (int r = 0; r < w.size(); ++r) {
    const double* v = all.data() + r * mine.size();
    out.metadata_s = std::max(out.metadata_s, v[0]);
    out.pack_s = std::max(out.pack_s, v[1]);
    out.posted_s = std::max(out.posted_s, v[2]);
    out.batches_out_s = std::max(out.batches_out_s, v[3]);
    out.batches_in_s = std::max(out.batches_in_s, v[4]);
    out.exchange_s = std::max(out.exchange_s, v[5]);
    out.scatter_s = std::max(out.scatter_s, v[6]);
    out.messages_intra += static_cast<int64_t>(v[7]);
    out.messages_inter += static_cast<int64_t>(v[8]);
    out.bytes_intra += static_cast<int64_t>(v[9]);
    out.bytes_inter += static_cast<int64_t>(v[10]);
    out.idle_rounds = std::max(out.idle_rounds, static_cast<int64_t>(v[11]));
  }
  return out;
}

OrderedJson phases_json(const HaloPhases& h) {
  return {{"metadata_s", h.metadata_s},
          {"pack_s", h.pack_s},
          {"posted_s", h.posted_s},
          {"batches_out_s", h.batches_out_s},
          {"batches_in_s", h.batches_in_s},
          {"scatter_s", h.scatter_s},
          {"exchange_s", h.exchange_s},
          {"messages_intra", h.messages_intra},
          {"messages_inter", h.messages_inter},
          {"bytes_intra", h.bytes_intra},
          {"bytes_inter", h.bytes_inter},
          {"max_idle_rounds", h.idle_rounds}};
}

std::string phases_text(const HaloPhases& h) {
  char line[320];
  std::snprintf(line, sizeof(line),
                "    HALO phases (slowest rank, last iteration): sizes %s, pack %s, then batches out by %s, in and "
                "scattered by %s (scatter copies %s), done %s; inter-node %lld msgs %s, intra-node %lld msgs %s\n",
                format_seconds(h.metadata_s).c_str(), format_seconds(h.pack_s).c_str(),
                format_seconds(h.batches_out_s).c_str(), format_seconds(h.batches_in_s).c_str(),
                format_seconds(h.scatter_s).c_str(), format_seconds(h.exchange_s).c_str(),
                static_cast<long long>(h.messages_inter), format_bytes(static_cast<double>(h.bytes_inter)).c_str(),
                static_cast<long long>(h.messages_intra), format_bytes(static_cast<double>(h.bytes_intra)).c_str());
  return line;
}

double busbw(size_t bytes_per_pair, int ranks, double seconds) {
  double algbw = static_cast<double>(bytes_per_pair) * ranks / seconds;
  return algbw * (ranks - 1) / ranks;
}

// Combine of the dispatched rows (expert outputs = the rows read as floats), weights 1/top_k.
Result<CombineTiming> bench_combine(Communicator& world, HaloContext& halo, const CommBenchOptions& o,
                                    const MoeRouting& routing, const DispatchResult& rows) {
  const int64_t hidden = static_cast<int64_t>(o.token_bytes / sizeof(float));
  std::vector<float> outputs(rows.rows.size() / sizeof(float));
  for (size_t i = 0; i < outputs.size(); ++i) outputs[i] = static_cast<float>(rows.rows[i]) / 255.0f - 0.5f;
  std::vector<float> weights(routing.dest_ranks.size(), 1.0f / static_cast<float>(o.top_k));
  std::vector<float> flat_y, halo_y;
  CombineTiming c;
  PIPER_ASSIGN_OR_RETURN(
      auto times, time_ops(world, o,
                           {[&]() -> Status {
                              PIPER_ASSIGN_OR_RETURN(flat_y, flat_combine(world, outputs, hidden, routing, weights,
                                                                          FlatDispatchKind::kMpiAllToAllV, kTimeoutS));
                              return ok_status();
                            },
                            [&]() -> Status {
                              PIPER_ASSIGN_OR_RETURN(halo_y,
                                                     halo_combine(halo, outputs, hidden, routing, weights, kTimeoutS));
                              return ok_status();
                            }}));
  c.mpi_s = times[0];
  c.halo_s = times[1];
  double diff = 0;
  for (size_t i = 0; i < flat_y.size(); ++i)
    diff = std::max(diff, static_cast<double>(std::fabs(flat_y[i] - halo_y[i])));
  if (flat_y.size() != halo_y.size() || diff > 1e-4) {
    return internal_error("bench comm: HALO combine differs from the flat combine by " + std::to_string(diff) +
                          " on rank " + std::to_string(world.rank()));
  }
  CombineTraffic traffic = combine_traffic(halo.topology(), world.rank(), hidden, routing);
  PIPER_ASSIGN_OR_RETURN(auto flat_all, gather_doubles(world, static_cast<double>(traffic.flat_internode_bytes)));
  PIPER_ASSIGN_OR_RETURN(auto halo_all, gather_doubles(world, static_cast<double>(traffic.halo_internode_bytes)));
  PIPER_ASSIGN_OR_RETURN(auto diff_all, gather_doubles(world, diff));
  for (int r = 0; r < world.size(); ++r) {
    c.flat_internode_bytes += static_cast<int64_t>(flat_all[r]);
    c.halo_internode_bytes += static_cast<int64_t>(halo_all[r]);
    c.max_abs_diff = std::max(c.max_abs_diff, diff_all[r]);
  }
  c.tokens_total = o.tokens_per_rank * world.size();
  return c;
}

}  // namespace

Result<CommBenchReport> run_comm_bench(Communicator& world, const CommBenchOptions& o) {
  PIPER_RETURN_IF_ERROR(o.validate(world.size()));
  const int p = world.size(), me = world.rank();
  PIPER_ASSIGN_OR_RETURN(NodeTopology topo, NodeTopology::create(p, o.ranks_per_node, o.lanes));
  PIPER_ASSIGN_OR_RETURN(auto halo, HaloContext::create(world, topo));
  halo->set_direct_pair_bytes(o.halo_direct_pair_bytes);
  CommBenchReport report;
  report.ranks = p;
  report.ranks_per_node = o.ranks_per_node;
  report.lanes = o.lanes;
  report.halo_direct_pair_bytes = o.halo_direct_pair_bytes;
  report.options = o;

  for (size_t per_pair : o.bytes_per_pair) {
    std::vector<uint8_t> send(per_pair * p), recv(per_pair * p);
    for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<uint8_t>(i * 7 + me);
    std::vector<size_t> counts(p, per_pair);
    AllToAllTiming row;
    row.bytes_per_pair = per_pair;
    PIPER_ASSIGN_OR_RETURN(
        auto times,
        time_ops(world, o,
                 {[&]() -> Status {
                    PIPER_ASSIGN_OR_RETURN(Handle h, world.all_to_all_v(send.data(), counts, recv.data(), counts));
                    return world.wait(h, kTimeoutS);
                  },
                  [&]() { return pairwise_all_to_all_v(world, send.data(), counts, recv.data(), counts, kTimeoutS); },
                  [&]() { return halo_all_to_all_v(*halo, send.data(), counts, recv.data(), counts, kTimeoutS); }}));
    row.mpi_s = times[0];
    row.pairwise_s = times[1];
    row.halo_s = times[2];
    PIPER_ASSIGN_OR_RETURN(row.halo_phases, summarize(world, halo->last_stats()));
    report.all_to_all.push_back(row);
  }

  if (o.tokens_per_rank > 0) {
    MoeRouting routing = random_routing(o, me, p);
    std::vector<uint8_t> tokens(static_cast<size_t>(o.tokens_per_rank) * o.token_bytes);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint8_t>(i + me);
    // Both keep their buffers from iteration to iteration (as a training step would).
    DispatchResult flat_rows, halo_rows;
    std::vector<uint8_t> flat_pack;
    PIPER_ASSIGN_OR_RETURN(
        auto times,
        time_ops(
            world, o,
            {[&]() {
               return flat_dispatch(world, tokens.data(), o.token_bytes, routing, FlatDispatchKind::kMpiAllToAllV,
                                    kTimeoutS, &flat_rows, &flat_pack);
             },
             [&]() { return halo_dispatch(*halo, tokens.data(), o.token_bytes, routing, kTimeoutS, &halo_rows); }}));
    report.dispatch.mpi_s = times[0];
    report.dispatch.halo_s = times[1];
    PIPER_ASSIGN_OR_RETURN(report.dispatch.halo_phases, summarize(world, halo->last_stats()));
    if (flat_rows.rows != halo_rows.rows) {
      return internal_error("bench comm: HALO dispatch and flat dispatch delivered different bytes on rank " +
                            std::to_string(me));
    }
    DispatchTraffic traffic = dispatch_traffic(topo, me, o.token_bytes, routing);
    std::vector<char> to_rank(p, 0);
    for (int d : routing.dest_ranks) {
      if (d >= 0) to_rank[d] = 1;
    }
    double inter_msgs = 0, intra_msgs = 0;
    for (int d = 0; d < p; ++d) {
      if (d == me || !to_rank[d]) continue;
      (topo.node_of(d) == topo.node_of(me) ? intra_msgs : inter_msgs) += 1;
    }
    PIPER_ASSIGN_OR_RETURN(auto inter_all, gather_doubles(world, inter_msgs));
    PIPER_ASSIGN_OR_RETURN(auto intra_all, gather_doubles(world, intra_msgs));
    PIPER_ASSIGN_OR_RETURN(auto flat_all, gather_doubles(world, static_cast<double>(traffic.flat_internode_bytes)));
    PIPER_ASSIGN_OR_RETURN(auto halo_all, gather_doubles(world, static_cast<double>(traffic.halo_internode_bytes)));
    for (int r = 0; r < p; ++r) {
      report.dispatch.flat_internode_bytes += static_cast<int64_t>(flat_all[r]);
      report.dispatch.halo_internode_bytes += static_cast<int64_t>(halo_all[r]);
      report.dispatch.flat_internode_messages += static_cast<int64_t>(inter_all[r]);
      report.dispatch.flat_intranode_messages += static_cast<int64_t>(intra_all[r]);
    }
    report.dispatch.tokens_total = o.tokens_per_rank * p;
    PIPER_ASSIGN_OR_RETURN(report.combine, bench_combine(world, *halo, o, routing, flat_rows));
  }

  if (o.calibrate) {
    if (o.ranks_per_node >= 2) {
      PIPER_ASSIGN_OR_RETURN(report.intra, fit_link(world, 0, 1));
    }
    if (topo.num_nodes() >= 2) {
      PIPER_ASSIGN_OR_RETURN(report.inter, fit_link(world, 0, o.ranks_per_node));
    }
  }
  return report;
}

OrderedJson to_json(const CommBenchReport& r) {
  OrderedJson j;
  j["ranks"] = r.ranks;
  j["ranks_per_node"] = r.ranks_per_node;
  j["lanes"] = r.lanes;
  j["halo_direct_pair_bytes"] = r.halo_direct_pair_bytes;
  j["iterations"] = r.options.iterations;
  j["interleaved"] = r.options.interleave;
  OrderedJson rows = OrderedJson::array();
  for (const AllToAllTiming& t : r.all_to_all) {
    OrderedJson row;
    row["bytes_per_pair"] = t.bytes_per_pair;
    row["mpi_alltoallv_s"] = t.mpi_s;
    row["pairwise_s"] = t.pairwise_s;
    row["halo_s"] = t.halo_s;
    row["mpi_busbw_bytes_per_s"] = busbw(t.bytes_per_pair, r.ranks, t.mpi_s);
    row["pairwise_busbw_bytes_per_s"] = busbw(t.bytes_per_pair, r.ranks, t.pairwise_s);
    row["halo_busbw_bytes_per_s"] = busbw(t.bytes_per_pair, r.ranks, t.halo_s);
    row["halo_over_mpi"] = t.mpi_s / t.halo_s;
    row["halo_phases"] = phases_json(t.halo_phases);
    rows.push_back(row);
  }
  j["all_to_all"] = rows;
  if (r.dispatch.tokens_total > 0) {
    const DispatchTiming& d = r.dispatch;
    j["moe_dispatch"] = {{"experts", r.options.num_experts},
                         {"top_k", r.options.top_k},
                         {"tokens_per_rank", r.options.tokens_per_rank},
                         {"token_bytes", r.options.token_bytes},
                         {"mpi_alltoallv_s", d.mpi_s},
                         {"halo_s", d.halo_s},
                         {"mpi_tokens_per_s", d.tokens_total / d.mpi_s},
                         {"halo_tokens_per_s", d.tokens_total / d.halo_s},
                         {"halo_over_mpi", d.mpi_s / d.halo_s},
                         {"flat_internode_bytes", d.flat_internode_bytes},
                         {"halo_internode_bytes", d.halo_internode_bytes},
                         {"flat_internode_messages", d.flat_internode_messages},
                         {"flat_intranode_messages", d.flat_intranode_messages},
                         {"halo_phases", phases_json(d.halo_phases)}};
  }
  if (r.combine.tokens_total > 0) {
    const CombineTiming& c = r.combine;
    j["moe_combine"] = {{"hidden_floats", r.options.token_bytes / sizeof(float)},
                        {"mpi_alltoallv_s", c.mpi_s},
                        {"halo_s", c.halo_s},
                        {"mpi_tokens_per_s", c.tokens_total / c.mpi_s},
                        {"halo_tokens_per_s", c.tokens_total / c.halo_s},
                        {"halo_over_mpi", c.mpi_s / c.halo_s},
                        {"flat_internode_bytes", c.flat_internode_bytes},
                        {"halo_internode_bytes", c.halo_internode_bytes},
                        {"max_abs_diff_vs_flat", c.max_abs_diff}};
  }
  j["calibration"] = calibration_json(r);
  return j;
}

OrderedJson calibration_json(const CommBenchReport& r) {
  OrderedJson j;
  j["source"] = "piper bench comm";
  j["ranks"] = r.ranks;
  j["ranks_per_node"] = r.ranks_per_node;
  auto link = [](const LinkFit& f) {
    return f.measured ? OrderedJson{{"latency_s", f.latency_s}, {"bw_bytes_per_s", f.bw_bytes_per_s}} : OrderedJson();
  };
  // Field names of ClusterSpec (spec/cluster_spec.h): node.intra is a LinkSpec; the inter-node hop is
  // node.nic_latency_s plus the NIC bandwidth of one rank's path.
  OrderedJson node;
  if (r.intra.measured) node["intra"] = link(r.intra);
  if (r.inter.measured) {
    node["nic_latency_s"] = r.inter.latency_s;
    node["nic_bw_bytes_per_s"] = r.inter.bw_bytes_per_s;
  }
  j["node"] = node;
  return j;
}

std::string to_text(const CommBenchReport& r) {
  std::ostringstream os;
  char line[256];
  os << "piper bench comm: " << r.ranks << " ranks, " << r.ranks_per_node << " per node, " << r.lanes
     << " lane(s), HALO sends remote blocks of >= " << format_bytes(static_cast<double>(r.halo_direct_pair_bytes))
     << " directly (0 B: none); median of " << r.options.iterations << " iterations"
     << (r.options.interleave ? " (candidates interleaved)" : " (each candidate in a block)") << ", slowest rank\n";
  std::snprintf(line, sizeof(line), "%12s %14s %14s %14s %10s\n", "bytes/pair", "MPI busbw", "pairwise busbw",
                "HALO busbw", "HALO/MPI");
  os << line;
  for (const AllToAllTiming& t : r.all_to_all) {
    std::snprintf(line, sizeof(line), "%12s %11.3f GB/s %11.3f GB/s %11.3f GB/s %9.2fx\n",
                  format_bytes(static_cast<double>(t.bytes_per_pair)).c_str(),
                  busbw(t.bytes_per_pair, r.ranks, t.mpi_s) / 1e9, busbw(t.bytes_per_pair, r.ranks, t.pairwise_s) / 1e9,
                  busbw(t.bytes_per_pair, r.ranks, t.halo_s) / 1e9, t.mpi_s / t.halo_s);
    os << line << phases_text(t.halo_phases);
  }
  if (r.dispatch.tokens_total > 0) {
    const DispatchTiming& d = r.dispatch;
    std::snprintf(line, sizeof(line),
                  "MoE dispatch top-%d of %d experts, %lld tokens of %zu B per rank: MPI %.0f tokens/s, HALO %.0f "
                  "tokens/s, HALO/MPI %.2fx (inter-node bytes %s -> %s)\n",
                  r.options.top_k, r.options.num_experts, static_cast<long long>(r.options.tokens_per_rank),
                  r.options.token_bytes, d.tokens_total / d.mpi_s, d.tokens_total / d.halo_s, d.mpi_s / d.halo_s,
                  format_bytes(static_cast<double>(d.flat_internode_bytes)).c_str(),
                  format_bytes(static_cast<double>(d.halo_internode_bytes)).c_str());
    os << line;
    std::snprintf(line, sizeof(line), "    flat: %lld inter-node and %lld intra-node messages\n",
                  static_cast<long long>(d.flat_internode_messages), static_cast<long long>(d.flat_intranode_messages));
    os << line << phases_text(d.halo_phases);
  }
  if (r.combine.tokens_total > 0) {
    const CombineTiming& c = r.combine;
    std::snprintf(line, sizeof(line),
                  "MoE combine (weighted, %zu floats per row): MPI %.0f tokens/s, HALO %.0f tokens/s, HALO/MPI %.2fx "
                  "(inter-node bytes %s -> %s, max |HALO - flat| %.2g)\n",
                  r.options.token_bytes / sizeof(float), c.tokens_total / c.mpi_s, c.tokens_total / c.halo_s,
                  c.mpi_s / c.halo_s, format_bytes(static_cast<double>(c.flat_internode_bytes)).c_str(),
                  format_bytes(static_cast<double>(c.halo_internode_bytes)).c_str(), c.max_abs_diff);
    os << line;
  }
  auto fit = [&](const char* name, const LinkFit& f) {
    if (!f.measured) return;
    std::snprintf(line, sizeof(line), "%s link: alpha %s, bandwidth %.3f GB/s\n", name,
                  format_seconds(f.latency_s).c_str(), f.bw_bytes_per_s / 1e9);
    os << line;
  };
  fit("intra-node", r.intra);
  fit("inter-node", r.inter);
  return os.str();
}

}  // namespace piper::comm
