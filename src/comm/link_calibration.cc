#include "piper/comm/link_calibration.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "piper/base/clock.h"
#include "piper/base/units.h"

namespace piper::comm {
namespace {

constexpr double kTimeoutS = 600.0;
constexpr size_t kHostBytes = 64;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Status wait(Communicator& w, Result<Handle> posted) {
  PIPER_ASSIGN_OR_RETURN(Handle h, std::move(posted));
  return w.wait(h, kTimeoutS);
}

Result<std::vector<double>> gather_doubles(Communicator& w, double value) {
  std::vector<double> all(static_cast<size_t>(w.size()));
  PIPER_RETURN_IF_ERROR(wait(w, w.all_gather(&value, all.data(), sizeof(double))));
  return all;
}

double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

Result<double> mean_over_ranks(Communicator& w, double mine) {
  PIPER_ASSIGN_OR_RETURN(auto all, gather_doubles(w, mine));
  double mean = 0;
  for (double v : all) mean += v / static_cast<double>(all.size());
  return mean;
}

int iterations_for(const LinkCalibrationOptions& o, size_t bytes) {
  return bytes >= (size_t{1} << 20) ? std::max(3, o.iterations / 3) : o.iterations;
}

// The host names of the ranks, grouped into nodes: ranks_per_node, and the host of each node. Errors when the
// ranks are not node-major or the nodes hold different numbers of ranks.
Status find_nodes(Communicator& w, LinkCalibration* c) {
  char mine[kHostBytes] = {};
  if (gethostname(mine, kHostBytes - 1) != 0) std::snprintf(mine, kHostBytes, "localhost");
  std::vector<char> all(kHostBytes * static_cast<size_t>(w.size()));
  PIPER_RETURN_IF_ERROR(wait(w, w.all_gather(mine, all.data(), kHostBytes)));
  std::vector<std::string> host_of;
  for (int r = 0; r < w.size(); ++r) host_of.emplace_back(&all[kHostBytes * static_cast<size_t>(r)]);
  for (int r = 0; r < w.size(); ++r) {
    if (c->hosts.empty() || c->hosts.back() != host_of[static_cast<size_t>(r)]) {
      if (std::find(c->hosts.begin(), c->hosts.end(), host_of[static_cast<size_t>(r)]) != c->hosts.end()) {
        return invalid_argument("calibrate: ranks of host '" + host_of[static_cast<size_t>(r)] +
                                "' are not consecutive; launch node-major (mpirun --map-by ppr:G:node)");
      }
      c->hosts.push_back(host_of[static_cast<size_t>(r)]);
    }
  }
  c->ranks = w.size();
  c->ranks_per_node = w.size() / static_cast<int>(c->hosts.size());
  for (int r = 0; r < w.size(); ++r) {
    if (host_of[static_cast<size_t>(r)] != c->hosts[static_cast<size_t>(r / c->ranks_per_node)]) {
      return invalid_argument("calibrate: the nodes hold different numbers of ranks (" + std::to_string(w.size()) +
                              " ranks on " + std::to_string(c->hosts.size()) + " hosts); give every node as many");
    }
  }
  return ok_status();
}

// Half round trip between a and b at `bytes` (median over iterations; the value of rank a, seen by all).
Result<double> ping_pong(Communicator& w, int a, int b, size_t bytes, int iterations, int warmup) {
  std::vector<uint8_t> buf(std::max<size_t>(bytes, 1), 1);
  std::vector<double> samples;
  const int me = w.rank();
  PIPER_RETURN_IF_ERROR(wait(w, w.barrier()));
  if (me == a || me == b) {
    const int peer = me == a ? b : a;
    for (int i = 0; i < warmup + iterations; ++i) {
      auto t0 = Clock::now();
      for (int step = 0; step < 2; ++step) {
        const bool sending = (me == a) == (step == 0);
        PIPER_RETURN_IF_ERROR(
            wait(w, sending ? w.isend(buf.data(), bytes, peer, 7) : w.irecv(buf.data(), bytes, peer, 7)));
      }
      if (i >= warmup) samples.push_back(since(t0) / 2);
    }
  }
  PIPER_ASSIGN_OR_RETURN(auto all, gather_doubles(w, median(samples)));
  return all[static_cast<size_t>(a)];
}

Result<AlphaBeta> measure_p2p(Communicator& w, int a, int b, const LinkCalibrationOptions& o) {
  std::vector<SizedTime> points;
  for (size_t bytes : o.p2p_bytes) {
    PIPER_ASSIGN_OR_RETURN(double s, ping_pong(w, a, b, bytes, iterations_for(o, bytes), o.warmup));
    points.push_back({bytes, s});
  }
  return fit_alpha_beta(std::move(points));
}

// The slowest rank's time of `call` (barrier before each), median over iterations; *cpu_s: the process CPU of one
// call (the timed ones), mean over ranks.
Result<double> time_collective(Communicator& w, int iterations, int warmup, const std::function<Status()>& call,
                               double* cpu_s) {
  std::vector<double> samples;
  double cpu = 0;
  for (int i = 0; i < warmup + iterations; ++i) {
    PIPER_RETURN_IF_ERROR(wait(w, w.barrier()));
    auto t0 = Clock::now();
    const double cpu0 = process_cpu_s();
    PIPER_RETURN_IF_ERROR(call());
    if (i >= warmup) cpu += process_cpu_s() - cpu0;
    PIPER_ASSIGN_OR_RETURN(auto all, gather_doubles(w, since(t0)));
    if (i >= warmup) samples.push_back(max_of(all));
  }
  PIPER_ASSIGN_OR_RETURN(*cpu_s, mean_over_ranks(w, cpu / iterations));
  return median(samples);
}

enum class Coll { kAllReduce, kAllGather, kAllToAll };

Result<AlphaBeta> measure_collective(Communicator& w, Coll kind, const LinkCalibrationOptions& o) {
  const size_t p = static_cast<size_t>(w.size());
  std::vector<SizedTime> points;
  for (size_t bytes : o.collective_bytes) {
    // Round to what every kind moves exactly: whole floats for the all-reduce, whole bytes per peer otherwise.
    const size_t per_peer = std::max<size_t>(1, bytes / p);
    const size_t rank_bytes = kind == Coll::kAllReduce ? std::max<size_t>(4, bytes / 4 * 4) : per_peer * p;
    std::vector<uint8_t> in(rank_bytes, 1), out(kind == Coll::kAllGather ? rank_bytes * p : rank_bytes);
    std::vector<size_t> split(p, per_peer);
    std::function<Status()> call;
    if (kind == Coll::kAllReduce) {
      call = [&] {
        return wait(w, w.all_reduce_sum(reinterpret_cast<const float*>(in.data()), reinterpret_cast<float*>(out.data()),
                                        rank_bytes / 4));
      };
    } else if (kind == Coll::kAllGather) {
      call = [&] { return wait(w, w.all_gather(in.data(), out.data(), rank_bytes)); };
    } else {
      call = [&] { return wait(w, w.all_to_all_v(in.data(), split, out.data(), split)); };
    }
    double cpu_s = 0;
    PIPER_ASSIGN_OR_RETURN(double s, time_collective(w, iterations_for(o, bytes), o.warmup, call, &cpu_s));
    points.push_back({rank_bytes, s, cpu_s});
  }
  return fit_alpha_beta(std::move(points));
}

// A dependent arithmetic loop in registers/L1: `n` rounds of work, never optimised away.
float spin(int64_t n) {
  float acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = static_cast<float>(j);
  for (int64_t i = 0; i < n; ++i) {
    for (int j = 0; j < 16; ++j) acc[j] = acc[j] * 0.9999999f + 1e-7f;
  }
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

// Rounds of spin() taking `seconds` of one core: from a CPU-timed trial on every rank, the median over ranks (every
// rank then does the same work).
Result<int64_t> rounds_for(Communicator& w, double seconds) {
  constexpr int64_t kTrial = 200000;
  const double t0 = thread_cpu_s();
  volatile float sink = spin(kTrial);
  (void)sink;
  const double per_round = std::max(1e-12, (thread_cpu_s() - t0) / static_cast<double>(kTrial));
  PIPER_ASSIGN_OR_RETURN(auto all, gather_doubles(w, per_round));
  return static_cast<int64_t>(seconds / median(all));
}

// Waits as the runtime's stream threads do (idle_while_polling between tests, runtime Core::wait_comm).
Status wait_like_runtime(Communicator& w, Result<Handle> posted) {
  PIPER_ASSIGN_OR_RETURN(Handle h, std::move(posted));
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::seconds(static_cast<int>(kTimeoutS));
  for (;;) {
    PIPER_ASSIGN_OR_RETURN(bool done, w.test(h));
    if (done) return ok_status();
    if (Clock::now() > deadline) return w.wait(h, 1.0);  // names the missing ranks
    idle_while_polling(since(start));
  }
}

// One round of a compute-then-collective loop: per iteration every rank spins `spin_rounds`, then posts `call` and
// waits like the runtime. Per iteration (after the warm-up): the time from the last rank's arrival to the ranks'
// completion (mean over ranks), the iteration's wall time, and the ranks' CPU time in spin() (median over ranks).
// One all-gather per iteration carries the four figures of every rank.
Result<SyncRound> sync_loop(Communicator& w, int64_t spin_rounds, const LinkCalibrationOptions& o,
                            const std::function<Result<Handle>()>& call) {
  enum { kStart, kArrived, kDone, kWork, kFigures };
  const size_t p = static_cast<size_t>(w.size());
  SyncRound round;
  std::vector<double> all(kFigures * p), column(p);
  for (int i = 0; i < o.warmup + o.sync_iterations; ++i) {
    PIPER_RETURN_IF_ERROR(wait(w, w.barrier()));
    double mine[kFigures];
    mine[kStart] = wall_s();
    const double c0 = thread_cpu_s();
    volatile float sink = spin(spin_rounds);
    (void)sink;
    mine[kWork] = thread_cpu_s() - c0;
    mine[kArrived] = wall_s();
    PIPER_RETURN_IF_ERROR(wait_like_runtime(w, call()));
    mine[kDone] = wall_s();
    PIPER_RETURN_IF_ERROR(wait(w, w.all_gather(mine, all.data(), sizeof(mine))));
    if (i < o.warmup) continue;
    auto figure = [&](int f) {
      for (size_t r = 0; r < p; ++r) column[r] = all[r * kFigures + static_cast<size_t>(f)];
      return column;
    };
    const std::vector<double> starts = figure(kStart), dones = figure(kDone);
    double mean_done = 0;
    for (double d : dones) mean_done += d / static_cast<double>(p);
    round.after_last_arrival_s.push_back(mean_done - max_of(figure(kArrived)));
    round.iteration_s.push_back(max_of(dones) - *std::min_element(starts.begin(), starts.end()));
    round.work_cpu_s.push_back(median(figure(kWork)));
  }
  return round;
}

// An all-to-all of about `bytes` per rank over p ranks (p >= 1): whole bytes to each peer, at least one, sent from and
// received into buffers of exactly the bytes it moves (split.front() * p).
struct AllToAllBuffers {
  AllToAllBuffers(size_t bytes, size_t p)
      : split(p, std::max<size_t>(1, bytes / p)), in(split.front() * p, 1), out(in.size()) {}
  Result<Handle> post(Communicator& c) { return c.all_to_all_v(in.data(), split, out.data(), split); }
  std::vector<size_t> split;
  std::vector<uint8_t> in, out;
};

// The rounds of one compute-then-collective measurement, in the order they ran (idle[k] just before busy[k]).
struct SyncRounds {
  size_t bytes = 0;  // per rank
  std::vector<SyncRound> idle, busy;
};

// sync_rounds rounds of the loop without compute and with, interleaved (idle, busy, idle, busy, ...), so that a
// slow drift of the machine's load reaches both alike.
Result<SyncRounds> measure_sync(Communicator& w, const LinkCalibrationOptions& o, size_t bytes, bool all_to_all) {
  PIPER_ASSIGN_OR_RETURN(int64_t spin_rounds, rounds_for(w, o.compute_s));
  const size_t p = static_cast<size_t>(w.size());
  AllToAllBuffers a2a(all_to_all ? bytes : 0, p);
  std::vector<float> in(all_to_all ? 0 : std::max<size_t>(1, std::max<size_t>(1, bytes / p) * p / 4)), out(in.size());
  std::function<Result<Handle>()> call = [&]() -> Result<Handle> {
    if (all_to_all) return a2a.post(w);
    return w.all_reduce_sum(in.data(), out.data(), in.size());
  };
  SyncRounds r;
  r.bytes = all_to_all ? a2a.in.size() : in.size() * 4;
  for (int k = 0; k < o.sync_rounds; ++k) {
    PIPER_ASSIGN_OR_RETURN(SyncRound alone, sync_loop(w, 0, o, call));
    r.idle.push_back(std::move(alone));
    PIPER_ASSIGN_OR_RETURN(SyncRound computing, sync_loop(w, spin_rounds, o, call));
    r.busy.push_back(std::move(computing));
  }
  return r;
}

// A round's three sample fields, for the loops that pool them.
constexpr std::vector<double> SyncRound::*kSampleFields[] = {&SyncRound::after_last_arrival_s, &SyncRound::iteration_s,
                                                             &SyncRound::work_cpu_s};

// Every group's samples in one set of rounds, for groups of `size` consecutive ranks (pairs, a node's ranks): round k
// of the result holds round k of each group's first rank (the others hold the same figures). The groups all measured
// at once, and the simulator charges every group the same figure: its expected value over the groups, from R / size
// times the samples of one group.
Result<std::vector<SyncRound>> pool_groups(Communicator& world, const std::vector<SyncRound>& mine, int size) {
  std::vector<SyncRound> pooled(mine.size());
  for (size_t k = 0; k < mine.size(); ++k) {
    for (auto field : kSampleFields) {
      const std::vector<double>& v = mine[k].*field;
      std::vector<double> all(v.size() * static_cast<size_t>(world.size()));
      PIPER_RETURN_IF_ERROR(wait(world, world.all_gather(v.data(), all.data(), v.size() * sizeof(double))));
      for (size_t r = 0; r < static_cast<size_t>(world.size()); r += static_cast<size_t>(size)) {
        (pooled[k].*field)
            .insert((pooled[k].*field).end(), all.begin() + r * v.size(), all.begin() + (r + 1) * v.size());
      }
    }
  }
  return pooled;
}

Result<SyncUnderLoad> summarize(const SyncRounds& r, double trim) {
  PIPER_ASSIGN_OR_RETURN(SyncUnderLoad s, sync_under_load(r.idle, r.busy, trim));
  s.bytes = r.bytes;
  return s;
}

// The world all-reduce and all-to-all after compute and (R >= 4, even) the all-reduce in pairs, every pair at once.
// This rank's group of `size` consecutive ranks (the world splits into such groups, every rank calling).
Result<std::unique_ptr<Communicator>> consecutive_group(Communicator& w, int size, const std::string& name) {
  const int first = w.rank() / size * size;
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) ranks[static_cast<size_t>(i)] = first + i;
  return w.split(ranks, name);
}

// The compute-then-collective figures of the all-reduce (or all-to-all) over `group`, one of the world's groups of
// consecutive ranks all measuring at once, their samples pooled.
Result<SyncUnderLoad> group_sync(Communicator& w, Communicator& group, const LinkCalibrationOptions& o,
                                 bool all_to_all) {
  PIPER_ASSIGN_OR_RETURN(
      SyncRounds r, measure_sync(group, o, all_to_all ? o.sync_all_to_all_bytes : o.sync_all_reduce_bytes, all_to_all));
  PIPER_ASSIGN_OR_RETURN(r.idle, pool_groups(w, r.idle, group.size()));
  PIPER_ASSIGN_OR_RETURN(r.busy, pool_groups(w, r.busy, group.size()));
  return summarize(r, o.trim);
}

Status measure_syncs(Communicator& w, const LinkCalibrationOptions& o, LinkCalibration* c) {
  PIPER_ASSIGN_OR_RETURN(SyncRounds all_reduce, measure_sync(w, o, o.sync_all_reduce_bytes, false));
  PIPER_ASSIGN_OR_RETURN(c->sync_all_reduce, summarize(all_reduce, o.trim));
  PIPER_ASSIGN_OR_RETURN(SyncRounds all_to_all, measure_sync(w, o, o.sync_all_to_all_bytes, true));
  PIPER_ASSIGN_OR_RETURN(c->sync_all_to_all, summarize(all_to_all, o.trim));
  if (w.size() < 4 || w.size() % 2 != 0) return ok_status();
  PIPER_ASSIGN_OR_RETURN(auto pair, consecutive_group(w, 2, "calibrate_pair"));
  PIPER_ASSIGN_OR_RETURN(c->sync_pairs, group_sync(w, *pair, o, false));
  return ok_status();
}

double wait_cpu_slope(const std::vector<double>& wait_s, const std::vector<double>& cpu_s) {
  const size_t n = std::min(wait_s.size(), cpu_s.size());
  if (n < 2) return 0;
  double mw = 0, mc = 0;
  for (size_t i = 0; i < n; ++i) mw += wait_s[i] / static_cast<double>(n), mc += cpu_s[i] / static_cast<double>(n);
  double cov = 0, var = 0;
  for (size_t i = 0; i < n; ++i) cov += (wait_s[i] - mw) * (cpu_s[i] - mc), var += (wait_s[i] - mw) * (wait_s[i] - mw);
  return var > 0 ? std::clamp(cov / var, 0.0, 1.0) : 0.0;
}

// Processor sharing's time for `work` (one core's seconds per rank) on `cores`: every unfinished rank computes at
// min(1, cores / unfinished) of a core, the simulator's core pool without the exchange.
double fluid_makespan(std::vector<double> work, double cores) {
  std::sort(work.begin(), work.end());
  double t = 0, done = 0;
  for (size_t k = 0; k < work.size(); ++k) {
    const double rate = std::min(1.0, cores / static_cast<double>(work.size() - k));
    t += (work[k] - done) / rate;
    done = work[k];
  }
  return t;
}

// One task length of the exchange chain: `iterations` (after `warmup`) of compute then all-to-all, back to back;
// rank i mod P computes busiest_factor times the others in iteration i. The entry and exit times of every
// rank are gathered once at the end (one machine's monotonic clock, or one kernel's under the emulation).
Status chain_point(Communicator& w, const LinkCalibrationOptions& o, double task_s, ExchangeChain* chain) {
  const size_t p = static_cast<size_t>(w.size());
  AllToAllBuffers a2a(o.sync_all_to_all_bytes, p);
  chain->bytes = a2a.in.size();
  PIPER_ASSIGN_OR_RETURN(int64_t rounds, rounds_for(w, task_s));
  const int n = o.warmup + o.chain_iterations;
  std::vector<double> mine(2 * static_cast<size_t>(n));
  PIPER_RETURN_IF_ERROR(wait(w, w.barrier()));
  const double start = wall_s();
  double wait_cpu = 0;
  for (int i = 0; i < n; ++i) {
    const bool busiest = static_cast<size_t>(i) % p == static_cast<size_t>(w.rank());
    volatile int64_t work =
        busiest ? static_cast<int64_t>(o.chain_busiest_factor * static_cast<double>(rounds)) : rounds;
    volatile float sink = spin(work);  // volatile: one call per iteration, not hoisted out of the loop
    (void)sink;
    mine[2 * static_cast<size_t>(i)] = wall_s();
    const double cpu0 = thread_cpu_s();
    PIPER_RETURN_IF_ERROR(wait_like_runtime(w, a2a.post(w)));
    mine[2 * static_cast<size_t>(i) + 1] = wall_s();
    if (i >= o.warmup) wait_cpu += thread_cpu_s() - cpu0;
  }
  const double period = (wall_s() - start) / n;
  std::vector<double> all(mine.size() * p);
  PIPER_RETURN_IF_ERROR(wait(w, w.all_gather(mine.data(), all.data(), mine.size() * sizeof(double))));
  std::vector<double> lags;
  double waited = 0;
  for (size_t i = static_cast<size_t>(o.warmup); i < static_cast<size_t>(n); ++i) {
    double last_in = -1, last_out = 0, sum_out = 0;
    for (size_t r = 0; r < p; ++r) {
      const double entry = all[r * mine.size() + 2 * i], exit = all[r * mine.size() + 2 * i + 1];
      if (entry > last_in) last_in = entry, last_out = exit;
      sum_out += exit;
      waited += (exit - entry) / static_cast<double>(p * static_cast<size_t>(o.chain_iterations));
    }
    // Against the others' mean exit: the simulator completes the last one this much after the others.
    lags.push_back(std::max(0.0, last_out - (sum_out - last_out) / static_cast<double>(p - 1)));
  }
  PIPER_ASSIGN_OR_RETURN(double lag, trimmed_mean(std::move(lags), o.trim));
  std::vector<double> works(p, task_s);
  works[0] = o.chain_busiest_factor * task_s;
  chain->task_s.push_back(task_s);
  chain->lag_s.push_back(lag);
  chain->period_s.push_back(period);
  chain->fluid_period_s.push_back(fluid_makespan(works, o.cores));
  chain->wait_s.push_back(waited);
  PIPER_ASSIGN_OR_RETURN(double cpu, mean_over_ranks(w, wait_cpu / o.chain_iterations));
  chain->wait_cpu_s.push_back(cpu);
  return ok_status();
}

Status measure_chain(Communicator& w, const LinkCalibrationOptions& o, ExchangeChain* chain) {
  *chain = {};
  chain->busiest_factor = o.chain_busiest_factor;
  for (double task_s : o.chain_task_s) PIPER_RETURN_IF_ERROR(chain_point(w, o, task_s, chain));
  chain->measured = !chain->task_s.empty();
  chain->wait_cpu_share = wait_cpu_slope(chain->wait_s, chain->wait_cpu_s);
  return ok_status();
}

// The ranks of this rank's node (node-major ranks, find_nodes), for the figures of collectives inside one node;
// null when the world is one node or a node holds a single rank.
Result<std::unique_ptr<Communicator>> node_group(Communicator& w, const LinkCalibration& c, const std::string& name) {
  if (c.hosts.size() < 2 || c.ranks_per_node < 2) return std::unique_ptr<Communicator>();
  return consecutive_group(w, c.ranks_per_node, name);
}

// Across nodes: the compute-then-collective figures over each node's own ranks, every node at once, pooled.
Status measure_node_syncs(Communicator& w, const LinkCalibrationOptions& o, LinkCalibration* c) {
  PIPER_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> node, node_group(w, *c, "calibrate_node"));
  if (node == nullptr) return ok_status();
  PIPER_ASSIGN_OR_RETURN(c->node_sync_all_reduce, group_sync(w, *node, o, false));
  PIPER_ASSIGN_OR_RETURN(c->node_sync_all_to_all, group_sync(w, *node, o, true));
  return ok_status();
}

// Threads spinning spin() in chunks until stopped: a rank's compute streams keeping its cores busy. They count their
// chunks, so that what a collective takes from them can be measured.
class Spinners {
 public:
  explicit Spinners(int n) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        const double c0 = thread_cpu_s();
        while (!stop_.load(std::memory_order_relaxed)) {
          volatile float sink = spin(kChunk);
          (void)sink;
          chunks_.fetch_add(1, std::memory_order_relaxed);
        }
        cpu_s_.fetch_add(thread_cpu_s() - c0);
      });
    }
  }
  ~Spinners() { stop(); }
  Spinners(const Spinners&) = delete;
  Spinners& operator=(const Spinners&) = delete;
  int64_t chunks() const { return chunks_.load(std::memory_order_relaxed); }
  // Stops and joins the threads; then the CPU seconds of one chunk.
  double stop() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    const int64_t done = chunks_.load();  // every thread joined: all of their chunks
    return done > 0 ? cpu_s_.load() / static_cast<double>(done) : 0;
  }

 private:
  static constexpr int64_t kChunk = 20000;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> chunks_{0};
  std::atomic<double> cpu_s_{0};
  std::vector<std::thread> threads_;
};

// `call` back to back, waiting like the runtime: the time per call (trimmed mean over calls) on this rank.
Result<double> per_call(Communicator& w, const LinkCalibrationOptions& o, const std::function<Status()>& call) {
  PIPER_RETURN_IF_ERROR(wait(w, w.barrier()));
  std::vector<double> samples;
  for (int i = 0; i < o.warmup + o.contended_iterations; ++i) {
    auto t0 = Clock::now();
    PIPER_RETURN_IF_ERROR(call());
    if (i >= o.warmup) samples.push_back(since(t0));
  }
  return trimmed_mean(std::move(samples), o.trim);
}

// The spinning threads' chunks per second while the rank's main thread sleeps `seconds`.
double alone_rate(const Spinners& spinning, double seconds) {
  const int64_t c0 = spinning.chunks();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return static_cast<double>(spinning.chunks() - c0) / since(t0);
}

// One window of calls beside the spinning threads: the time per call, the wall time, the chunks the threads did and
// the process's CPU (this rank's).
struct BusyWindow {
  double per_call_s = 0, wall_s = 0, chunks = 0, process_cpu_s = 0;
};

Result<BusyWindow> busy_window(Communicator& w, const LinkCalibrationOptions& o, const Spinners& spinning,
                               const std::function<Status()>& call) {
  BusyWindow b;
  const int64_t c0 = spinning.chunks();
  const auto t0 = Clock::now();
  const double process0 = process_cpu_s();
  PIPER_ASSIGN_OR_RETURN(b.per_call_s, per_call(w, o, call));
  b.process_cpu_s = process_cpu_s() - process0;
  b.chunks = static_cast<double>(spinning.chunks() - c0);
  b.wall_s = since(t0);
  return b;
}

// per_call without compute, then with `threads` spinning threads on every rank, in windows of calls each between two
// windows of the threads alone (the rank's main thread asleep: their rate of work), A B A ... B A; per window the work
// the threads lost against the mean rate of its two neighbours (a steady drift of the machine cancels), in CPU
// seconds per call, and the process's CPU less the threads'. Each figure is the median over windows of the mean over
// ranks.
Result<ContendedTiming> contended(Communicator& w, const LinkCalibrationOptions& o, int threads, size_t bytes,
                                  const std::function<Status()>& call) {
  ContendedTiming t;
  t.measured = true;
  t.bytes = bytes;
  t.compute_threads = threads;
  PIPER_ASSIGN_OR_RETURN(double idle, per_call(w, o, call));
  PIPER_ASSIGN_OR_RETURN(t.idle_s, mean_over_ranks(w, idle));
  Spinners spinning(threads);
  PIPER_RETURN_IF_ERROR(wait(w, w.barrier()));
  std::vector<double> rates{alone_rate(spinning, o.contended_alone_s)};
  std::vector<BusyWindow> windows;
  for (int k = 0; k < o.contended_windows; ++k) {
    PIPER_ASSIGN_OR_RETURN(BusyWindow b, busy_window(w, o, spinning, call));
    windows.push_back(b);
    rates.push_back(alone_rate(spinning, o.contended_alone_s));
  }
  const double chunk_cpu = spinning.stop();
  const double calls = o.warmup + o.contended_iterations;
  std::vector<double> busy, cpu, comm_cpu;
  for (size_t k = 0; k < windows.size(); ++k) {
    const BusyWindow& b = windows[k];
    const double lost = (rates[k] + rates[k + 1]) / 2 * b.wall_s - b.chunks;
    PIPER_ASSIGN_OR_RETURN(double per_call_s, mean_over_ranks(w, b.per_call_s));
    PIPER_ASSIGN_OR_RETURN(double lost_s, mean_over_ranks(w, std::max(0.0, lost) * chunk_cpu / calls));
    PIPER_ASSIGN_OR_RETURN(double own_s,
                           mean_over_ranks(w, std::max(0.0, b.process_cpu_s - b.chunks * chunk_cpu) / calls));
    busy.push_back(per_call_s);
    cpu.push_back(lost_s);
    comm_cpu.push_back(own_s);
  }
  t.busy_s = median(busy);
  t.cpu_s = median(cpu);
  t.comm_cpu_s = median(comm_cpu);
  t.cpu_s_windows = cpu;
  t.excess_s = std::max(0.0, t.busy_s - t.idle_s);
  return t;
}

// The compute threads per rank beside the calls: LinkCalibrationOptions::compute_threads, else the node's cores over
// its ranks (at least 1).
int spinning_threads(const LinkCalibrationOptions& o, int ranks_per_node) {
  return o.compute_threads > 0 ? o.compute_threads
                               : std::max(1, static_cast<int>(o.cores / std::max(1, ranks_per_node)));
}

// The all-reduce of sync_all_reduce_bytes over `group` while the cores compute (every rank of `w` takes part).
Result<ContendedTiming> contended_all_reduce(Communicator& w, Communicator& group, const LinkCalibrationOptions& o,
                                             int threads) {
  std::vector<float> in(std::max<size_t>(1, o.sync_all_reduce_bytes / 4)), out(in.size());
  return contended(w, o, threads, in.size() * 4,
                   [&] { return wait_like_runtime(group, group.all_reduce_sum(in.data(), out.data(), in.size())); });
}

// The all-to-all of sync_all_to_all_bytes per rank over `group` while the cores compute.
Result<ContendedTiming> contended_all_to_all(Communicator& w, Communicator& group, const LinkCalibrationOptions& o,
                                             int threads) {
  AllToAllBuffers a2a(o.sync_all_to_all_bytes, static_cast<size_t>(group.size()));
  return contended(w, o, threads, a2a.in.size(), [&] { return wait_like_runtime(group, a2a.post(group)); });
}

// The world all-reduce, all-gather and all-to-all of contended_large_bytes while the cores compute (the all-gather's
// gathered tensor and the all-to-all's send buffer are that large), contended_large_iterations calls a window: what
// a byte costs the cores when it is summed, gathered or exchanged (copy_cpu_s_per_byte and its kinds).
Status measure_contended_large(Communicator& w, const LinkCalibrationOptions& o, int threads, LinkCalibration* c) {
  LinkCalibrationOptions large = o;
  large.contended_iterations = o.contended_large_iterations;
  large.warmup = 1;
  const size_t p = static_cast<size_t>(w.size());
  std::vector<float> in(std::max<size_t>(1, o.contended_large_bytes / 4), 1.0f), out(in.size());
  PIPER_ASSIGN_OR_RETURN(c->contended_all_reduce_large, contended(w, large, threads, in.size() * 4, [&] {
                           return wait_like_runtime(w, w.all_reduce_sum(in.data(), out.data(), in.size()));
                         }));
  const size_t share = std::max<size_t>(1, in.size() / p);
  PIPER_ASSIGN_OR_RETURN(c->contended_all_gather_large, contended(w, large, threads, share * p * 4, [&] {
                           return wait_like_runtime(w, w.all_gather(in.data(), out.data(), share * 4));
                         }));
  AllToAllBuffers a2a(o.contended_large_bytes, p);
  PIPER_ASSIGN_OR_RETURN(c->contended_all_to_all_large, contended(w, large, threads, a2a.in.size(),
                                                                  [&] { return wait_like_runtime(w, a2a.post(w)); }));
  return ok_status();
}

// The world all-reduce (sync_all_reduce_bytes) and all-to-all (sync_all_to_all_bytes), the all-reduce in pairs and
// the ping-pong in pairs (R even), each while the cores compute and without.
Status measure_contended(Communicator& w, const LinkCalibrationOptions& o, int ranks_per_node, LinkCalibration* c) {
  const int threads = spinning_threads(o, ranks_per_node);
  PIPER_ASSIGN_OR_RETURN(c->contended_all_reduce, contended_all_reduce(w, w, o, threads));
  PIPER_RETURN_IF_ERROR(measure_contended_large(w, o, threads, c));
  PIPER_ASSIGN_OR_RETURN(c->contended_all_to_all, contended_all_to_all(w, w, o, threads));
  if (w.size() < 4 || w.size() % 2 != 0) return ok_status();
  PIPER_ASSIGN_OR_RETURN(auto pair, consecutive_group(w, 2, "calibrate_contended_pair"));
  PIPER_ASSIGN_OR_RETURN(c->contended_pairs, contended_all_reduce(w, *pair, o, threads));
  std::vector<uint8_t> msg(o.contended_p2p_bytes, 1);
  const int peer = w.rank() ^ 1;
  const bool starts = w.rank() % 2 == 0;
  PIPER_ASSIGN_OR_RETURN(
      c->contended_p2p, contended(w, o, threads, msg.size(), [&]() -> Status {
        for (int step = 0; step < 2; ++step) {
          const bool sending = starts == (step == 0);
          PIPER_RETURN_IF_ERROR(wait_like_runtime(
              w, sending ? w.isend(msg.data(), msg.size(), peer, 9) : w.irecv(msg.data(), msg.size(), peer, 9)));
        }
        return ok_status();
      }));
  // A ping-pong is two transfers: per transfer (its CPU too: the simulator charges cpu_p2p_s per transfer).
  ContendedTiming& p2p = c->contended_p2p;
  for (double* v : {&p2p.idle_s, &p2p.busy_s, &p2p.excess_s, &p2p.cpu_s, &p2p.comm_cpu_s}) *v /= 2;
  for (double& v : p2p.cpu_s_windows) v /= 2;
  return ok_status();
}

// Across nodes: the all-reduce and all-to-all over each node's own ranks while the cores compute, every node at once.
Status measure_node_contended(Communicator& w, const LinkCalibrationOptions& o, LinkCalibration* c) {
  PIPER_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> node, node_group(w, *c, "calibrate_contended_node"));
  if (node == nullptr) return ok_status();
  const int threads = spinning_threads(o, c->ranks_per_node);
  PIPER_ASSIGN_OR_RETURN(c->node_contended_all_reduce, contended_all_reduce(w, *node, o, threads));
  PIPER_ASSIGN_OR_RETURN(c->node_contended_all_to_all, contended_all_to_all(w, *node, o, threads));
  return ok_status();
}

void progress(const Communicator& w, const char* what) {
  if (w.rank() == 0) std::fprintf(stderr, "calibrate: %s\n", what);
}

}  // namespace

Status LinkCalibrationOptions::validate() const {
  if (p2p_bytes.size() < 2 || collective_bytes.size() < 2) {
    return invalid_argument("calibrate: links need at least two message sizes for an alpha-beta fit");
  }
  if (iterations < 1 || warmup < 0 || sync_rounds < 1 || sync_iterations < 1 || contended_iterations < 1 ||
      contended_windows < 1 || contended_large_iterations < 1 || compute_threads < 0 || chain_iterations < 1) {
    return invalid_argument("calibrate: iterations and rounds must be >= 1");
  }
  if (!(trim >= 0 && trim < 0.5)) {
    return invalid_argument("calibrate: trim = " + std::to_string(trim) + " is out of range; allowed [0, 0.5)");
  }
  if (!(compute_s > 0) || !(cores > 0) || sync_all_reduce_bytes < 4 || sync_all_to_all_bytes < 1 ||
      !(contended_alone_s > 0)) {
    return invalid_argument("calibrate: the compute-then-collective loop needs compute_s > 0, cores > 0, >= 4 bytes");
  }
  for (size_t i = 0; i < chain_task_s.size(); ++i) {
    const double t = chain_task_s[i];
    if (!(t > 0 && t <= 1) || (i > 0 && !(t > chain_task_s[i - 1]))) {
      return invalid_argument("calibrate: the exchange chain's task length " + std::to_string(t) +
                              " s is out of range or out of order; allowed (0, 1], ascending");
    }
  }
  if (!(chain_busiest_factor >= 1 && chain_busiest_factor <= 16)) {
    return invalid_argument("calibrate: the exchange chain's busiest factor " + std::to_string(chain_busiest_factor) +
                            " is out of range; allowed [1, 16]");
  }
  return ok_status();
}

Result<double> trimmed_mean(std::vector<double> samples, double trim) {
  if (samples.empty()) return invalid_argument("trimmed_mean: no samples; measure at least one iteration");
  if (!(trim >= 0 && trim < 0.5)) {
    return invalid_argument("trimmed_mean: trim = " + std::to_string(trim) +
                            " is out of range; allowed [0, 0.5) (the fraction dropped off each end)");
  }
  for (double v : samples) {
    if (!std::isfinite(v)) {
      return invalid_argument("trimmed_mean: a sample is " + std::to_string(v) + "; give finite times");
    }
  }
  std::sort(samples.begin(), samples.end());  // also fixes the order of the sum
  const size_t cut = static_cast<size_t>(std::floor(trim * static_cast<double>(samples.size())));
  double sum = 0;
  for (size_t i = cut; i < samples.size() - cut; ++i) sum += samples[i];
  return sum / static_cast<double>(samples.size() - 2 * cut);
}

namespace {

using Estimator = std::function<Result<double>(std::vector<double>)>;

// The typical value of samples (their median); InvalidArgument for none.
Result<double> typical(std::vector<double> samples) {
  if (samples.empty()) return invalid_argument("calibrate: no samples; measure at least one iteration");
  return median(std::move(samples));
}

// The rounds' samples pooled: `estimate` of the times, the median of the CPU times (0 where none were taken).
Result<SyncTiming> pooled_timing(const std::vector<SyncRound>& rounds, const Estimator& estimate) {
  SyncRound all;
  for (const SyncRound& r : rounds) {
    for (auto field : kSampleFields) (all.*field).insert((all.*field).end(), (r.*field).begin(), (r.*field).end());
  }
  SyncTiming t;
  PIPER_ASSIGN_OR_RETURN(t.after_last_arrival_s, estimate(all.after_last_arrival_s));
  if (!all.iteration_s.empty()) {
    PIPER_ASSIGN_OR_RETURN(t.iteration_s, estimate(all.iteration_s));
  }
  t.work_cpu_s = median(all.work_cpu_s);
  return t;
}

}  // namespace

// The collective after compute by its expected value (what the simulator adds up over a step); alone by its typical
// value, as the alpha-beta fits that price the collective itself: the idle loop's own outliers (4 ranks polling on
// 2 cores, one descheduled for a time slice) would otherwise eat the excess.
Result<SyncUnderLoad> sync_under_load(const std::vector<SyncRound>& idle, const std::vector<SyncRound>& busy,
                                      double trim) {
  if (idle.empty() || idle.size() != busy.size()) {
    return invalid_argument("calibrate: synchronisation needs as many idle rounds as busy ones, at least one (got " +
                            std::to_string(idle.size()) + " and " + std::to_string(busy.size()) + ")");
  }
  const Estimator expected = [trim](std::vector<double> v) { return trimmed_mean(std::move(v), trim); };
  SyncUnderLoad s;
  s.measured = true;
  s.trim = trim;
  s.samples_per_round = static_cast<int>(idle.front().after_last_arrival_s.size());
  PIPER_ASSIGN_OR_RETURN(s.idle, pooled_timing(idle, typical));
  PIPER_ASSIGN_OR_RETURN(s.busy, pooled_timing(busy, expected));
  s.excess_s = std::max(0.0, s.busy.after_last_arrival_s - s.idle.after_last_arrival_s);
  for (size_t k = 0; k < idle.size(); ++k) {
    PIPER_ASSIGN_OR_RETURN(double alone, typical(idle[k].after_last_arrival_s));
    PIPER_ASSIGN_OR_RETURN(double computing, expected(busy[k].after_last_arrival_s));
    s.round_excess_s.push_back(std::max(0.0, computing - alone));
  }
  const auto [lo, hi] = std::minmax_element(s.round_excess_s.begin(), s.round_excess_s.end());
  s.round_excess_min_s = *lo;
  s.round_excess_max_s = *hi;
  return s;
}

AlphaBeta fit_alpha_beta(std::vector<SizedTime> points) {
  AlphaBeta f;
  std::sort(points.begin(), points.end(), [](const SizedTime& a, const SizedTime& b) { return a.bytes < b.bytes; });
  f.points = points;
  if (points.size() < 2 || points.back().bytes <= points.front().bytes) return f;
  f.measured = true;
  f.alpha_s = points.front().seconds;
  const double excess = std::max(points.back().seconds - f.alpha_s, 1e-12);
  f.bw_bytes_per_s = static_cast<double>(points.back().bytes - points.front().bytes) / excess;
  return f;
}

Result<LinkCalibration> measure_links(Communicator& world, const LinkCalibrationOptions& options) {
  PIPER_RETURN_IF_ERROR(options.validate());
  if (world.size() < 2) return invalid_argument("calibrate: links need at least 2 ranks (--ranks 2 or more)");
  LinkCalibration c;
  c.cores = options.cores;
  PIPER_RETURN_IF_ERROR(find_nodes(world, &c));
  if (c.ranks_per_node >= 2) {
    progress(world, "point to point inside the node (ranks 0 and 1)");
    PIPER_ASSIGN_OR_RETURN(c.intra, measure_p2p(world, 0, 1, options));
  }
  if (c.hosts.size() > 1) {
    progress(world, "point to point between nodes (rank 0 and the first rank of node 1)");
    PIPER_ASSIGN_OR_RETURN(c.inter, measure_p2p(world, 0, c.ranks_per_node, options));
  }
  progress(world, "all-reduce, all-gather, all-to-all over every rank");
  PIPER_ASSIGN_OR_RETURN(c.all_reduce, measure_collective(world, Coll::kAllReduce, options));
  PIPER_ASSIGN_OR_RETURN(c.all_gather, measure_collective(world, Coll::kAllGather, options));
  PIPER_ASSIGN_OR_RETURN(c.all_to_all, measure_collective(world, Coll::kAllToAll, options));
  progress(world, "compute, then all-reduce / all-to-all, on every rank at once (the runtime's waits)");
  PIPER_RETURN_IF_ERROR(measure_syncs(world, options, &c));
  progress(world, "compute and all-to-all back to back (the exchange chain of an ep layer), per task length");
  PIPER_RETURN_IF_ERROR(measure_chain(world, options, &c.exchange_chain));
  progress(world, "all-reduce, all-to-all, pairs and point to point while every rank's cores compute");
  PIPER_RETURN_IF_ERROR(measure_contended(world, options, c.ranks_per_node, &c));
  if (c.hosts.size() > 1 && c.ranks_per_node >= 2) {
    progress(world, "the same inside each node (every node's ranks at once)");
    PIPER_RETURN_IF_ERROR(measure_node_syncs(world, options, &c));
    PIPER_RETURN_IF_ERROR(measure_node_contended(world, options, &c));
  }
  return c;
}

namespace {

OrderedJson fit_json(const AlphaBeta& f) {
  OrderedJson points = OrderedJson::array();
  for (const SizedTime& p : f.points) {
    points.push_back({{"bytes", p.bytes}, {"seconds", p.seconds}});
    if (p.cpu_s > 0) points.back()["cpu_s"] = p.cpu_s;
  }
  return {{"alpha_s", f.alpha_s}, {"bw_bytes_per_s", f.bw_bytes_per_s}, {"points", points}};
}

// The rise of `large`'s own CPU per call over the 4 KiB all-reduce's (the per-call part), over the rise of the bytes
// a rank's port carries (`port` per byte of the measured size); 0 when either is unmeasured.
double cpu_per_port_byte(const LinkCalibration& c, const ContendedTiming& large, double port) {
  const ContendedTiming& small = c.contended_all_reduce;
  if (!small.measured || !large.measured || c.ranks < 2 || large.bytes <= small.bytes) return 0;
  const double n = static_cast<double>(c.ranks);
  const double port_bytes = port * (n - 1) / n * static_cast<double>(large.bytes - small.bytes);
  return std::max(0.0, large.comm_cpu_s - small.comm_cpu_s) / port_bytes;
}

}  // namespace

double copy_cpu_s_per_byte(const LinkCalibration& c) { return cpu_per_port_byte(c, c.contended_all_reduce_large, 2); }

double gather_copy_cpu_s_per_byte(const LinkCalibration& c) {
  return cpu_per_port_byte(c, c.contended_all_gather_large, 1);
}

double exchange_copy_cpu_s_per_byte(const LinkCalibration& c) {
  return cpu_per_port_byte(c, c.contended_all_to_all_large, 1);
}

EffectiveLink effective_intra_link(const LinkCalibration& c) {
  EffectiveLink e;
  const double n = static_cast<double>(c.ranks);
  if (c.hosts.size() != 1 || c.ranks < 2) return e;
  // Steps of the simulator's algorithm, and the bytes each rank's port carries per byte of the measured size.
  const AlphaBeta* fits[3] = {&c.all_reduce, &c.all_gather, &c.all_to_all};
  const double steps[3] = {2 * (n - 1), n - 1, 1};
  const double port_bytes[3] = {2 * (n - 1) / n, n - 1, (n - 1) / n};
  std::vector<double> lat, bw, cpu;
  for (int k = 0; k < 3; ++k) {
    const AlphaBeta& f = *fits[k];
    if (!f.measured) return e;
    const SizedTime& small = f.points.front();
    const SizedTime& large = f.points.back();
    e.latency_by_kind_s[k] = small.seconds / steps[k];
    e.bw_by_kind[k] =
        port_bytes[k] * static_cast<double>(large.bytes - small.bytes) / std::max(large.seconds - small.seconds, 1e-12);
    e.cpu_per_byte_by_kind[k] =
        std::max(0.0, large.cpu_s - small.cpu_s) / (port_bytes[k] * static_cast<double>(large.bytes - small.bytes));
    lat.push_back(e.latency_by_kind_s[k]);
    bw.push_back(e.bw_by_kind[k]);
    cpu.push_back(e.cpu_per_byte_by_kind[k]);
  }
  e.measured = true;
  e.latency_s = median(lat);
  e.bw_bytes_per_s = median(bw);
  e.cpu_s_per_byte = median(cpu);
  return e;
}

OrderedJson link_calibration_json(const LinkCalibration& c, const std::string& source) {
  OrderedJson j;
  j["source"] = source;
  j["ranks"] = c.ranks;
  j["ranks_per_node"] = c.ranks_per_node;
  OrderedJson node;
  const EffectiveLink link = effective_intra_link(c);
  if (link.measured) {
    node["intra"] = {{"latency_s", link.latency_s}, {"bw_bytes_per_s", link.bw_bytes_per_s}};
  } else if (c.intra.measured) {
    node["intra"] = {{"latency_s", c.intra.alpha_s}, {"bw_bytes_per_s", c.intra.bw_bytes_per_s}};
  }
  if (const double per_byte = copy_cpu_s_per_byte(c); per_byte > 0) node["copy_cpu_s_per_byte"] = per_byte;
  if (const double per_byte = gather_copy_cpu_s_per_byte(c); per_byte > 0) {
    node["gather_copy_cpu_s_per_byte"] = per_byte;
  }
  if (const double per_byte = exchange_copy_cpu_s_per_byte(c); per_byte > 0) {
    node["exchange_copy_cpu_s_per_byte"] = per_byte;
  }
  if (c.inter.measured) {
    node["nic_latency_s"] = c.inter.alpha_s;
    node["nic_bw_bytes_per_s"] = c.inter.bw_bytes_per_s;
  }
  if (!node.empty()) j["node"] = node;
  OrderedJson m;
  m["cores"] = c.cores;
  if (c.intra.measured) m["p2p_intra"] = fit_json(c.intra);
  if (c.inter.measured) m["p2p_inter"] = fit_json(c.inter);
  m["all_reduce"] = fit_json(c.all_reduce);
  m["all_gather"] = fit_json(c.all_gather);
  m["all_to_all"] = fit_json(c.all_to_all);
  if (link.measured) {
    m["intra_from_collectives"] = {
        {"latency_s",
         {{"all_reduce", link.latency_by_kind_s[0]},
          {"all_gather", link.latency_by_kind_s[1]},
          {"all_to_all", link.latency_by_kind_s[2]}}},
        {"bw_bytes_per_s",
         {{"all_reduce", link.bw_by_kind[0]}, {"all_gather", link.bw_by_kind[1]}, {"all_to_all", link.bw_by_kind[2]}}},
        {"cpu_s_per_byte",
         {{"all_reduce", link.cpu_per_byte_by_kind[0]},
          {"all_gather", link.cpu_per_byte_by_kind[1]},
          {"all_to_all", link.cpu_per_byte_by_kind[2]}}}};
  }
  auto sync = [](const SyncUnderLoad& u) {
    auto timing = [](const SyncTiming& t) {
      return OrderedJson{{"after_last_arrival_s", t.after_last_arrival_s},
                         {"iteration_s", t.iteration_s},
                         {"work_cpu_s", t.work_cpu_s}};
    };
    return OrderedJson{{"bytes", u.bytes},
                       {"idle", timing(u.idle)},
                       {"computing", timing(u.busy)},
                       {"excess_s", u.excess_s},
                       {"trim", u.trim},
                       {"samples_per_round", u.samples_per_round},
                       {"round_excess_s", u.round_excess_s},
                       {"round_excess_min_s", u.round_excess_min_s},
                       {"round_excess_max_s", u.round_excess_max_s}};
  };
  if (c.sync_all_reduce.measured) m["sync_all_reduce"] = sync(c.sync_all_reduce);
  if (c.sync_all_to_all.measured) m["sync_all_to_all"] = sync(c.sync_all_to_all);
  if (c.sync_pairs.measured) m["sync_all_reduce_pairs"] = sync(c.sync_pairs);
  if (const ExchangeChain& x = c.exchange_chain; x.measured) {
    OrderedJson points = OrderedJson::array();
    for (size_t i = 0; i < x.task_s.size(); ++i) {
      points.push_back({{"task_s", x.task_s[i]},
                        {"lag_s", x.lag_s[i]},
                        {"period_s", x.period_s[i]},
                        {"fluid_period_s", x.fluid_period_s[i]},
                        {"wait_s", x.wait_s[i]},
                        {"wait_cpu_s", x.wait_cpu_s[i]}});
    }
    m["exchange_chain"] = {{"bytes", x.bytes},
                           {"busiest_factor", x.busiest_factor},
                           {"wait_cpu_share", x.wait_cpu_share},
                           {"points", points}};
  }
  auto busy = [](const ContendedTiming& t) {
    return OrderedJson{{"bytes", t.bytes},           {"compute_threads", t.compute_threads},
                       {"idle_s", t.idle_s},         {"computing_s", t.busy_s},
                       {"excess_s", t.excess_s},     {"cpu_s", t.cpu_s},
                       {"comm_cpu_s", t.comm_cpu_s}, {"cpu_s_windows", t.cpu_s_windows}};
  };
  if (c.contended_all_reduce.measured) m["contended_all_reduce"] = busy(c.contended_all_reduce);
  if (c.contended_all_reduce_large.measured) m["contended_all_reduce_large"] = busy(c.contended_all_reduce_large);
  if (c.contended_all_gather_large.measured) m["contended_all_gather_large"] = busy(c.contended_all_gather_large);
  if (c.contended_all_to_all_large.measured) m["contended_all_to_all_large"] = busy(c.contended_all_to_all_large);
  if (c.contended_all_to_all.measured) m["contended_all_to_all"] = busy(c.contended_all_to_all);
  if (c.contended_pairs.measured) m["contended_all_reduce_pairs"] = busy(c.contended_pairs);
  if (c.contended_p2p.measured) m["contended_p2p"] = busy(c.contended_p2p);
  if (c.node_sync_all_reduce.measured) m["node_sync_all_reduce"] = sync(c.node_sync_all_reduce);
  if (c.node_sync_all_to_all.measured) m["node_sync_all_to_all"] = sync(c.node_sync_all_to_all);
  if (c.node_contended_all_reduce.measured) m["node_contended_all_reduce"] = busy(c.node_contended_all_reduce);
  if (c.node_contended_all_to_all.measured) m["node_contended_all_to_all"] = busy(c.node_contended_all_to_all);
  j["measured"] = m;
  return j;
}

std::string to_text(const LinkCalibration& c) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "links     %d ranks, %d per node on %zu host(s), %g cores per node\n", c.ranks,
                c.ranks_per_node, c.hosts.size(), c.cores);
  out += line;
  auto fit = [&](const char* name, const AlphaBeta& f, const char* per) {
    if (!f.measured) return;
    std::snprintf(line, sizeof(line), "  %-22s alpha %10s  bandwidth %8.3f GB/s%s\n", name,
                  format_seconds(f.alpha_s).c_str(), f.bw_bytes_per_s / 1e9, per);
    out += line;
  };
  fit("p2p inside the node", c.intra, " (half round trip)");
  fit("p2p between nodes", c.inter, " (half round trip)");
  fit("all-reduce", c.all_reduce, " (bytes per rank)");
  fit("all-gather", c.all_gather, " (bytes per rank)");
  fit("all-to-all", c.all_to_all, " (bytes per rank)");
  if (const EffectiveLink e = effective_intra_link(c); e.measured) {
    std::snprintf(line, sizeof(line),
                  "  simulator's intra link   %s per step, %.3f GB/s per port (median of all-reduce / all-gather / "
                  "all-to-all: %s / %s / %s, %.3f / %.3f / %.3f GB/s)\n",
                  format_seconds(e.latency_s).c_str(), e.bw_bytes_per_s / 1e9,
                  format_seconds(e.latency_by_kind_s[0]).c_str(), format_seconds(e.latency_by_kind_s[1]).c_str(),
                  format_seconds(e.latency_by_kind_s[2]).c_str(), e.bw_by_kind[0] / 1e9, e.bw_by_kind[1] / 1e9,
                  e.bw_by_kind[2] / 1e9);
    out += line;
    std::snprintf(line, sizeof(line),
                  "  CPU per byte carried     %.3f ns (median of %.3f / %.3f / %.3f; one copy at the port's rate: "
                  "%.3f ns)\n",
                  e.cpu_s_per_byte * 1e9, e.cpu_per_byte_by_kind[0] * 1e9, e.cpu_per_byte_by_kind[1] * 1e9,
                  e.cpu_per_byte_by_kind[2] * 1e9, 1e9 / e.bw_bytes_per_s);
    out += line;
  }
  auto sync = [&](const char* name, const SyncUnderLoad& u) {
    if (!u.measured) return;
    std::snprintf(line, sizeof(line),
                  "  %s of %s after %s of compute per rank: done %s after the last rank arrived (%s when they "
                  "arrive together): %s more per synchronisation\n",
                  name, format_bytes(static_cast<double>(u.bytes)).c_str(), format_seconds(u.busy.work_cpu_s).c_str(),
                  format_seconds(u.busy.after_last_arrival_s).c_str(),
                  format_seconds(u.idle.after_last_arrival_s).c_str(), format_seconds(u.excess_s).c_str());
    out += line;
    std::snprintf(line, sizeof(line),
                  "    %zu rounds of %d samples: %s .. %s more per round (trimmed means, %.0f%% off each end)\n",
                  u.round_excess_s.size(), u.samples_per_round, format_seconds(u.round_excess_min_s).c_str(),
                  format_seconds(u.round_excess_max_s).c_str(), u.trim * 100);
    out += line;
  };
  sync("all-reduce", c.sync_all_reduce);
  sync("all-to-all", c.sync_all_to_all);
  sync("all-reduce in pairs", c.sync_pairs);
  if (const ExchangeChain& x = c.exchange_chain; x.measured) {
    std::snprintf(line, sizeof(line),
                  "  exchange chain (compute, then all-to-all of %s, back to back; one rank in turn computes %.1fx): "
                  "the last rank to arrive leaves after the others by\n",
                  format_bytes(static_cast<double>(x.bytes)).c_str(), x.busiest_factor);
    out += line;
    for (size_t i = 0; i < x.task_s.size(); ++i) {
      std::snprintf(line, sizeof(line),
                    "    task %s: %s (period %s, processor sharing of the tasks alone %s; a rank waits %s an exchange, "
                    "polling %s of CPU)\n",
                    format_seconds(x.task_s[i]).c_str(), format_seconds(x.lag_s[i]).c_str(),
                    format_seconds(x.period_s[i]).c_str(), format_seconds(x.fluid_period_s[i]).c_str(),
                    format_seconds(x.wait_s[i]).c_str(), format_seconds(x.wait_cpu_s[i]).c_str());
      out += line;
    }
    std::snprintf(line, sizeof(line), "    the waits' CPU rises by %.1f%% of a core per second waited\n",
                  x.wait_cpu_share * 100);
    out += line;
  }
  auto busy = [&](const char* name, const ContendedTiming& t) {
    if (!t.measured) return;
    const auto [low, high] = std::minmax_element(t.cpu_s_windows.begin(), t.cpu_s_windows.end());
    const double lowest = low == t.cpu_s_windows.end() ? t.cpu_s : *low;
    const double highest = high == t.cpu_s_windows.end() ? t.cpu_s : *high;
    std::snprintf(
        line, sizeof(line),
        "  %s of %s while %d thread%s per rank compute%s: %s per call (%s without): %s more; it takes %s "
        "of CPU from the compute per rank (median of %zu windows, %s..%s; its own threads' CPU: %s)\n",
        name, format_bytes(static_cast<double>(t.bytes)).c_str(), t.compute_threads, t.compute_threads == 1 ? "" : "s",
        t.compute_threads == 1 ? "s" : "", format_seconds(t.busy_s).c_str(), format_seconds(t.idle_s).c_str(),
        format_seconds(t.excess_s).c_str(), format_seconds(t.cpu_s).c_str(), t.cpu_s_windows.size(),
        format_seconds(lowest).c_str(), format_seconds(highest).c_str(), format_seconds(t.comm_cpu_s).c_str());
    out += line;
  };
  busy("all-reduce", c.contended_all_reduce);
  busy("all-reduce", c.contended_all_reduce_large);
  busy("all-gather", c.contended_all_gather_large);
  busy("all-to-all", c.contended_all_to_all_large);
  if (const double per_byte = copy_cpu_s_per_byte(c); per_byte > 0) {
    std::snprintf(line, sizeof(line),
                  "  copies while the cores compute: %.3f ns of CPU per byte a rank carries summed, %.3f gathered, "
                  "%.3f exchanged (each large call's own CPU over the small all-reduce's; node.copy_cpu_s_per_byte, "
                  "gather_copy_cpu_s_per_byte, exchange_copy_cpu_s_per_byte)\n",
                  per_byte * 1e9, gather_copy_cpu_s_per_byte(c) * 1e9, exchange_copy_cpu_s_per_byte(c) * 1e9);
    out += line;
  }
  busy("all-to-all", c.contended_all_to_all);
  busy("all-reduce in pairs", c.contended_pairs);
  busy("point to point in pairs", c.contended_p2p);
  sync("inside each node: all-reduce", c.node_sync_all_reduce);
  sync("inside each node: all-to-all", c.node_sync_all_to_all);
  busy("inside each node: all-reduce", c.node_contended_all_reduce);
  busy("inside each node: all-to-all", c.node_contended_all_to_all);
  return out;
}

}  // namespace piper::comm
