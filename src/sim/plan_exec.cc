#include "piper/sim/plan_exec.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>
#include <set>
#include <unordered_map>

#include "piper/base/check.h"
#include "piper/cost/copy_cost.h"
#include "piper/sim/comm_templates.h"
#include "piper/sim/fluid.h"

namespace piper::sim {
namespace {

using compile::Instruction;
using compile::OpKind;
using compile::Program;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Per Plan template: compute durations and dense local event indices.
struct TemplateInfo {
  std::vector<std::vector<double>> duration_s;  // [stream][instr], compute and update only
  std::vector<std::vector<int>> event;          // [stream][instr], record and wait only (else -1)
  int num_events = 0;
  double mean_compute_s = 0;  // the mean duration of the template's compute instructions (SyncCost::exchange_lag)
};

Result<TemplateInfo> prepare(const Program& prog, int index, const TaskTimeFn& task_time) {
  TemplateInfo info;
  std::unordered_map<int, int> local;
  int computes = 0;
  for (size_t s = 0; s < prog.streams.size(); ++s) {
    const auto& instrs = prog.streams[s].instrs;
    info.duration_s.emplace_back(instrs.size(), 0.0);
    info.event.emplace_back(instrs.size(), -1);
    for (size_t i = 0; i < instrs.size(); ++i) {
      const Instruction& in = instrs[i];
      if (in.op == OpKind::kCompute || in.op == OpKind::kUpdate) {
        const double t = task_time(prog, in);
        if (!std::isfinite(t) || t < 0) {
          const std::string part = in.part_name().empty() ? "?" : in.part_name();
          return invalid_argument("pipeline rank " + std::to_string(index) + " stream '" + prog.streams[s].name +
                                  "' instruction " + std::to_string(i) + " (" + in.label +
                                  "): the cost model has no time for part '" + part + "'");
        }
        info.duration_s[s][i] = t;
        if (in.op == OpKind::kCompute) {
          info.mean_compute_s += t;
          ++computes;
        }
      }
      if (in.op == OpKind::kRecord || in.op == OpKind::kWait) {
        auto [it, fresh] = local.emplace(in.event, info.num_events);
        if (fresh) ++info.num_events;
        info.event[s][i] = it->second;
      }
    }
  }
  if (computes > 0) info.mean_compute_s /= computes;
  return info;
}

struct StreamState {
  size_t pc = 0;
  bool started = false;  // head instruction is running (or queued / waiting at a rendezvous)
  double start_s = 0;
  double arrived_s = 0;  // when the head collective arrived at its rendezvous (SyncCost::a2a_wait_cpu_share)
};

struct RankState {
  int rank = 0;
  int tmpl = 0;
  std::vector<StreamState> streams;
  std::vector<double> event_time;               // -1: not recorded
  std::vector<std::vector<int>> event_waiters;  // streams waiting for the event
  bool engine_busy = false;
  std::deque<int> engine_queue;
  int comm_active = 0;
  std::vector<std::pair<std::string, int>> active_groups;  // transfers in flight per group
  double last_s = 0;
  int64_t live_bytes = 0;
  RankStats stats;
  RankLoadOverrides loads;  // SimOptions::expert_loads: this rank's experts times and buffers (else empty)
};

struct P2PKey {
  int src = 0, dst = 0;
  int64_t tag = 0;
  bool operator==(const P2PKey&) const = default;
};
struct P2PKeyHash {
  size_t operator()(const P2PKey& k) const {
    return std::hash<int64_t>{}(k.tag) ^ (static_cast<size_t>(k.src) * 0x9E3779B97F4A7C15ull) ^
           (static_cast<size_t>(k.dst) << 20);
  }
};
struct Arrival {
  int rank_index = 0;
  int stream = 0;
  bool send = false;
};

struct CollKey {
  int instance = 0, tmpl = 0, stream = 0, instr = 0;
  bool operator==(const CollKey&) const = default;
};
struct CollKeyHash {
  size_t operator()(const CollKey& k) const {
    return (static_cast<size_t>(k.instance) * 1000003u) ^ (static_cast<size_t>(k.stream) << 40) ^
           (static_cast<size_t>(k.instr) << 8) ^ static_cast<size_t>(k.tmpl);
  }
};

struct Event {
  double t = 0;
  int64_t seq = 0;
  // 0: compute done (a = rank index, b = stream); 1: transfer done (a = op); 2: a core pool's next task done
  // (a = node, version = the pool's version when scheduled; a later change made it stale); 3: a delayed transfer's
  // flows start (a = op; SimOptions::sync_cost); 4: the last participant of an all-to-all completes it (a = rank
  // index, b = stream; SyncCost::exchange_lag).
  int kind = 0;
  int a = 0, b = 0;
  int64_t version = 0;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

// A compute or update instruction running on a node's shared cores: it ends when the node's work clock reaches
// work_end (ties: start order).
struct PoolTask {
  double work_end = 0;
  int64_t seq = 0;
  int rank_index = 0, stream = 0;
  int charged = 0;       // the stream whose CPU it is (RankStats::cpu_s_by_stream): `stream`, or a transfer's
  double cpu_start = 0;  // the node's `cpu` clock when it started
  bool operator>(const PoolTask& o) const { return work_end != o.work_end ? work_end > o.work_end : seq > o.seq; }
};

// One node's cores (SimOptions::core_pool). Every running task advances alike, so one clock of work done (in
// priced seconds) serves them all and only the first to end needs an event.
struct NodePool {
  double work = 0;    // priced seconds each running task has advanced since the pool began
  double last_s = 0;  // when `work` was brought up to date
  double cpu = 0;     // core-seconds each running task has held since the pool began (its CPU time)
  int busy = 0;       // ranks of the node with a task running
  int64_t version = 0;
  std::priority_queue<PoolTask, std::vector<PoolTask>, std::greater<>> running;
};

class Executor {
 public:
  Executor(const compile::Plan& plan, const Network& net, const SimOptions& options, CommTemplates templates,
           std::vector<TemplateInfo> infos)
      : plan_(plan),
        options_(options),
        templates_(std::move(templates)),
        infos_(std::move(infos)),
        fluid_(net.link_bandwidths(), !options.reference_rates, options.due_filter),
        pooled_(pool_can_slow(options.core_pool) || (options.core_pool.cores > 0 && takes_cpu(options.sync_cost))) {}

  // Communication that takes CPU from the node (SyncCost::cpu_*) needs the pool even where compute alone would not.
  static bool takes_cpu(const SyncCost& c) {
    return c.cpu_all_to_all_s > 0 || c.cpu_other_s > 0 || c.cpu_pair_s > 0 || c.cpu_p2p_s > 0 || c.cpu_per_byte_s > 0 ||
           c.staging_s_per_byte > 0 || c.a2a_wait_cpu_share > 0;
  }
  // A pool that gives every rank its priced cores even with all of its node busy changes nothing: it stays off.
  static bool pool_can_slow(const CorePool& p) {
    if (!(p.cores > 0)) return false;
    bool sharing_slows = false;
    for (int n = 2; n <= p.ranks_per_node; ++n) sharing_slows = sharing_slows || p.sharing_at(n) != 1.0;
    return p.price_cores != p.rank_cores || p.cores < p.rank_cores * p.ranks_per_node || sharing_slows;
  }

  Result<SimResult> run();

 private:
  const Program& program(const RankState& r) const { return plan_.templates[static_cast<size_t>(r.tmpl)]; }
  void account(RankState& r, double t);
  Status advance_stream(int ri, int s);
  void complete(int ri, int s, double t);
  void start_compute(int ri, int s, double t);
  void finish_compute(int ri, int s, double t);
  // The core pool (SimOptions::core_pool): priced seconds a running task advances per second with `busy` running.
  double pool_rate(int busy) const {
    const CorePool& p = options_.core_pool;
    return std::min(p.rank_cores, p.cores / busy) * p.sharing_at(busy) / p.price_cores;
  }
  void pool_advance(NodePool& p, double t) {
    if (p.busy > 0) {
      const CorePool& c = options_.core_pool;
      p.work += (t - p.last_s) * pool_rate(p.busy);
      p.cpu += (t - p.last_s) * std::min(c.rank_cores, c.cores / p.busy);
    }
    p.last_s = t;
  }
  // charged: the stream whose CPU the task is (a transfer's stream for pool_overhead's; -1: s).
  void pool_start(int ri, int s, double duration_s, double t, int charged = -1);
  void pool_overhead(int ri, int s, double cpu_s, double t);
  double copy_cpu_s(const FlowTemplate* tmpl, double payload, size_t members, cost::CopyKind kind);
  void pool_schedule(int node);
  void pool_done(int node, int64_t version, double t);
  Status arrive_p2p(int ri, int s, const Instruction& in);
  Status arrive_collective(int ri, int s, const Instruction& in);
  // kind: what the transfer does with its bytes (their CPU: SyncCost::per_byte_s).
  // cpu_s: the CPU seconds each part's rank spends on it (SyncCost::cpu_*), added to its node's pool.
  // late_s: the last part (the last to arrive) completes this much after the others (SyncCost::exchange_lag);
  // wait_share: with the pool on, each part adds that share of its wait to its node's pool at completion.
  Status start_op(std::vector<std::pair<int, int>> parts, const FlowTemplate* tmpl, double payload, cost::CopyKind kind,
                  double delay_s = 0, double cpu_s = 0, double late_s = 0, double wait_share = 0);
  // The mean length of the compute tasks of every part but the last (their templates' mean compute instruction): what
  // the ranks that leave an all-to-all first run while the last one finishes it.
  double competing_task_s(const std::vector<std::pair<int, int>>& parts) const;
  void start_flows(int op, const FlowTemplate* tmpl, double payload, double t);
  void op_done(int op, double t);
  // Rank index ri's stream s leaves a transfer at t: its communication ends there (accounting) and the stream goes on.
  void leave_op(int ri, int s, double t);
  void push(double t, int kind, int a, int b, int64_t version = 0) { events_.push({t, seq_++, kind, a, b, version}); }
  // Counts a transfer of stream s's head instruction in or out of its group's tally.
  void add_group(RankState& r, int s, int delta) {
    const Instruction& in = program(r).streams[static_cast<size_t>(s)].instrs[r.streams[static_cast<size_t>(s)].pc];
    const std::string& group = in.group.empty() ? std::string("pp") : in.group;
    for (auto& [g, n] : r.active_groups) {
      if (g == group) {
        n += delta;
        return;
      }
    }
    r.active_groups.emplace_back(group, delta);
  }
  // An alloc's or free's change of live bytes: an experts buffer's on this rank under SimOptions::expert_loads.
  static int64_t buffer_delta(const RankState& r, const Instruction& in) {
    if (r.loads.buffer_bytes.empty()) return in.mem_delta;
    auto it = r.loads.buffer_bytes.find(in.buffer);
    if (it == r.loads.buffer_bytes.end()) return in.mem_delta;
    return in.op == OpKind::kAlloc ? it->second : -it->second;
  }
  void sample_memory(RankState& r) {
    if (options_.record_timeline) r.stats.memory.push_back({now_, r.live_bytes});
  }

  const compile::Plan& plan_;
  const SimOptions& options_;
  CommTemplates templates_;
  std::vector<TemplateInfo> infos_;
  FluidNet fluid_;
  std::vector<RankState> ranks_;
  std::vector<int> index_of_rank_;  // global rank -> index into ranks_ (-1: not simulated)
  std::vector<std::pair<int, int>> work_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  int64_t seq_ = 0;
  double now_ = 0;
  std::unordered_map<P2PKey, std::deque<Arrival>, P2PKeyHash> p2p_;
  std::unordered_map<CollKey, std::vector<std::pair<int, int>>, CollKeyHash> colls_;
  std::vector<std::vector<std::pair<int, int>>> ops_;  // participants (rank index, stream) per transfer
  std::vector<std::pair<const FlowTemplate*, double>> delayed_;  // per op: template and payload (event kind 3)
  std::vector<double> late_s_;  // per op: how much later its last participant completes (SyncCost::exchange_lag)
  std::vector<double> wait_share_;  // per op: the CPU share of each participant's wait (SyncCost::a2a_wait_cpu_share)
  std::vector<int> free_ops_;
  int64_t instructions_ = 0;
  bool pooled_ = false;
  std::vector<NodePool> pools_;  // per node, when pooled_
  std::unordered_map<const FlowTemplate*, double> template_bytes_;  // bytes per unit payload, summed over flows
};

namespace {

// Adds `seconds` to `group`'s entry of a rank's exposed communication by group (RankStats::exposed_by_group_s), which
// lists the groups in the order they first occur.
void add_group_seconds(const std::string& group, double seconds, std::vector<std::pair<std::string, double>>* by) {
  auto it = std::find_if(by->begin(), by->end(), [&](const auto& e) { return e.first == group; });
  if (it == by->end()) {
    by->emplace_back(group, seconds);
  } else {
    it->second += seconds;
  }
}

}  // namespace

void Executor::account(RankState& r, double t) {
  const double dt = t - r.last_s;
  if (dt <= 0) return;
  if (r.engine_busy) {
    r.stats.busy_s += dt;
  } else if (r.comm_active > 0) {
    r.stats.exposed_comm_s += dt;
    for (const auto& [group, n] : r.active_groups) {
      if (n > 0) add_group_seconds(group, dt, &r.stats.exposed_by_group_s);
    }
  } else {
    r.stats.bubble_s += dt;
  }
  if (r.comm_active > 0) r.stats.comm_s += dt;
  r.last_s = t;
}

void Executor::complete(int ri, int s, double t) {
  RankState& r = ranks_[static_cast<size_t>(ri)];
  StreamState& ss = r.streams[static_cast<size_t>(s)];
  if (options_.record_timeline) {
    r.stats.spans.push_back({s, static_cast<int>(ss.pc), ss.start_s, t});
  }
  ++ss.pc;
  ss.started = false;
  ++instructions_;
  r.stats.finish_s = std::max(r.stats.finish_s, t);
  work_.emplace_back(ri, s);
}

void Executor::start_compute(int ri, int s, double t) {
  RankState& r = ranks_[static_cast<size_t>(ri)];
  account(r, t);
  r.engine_busy = true;
  StreamState& ss = r.streams[static_cast<size_t>(s)];
  ss.start_s = t;
  const auto& durations =
      r.loads.duration_s.empty() ? infos_[static_cast<size_t>(r.tmpl)].duration_s : r.loads.duration_s;
  const double d = durations[static_cast<size_t>(s)][ss.pc];
  if (pooled_) {
    pool_start(ri, s, d, t);
  } else {
    if (!r.stats.cpu_s_by_stream.empty())
      r.stats.cpu_s_by_stream[static_cast<size_t>(s)] += d * options_.core_pool.rank_cores;
    push(t + d, 0, ri, s);
  }
}

// The engine of rank `ri` finished stream s's head instruction: the next queued one starts.
void Executor::finish_compute(int ri, int s, double t) {
  RankState& r = ranks_[static_cast<size_t>(ri)];
  account(r, t);
  r.engine_busy = false;
  complete(ri, s, t);
  if (!r.engine_queue.empty()) {
    const int next = r.engine_queue.front();
    r.engine_queue.pop_front();
    start_compute(ri, next, t);
  }
}

void Executor::pool_start(int ri, int s, double duration_s, double t, int charged) {
  const int node = ranks_[static_cast<size_t>(ri)].rank / options_.core_pool.ranks_per_node;
  NodePool& p = pools_[static_cast<size_t>(node)];
  if (p.busy == 0) {
    // An idle node's clock starts again from 0: a task then ends at exactly t + duration / rate (with every rank
    // busy, its price), not after the rounding of a long-running sum.
    p.work = p.cpu = 0;
    p.last_s = t;
  } else {
    pool_advance(p, t);
  }
  p.running.push({p.work + duration_s, seq_++, ri, s, charged < 0 ? s : charged, p.cpu});
  ++p.busy;
  pool_schedule(node);
}

// `cpu_s` seconds of one core's work that stream s of rank ri takes from its node for a transfer (SyncCost::cpu_*): a
// pool task of no stream (its end completes nothing), priced so that it is cpu_s of one core's time.
void Executor::pool_overhead(int ri, int s, double cpu_s, double t) {
  const CorePool& c = options_.core_pool;
  pool_start(ri, -1, cpu_s * std::min(c.rank_cores, 1.0) / c.price_cores, t, s);
}

// Each member's share of the CPU that copying a transfer's bytes takes (SyncCost::per_byte_s of its kind): the bytes
// of all its flows at `payload`, over its members.
double Executor::copy_cpu_s(const FlowTemplate* tmpl, double payload, size_t members, cost::CopyKind kind) {
  const double per_byte = options_.sync_cost.per_byte_s(kind);
  if (tmpl == nullptr || !(per_byte > 0) || members == 0) return 0;
  auto [it, fresh] = template_bytes_.try_emplace(tmpl, 0.0);
  if (fresh) {
    for (const FlowTemplate::Flow& f : tmpl->flows) it->second += f.bytes;
  }
  return per_byte * it->second * payload / static_cast<double>(members);
}

// One event for the node's first task to end at the current rate; any earlier one is stale from now on.
void Executor::pool_schedule(int node) {
  NodePool& p = pools_[static_cast<size_t>(node)];
  ++p.version;
  if (p.running.empty()) return;
  const double left = std::max(0.0, p.running.top().work_end - p.work);
  push(p.last_s + left / pool_rate(p.busy), 2, node, 0, p.version);
}

void Executor::pool_done(int node, int64_t version, double t) {
  NodePool& p = pools_[static_cast<size_t>(node)];
  if (version != p.version) return;
  pool_advance(p, t);
  // The first task is due now, whatever the rounding of `work`; tasks that end at the same work end with it.
  p.work = std::max(p.work, p.running.top().work_end);
  std::vector<PoolTask> ended;
  while (!p.running.empty() && p.running.top().work_end <= p.work) {
    ended.push_back(p.running.top());
    p.running.pop();
    --p.busy;
  }
  for (const PoolTask& task : ended) {
    RankStats& stats = ranks_[static_cast<size_t>(task.rank_index)].stats;
    stats.cpu_s_by_stream[static_cast<size_t>(task.charged)] += p.cpu - task.cpu_start;
    if (task.stream >= 0) finish_compute(task.rank_index, task.stream, t);  // else communication's CPU (pool_overhead)
  }
  pool_schedule(node);
}

Status Executor::start_op(std::vector<std::pair<int, int>> parts, const FlowTemplate* tmpl, double payload,
                          cost::CopyKind kind, double delay_s, double cpu_s, double late_s, double wait_share) {
  int op;
  if (!free_ops_.empty()) {
    op = free_ops_.back();
    free_ops_.pop_back();
    ops_[static_cast<size_t>(op)] = std::move(parts);
  } else {
    op = static_cast<int>(ops_.size());
    ops_.push_back(std::move(parts));
    late_s_.push_back(0);
    wait_share_.push_back(0);
  }
  late_s_[static_cast<size_t>(op)] = options_.zero_comm ? 0 : late_s;
  wait_share_[static_cast<size_t>(op)] = options_.zero_comm || !pooled_ ? 0 : wait_share;
  if (pooled_) cpu_s += copy_cpu_s(tmpl, payload, ops_[static_cast<size_t>(op)].size(), kind);
  for (auto [ri, s] : ops_[static_cast<size_t>(op)]) {
    RankState& r = ranks_[static_cast<size_t>(ri)];
    if (pooled_ && cpu_s > 0 && !options_.zero_comm) pool_overhead(ri, s, cpu_s, now_);
    account(r, now_);
    ++r.comm_active;
    add_group(r, s, +1);
    r.streams[static_cast<size_t>(s)].start_s = now_;
  }
  if (delay_s > 0 && !options_.zero_comm) {
    if (delayed_.size() <= static_cast<size_t>(op)) delayed_.resize(static_cast<size_t>(op) + 1);
    delayed_[static_cast<size_t>(op)] = {tmpl, payload};
    push(now_ + delay_s, 3, op, 0);
    return ok_status();
  }
  start_flows(op, tmpl, payload, now_);
  return ok_status();
}

double Executor::competing_task_s(const std::vector<std::pair<int, int>>& parts) const {
  double sum = 0;
  for (size_t k = 0; k + 1 < parts.size(); ++k) {
    sum += infos_[static_cast<size_t>(ranks_[static_cast<size_t>(parts[k].first)].tmpl)].mean_compute_s;
  }
  return parts.size() > 1 ? sum / static_cast<double>(parts.size() - 1) : 0.0;
}

void Executor::start_flows(int op, const FlowTemplate* tmpl, double payload, double t) {
  if (options_.zero_comm || tmpl == nullptr || payload <= 0) {
    push(t, 1, op, 0);
  } else {
    fluid_.start(tmpl, payload, t, op);
  }
}

void Executor::leave_op(int ri, int s, double t) {
  RankState& r = ranks_[static_cast<size_t>(ri)];
  account(r, t);
  --r.comm_active;
  add_group(r, s, -1);
  complete(ri, s, t);
}

void Executor::op_done(int op, double t) {
  const std::vector<std::pair<int, int>>& parts = ops_[static_cast<size_t>(op)];
  for (size_t k = 0; k < parts.size(); ++k) {
    const auto [ri, s] = parts[k];
    const double late_s = k + 1 == parts.size() ? late_s_[static_cast<size_t>(op)] : 0.0;
    const double wait_cpu_s = wait_share_[static_cast<size_t>(op)] *
                              (t + late_s - ranks_[static_cast<size_t>(ri)].streams[static_cast<size_t>(s)].arrived_s);
    if (wait_cpu_s > 0) pool_overhead(ri, s, wait_cpu_s, t);
    if (late_s > 0) {
      push(t + late_s, 4, ri, s);  // the last to arrive: its exchange finishes after the others' (arrival order)
    } else {
      leave_op(ri, s, t);
    }
  }
  ops_[static_cast<size_t>(op)].clear();
  free_ops_.push_back(op);
}

Status Executor::arrive_p2p(int ri, int s, const Instruction& in) {
  const RankState& r = ranks_[static_cast<size_t>(ri)];
  const compile::RankCoord& c = plan_.coords[static_cast<size_t>(r.rank)];
  if (in.peer < 0 || in.peer >= plan_.mesh.pp) {
    return invalid_argument("rank " + std::to_string(r.rank) + " instruction '" + in.label +
                            "' names peer pipeline rank " + std::to_string(in.peer) + " outside 0.." +
                            std::to_string(plan_.mesh.pp - 1));
  }
  // Same (dp, tp) coordinates on the peer's pipeline rank.
  const int slice = plan_.mesh.dp * plan_.mesh.tp;
  const int peer = in.peer * slice + (r.rank - c.pp * slice);
  const bool send = in.op == OpKind::kSend;
  P2PKey key{send ? r.rank : peer, send ? peer : r.rank, in.tag};
  auto& q = p2p_[key];
  if (!q.empty() && q.front().send != send) {
    Arrival other = q.front();
    q.pop_front();
    if (q.empty()) p2p_.erase(key);
    const FlowTemplate* tmpl = nullptr;
    if (!options_.zero_comm) {
      // af-pipe: an m2n to or from the experts spreads the sender's rows over the ep ranks of its block; other m2n
      // are point-to-point.
      const bool routed = in.role == compile::CommRole::kM2NToExperts || in.role == compile::CommRole::kM2NFromExperts;
      if (routed) {
        PIPER_ASSIGN_OR_RETURN(tmpl, templates_.m2n(key.src, plan_.coords[static_cast<size_t>(key.dst)].pp));
      } else {
        PIPER_ASSIGN_OR_RETURN(tmpl, templates_.p2p(key.src, key.dst));
      }
    }
    // Both sides carry the payload (the lowering copies it from the send to the recv).
    return start_op({{ri, s}, {other.rank_index, other.stream}}, tmpl, static_cast<double>(in.comm_bytes),
                    cost::CopyKind::kExchanged, 0, options_.sync_cost.cpu_p2p_s);
  }
  if (index_of_rank_[static_cast<size_t>(peer)] < 0) {
    return internal_error("rank " + std::to_string(r.rank) + " talks to rank " + std::to_string(peer) +
                          ", which is not simulated");
  }
  q.push_back({ri, s, send});
  return ok_status();
}

namespace {

// What a collective does with its bytes: all-reduces and reduce-scatters sum them, all-gathers gather them, all-to-alls
// and m2n transfers exchange them.
cost::CopyKind copy_kind(ir::NodeKind comm) {
  switch (comm) {
    case ir::NodeKind::kAllReduce:
    case ir::NodeKind::kReduceScatter:
      return cost::CopyKind::kSummed;
    case ir::NodeKind::kAllGather:
      return cost::CopyKind::kGathered;
    default:
      return cost::CopyKind::kExchanged;
  }
}

// One member's seconds of one core for the copies the runtime stages a data-parallel collective with
// (cost::dp_staged_bytes); 0 for any other collective.
double staging_cpu_s(const Instruction& in, size_t members, double per_byte) {
  if (!(per_byte > 0)) return 0;
  cost::DpStaging kind;
  if (in.role == compile::CommRole::kGradReduce) {
    kind = in.comm == ir::NodeKind::kAllReduce ? cost::DpStaging::kAllReduce
           : in.mb >= 0                        ? cost::DpStaging::kAccumulatingReduceScatter
                                               : cost::DpStaging::kReduceScatter;
  } else if (in.role == compile::CommRole::kParamGather) {
    kind = in.pass == ir::Pass::kU ? cost::DpStaging::kGatherAfterUpdate : cost::DpStaging::kGatherForCompute;
  } else {
    return 0;
  }
  return per_byte * cost::dp_staged_bytes(kind, static_cast<double>(in.comm_bytes), static_cast<int>(members));
}

// Whether the global ranks `members` all lie on one node of `ranks_per_node` consecutive ranks (false when 0).
bool within_one_node(const std::vector<int>& members, int ranks_per_node) {
  if (ranks_per_node < 1 || members.empty()) return false;
  const int node = members.front() / ranks_per_node;
  return std::all_of(members.begin(), members.end(), [&](int m) { return m / ranks_per_node == node; });
}

}  // namespace

Status Executor::arrive_collective(int ri, int s, const Instruction& in) {
  const RankState& r = ranks_[static_cast<size_t>(ri)];
  PIPER_ASSIGN_OR_RETURN(std::vector<int> members, templates_.group(r.rank, in.group));
  int expected = 0;
  for (int m : members) expected += index_of_rank_[static_cast<size_t>(m)] >= 0 ? 1 : 0;
  CollKey key{members.front(), r.tmpl, s, static_cast<int>(r.streams[static_cast<size_t>(s)].pc)};
  auto& arrived = colls_[key];
  arrived.emplace_back(ri, s);
  if (static_cast<int>(arrived.size()) < expected) return ok_status();
  std::vector<std::pair<int, int>> parts = std::move(arrived);
  colls_.erase(key);
  const FlowTemplate* tmpl = nullptr;
  if (!options_.zero_comm && members.size() > 1) {
    std::string algorithm = in.algorithm;
    if (in.comm == ir::NodeKind::kAllToAll && algorithm == "halo") {
      auto halo_key = halo_template_key(options_.halo, in);
      if (!halo_key.ok()) return halo_key.status().with_context("rank " + std::to_string(r.rank));
      algorithm = *halo_key;
    }
    auto t = templates_.collective(r.rank, in.comm, in.group, algorithm);
    if (!t.ok()) return t.status().with_context("rank " + std::to_string(r.rank) + " instruction '" + in.label + "'");
    tmpl = *t;
  }
  const SyncCost& sync = options_.sync_cost;
  const bool a2a = in.comm == ir::NodeKind::kAllToAll;
  double delay_s = a2a ? sync.all_to_all_s : sync.other_s;
  double cpu_s = a2a ? sync.cpu_all_to_all_s : sync.cpu_other_s;
  const bool inside = sync.node_figures && within_one_node(members, sync.ranks_per_node);
  if (inside) {
    delay_s = a2a ? sync.node_all_to_all_s : sync.node_other_s;
    cpu_s = a2a ? sync.cpu_node_all_to_all_s : sync.cpu_node_other_s;
  }
  const bool pair = members.size() == 2 && (!sync.node_figures || inside);
  if (pair && sync.pair_s > 0) delay_s = sync.pair_s;
  if (pair && sync.cpu_pair_s > 0) cpu_s = sync.cpu_pair_s;
  cpu_s += staging_cpu_s(in, members.size(), sync.staging_s_per_byte);
  if (members.size() < 2) delay_s = cpu_s = 0;
  const double late_s = a2a && parts.size() > 1 ? sync.exchange_lag_at(competing_task_s(parts)) : 0.0;
  const double share = a2a && members.size() > 1 ? sync.a2a_wait_cpu_share : 0.0;
  return start_op(std::move(parts), tmpl, static_cast<double>(in.comm_bytes), copy_kind(in.comm), delay_s, cpu_s,
                  late_s, share);
}

Status Executor::advance_stream(int ri, int s) {
  RankState& r = ranks_[static_cast<size_t>(ri)];
  const Program& prog = program(r);
  const auto& instrs = prog.streams[static_cast<size_t>(s)].instrs;
  StreamState& ss = r.streams[static_cast<size_t>(s)];
  const TemplateInfo& info = infos_[static_cast<size_t>(r.tmpl)];
  while (ss.pc < instrs.size() && !ss.started) {
    const Instruction& in = instrs[ss.pc];
    switch (in.op) {
      case OpKind::kRecord: {
        const int e = info.event[static_cast<size_t>(s)][ss.pc];
        r.event_time[static_cast<size_t>(e)] = now_;
        for (int w : r.event_waiters[static_cast<size_t>(e)]) work_.emplace_back(ri, w);
        r.event_waiters[static_cast<size_t>(e)].clear();
        ss.start_s = now_;
        complete(ri, s, now_);
        break;
      }
      case OpKind::kWait: {
        const int e = info.event[static_cast<size_t>(s)][ss.pc];
        if (r.event_time[static_cast<size_t>(e)] < 0) {
          r.event_waiters[static_cast<size_t>(e)].push_back(s);
          return ok_status();
        }
        ss.start_s = now_;
        complete(ri, s, now_);
        break;
      }
      case OpKind::kAlloc:
      case OpKind::kFree:
        r.live_bytes += buffer_delta(r, in);
        r.stats.peak_bytes = std::max(r.stats.peak_bytes, r.live_bytes);
        sample_memory(r);
        ss.start_s = now_;
        complete(ri, s, now_);
        break;
      case OpKind::kCompute:
      case OpKind::kUpdate:
        ss.started = true;
        if (!r.engine_busy) {
          start_compute(ri, s, now_);
        } else {
          r.engine_queue.push_back(s);
        }
        return ok_status();
      case OpKind::kSend:
      case OpKind::kRecv:
        ss.started = true;
        return arrive_p2p(ri, s, in);
      case OpKind::kCollective:
        ss.started = true;
        ss.arrived_s = now_;
        return arrive_collective(ri, s, in);
    }
  }
  return ok_status();
}

Result<SimResult> Executor::run() {
  const int slice = plan_.mesh.dp * plan_.mesh.tp;
  index_of_rank_.assign(static_cast<size_t>(plan_.world_size), -1);
  for (int rank = 0; rank < plan_.world_size; ++rank) {
    if (!options_.full && rank % slice != 0) continue;  // representative: dp = tp = 0
    RankState r;
    r.rank = rank;
    r.tmpl = plan_.rank_template[static_cast<size_t>(rank)];
    const Program& prog = plan_.templates[static_cast<size_t>(r.tmpl)];
    r.streams.resize(prog.streams.size());
    const int ne = infos_[static_cast<size_t>(r.tmpl)].num_events;
    r.event_time.assign(static_cast<size_t>(ne), -1.0);
    r.event_waiters.resize(static_cast<size_t>(ne));
    r.live_bytes = prog.static_bytes;
    r.stats.rank = rank;
    r.stats.pp_rank = prog.pp_rank;
    r.stats.static_bytes = prog.static_bytes;
    r.stats.peak_bytes = prog.static_bytes;
    if (options_.core_pool.cores > 0) r.stats.cpu_s_by_stream.assign(prog.streams.size(), 0.0);
    if (options_.expert_loads.on()) {
      PIPER_ASSIGN_OR_RETURN(r.loads,
                             rank_load_overrides(prog, infos_[static_cast<size_t>(r.tmpl)].duration_s,
                                                 plan_.coords[static_cast<size_t>(rank)].ep, options_.expert_loads));
    }
    sample_memory(r);
    index_of_rank_[static_cast<size_t>(rank)] = static_cast<int>(ranks_.size());
    ranks_.push_back(std::move(r));
  }
  if (pooled_) {
    const int per_node = options_.core_pool.ranks_per_node;
    pools_.resize(static_cast<size_t>((plan_.world_size + per_node - 1) / per_node));
  }
  for (size_t ri = 0; ri < ranks_.size(); ++ri) {
    for (size_t s = 0; s < ranks_[ri].streams.size(); ++s)
      work_.emplace_back(static_cast<int>(ri), static_cast<int>(s));
  }
  std::vector<int64_t> done;
  const bool has_deadline = options_.deadline != std::chrono::steady_clock::time_point::max();
  int64_t loop_events = 0;
  while (true) {
    // The clock is read every 1,024 event-loop rounds (a round is a few microseconds), so a deadline is honoured
    // within milliseconds at a negligible cost.
    if (has_deadline && (++loop_events & 1023) == 0 && std::chrono::steady_clock::now() >= options_.deadline) {
      return deadline_exceeded(
          "not simulated: budget: the simulation passed its wall-clock deadline after " + std::to_string(loop_events) +
          " event-loop rounds (" + std::to_string(instructions_) + " instructions, " +
          std::to_string(fluid_.flows_started()) + " flows, " + std::to_string(fluid_.rate_updates()) +
          " rate updates) at simulated t=" + std::to_string(now_) + " s; give it more time (plan --sim-budget-s)");
    }
    while (!work_.empty()) {
      auto [ri, s] = work_.back();
      work_.pop_back();
      PIPER_RETURN_IF_ERROR(advance_stream(ri, s));
    }
    const double t_event = events_.empty() ? kInf : events_.top().t;
    const double t_net = fluid_.next_time();
    const double t = std::max(now_, std::min(t_event, t_net));
    if (t == kInf) break;
    now_ = t;
    if (t_net <= t) {
      done.clear();
      fluid_.advance(t, &done);
      for (int64_t op : done) op_done(static_cast<int>(op), t);
    }
    while (!events_.empty() && events_.top().t <= t) {
      Event e = events_.top();
      events_.pop();
      if (e.kind == 1) {
        op_done(e.a, t);
      } else if (e.kind == 2) {
        pool_done(e.a, e.version, t);
      } else if (e.kind == 3) {
        const auto [tmpl, payload] = delayed_[static_cast<size_t>(e.a)];
        start_flows(e.a, tmpl, payload, t);
      } else if (e.kind == 4) {
        leave_op(e.a, e.b, t);
      } else {
        finish_compute(e.a, e.b, t);
      }
    }
  }
  // Anything left is blocked for good.
  std::string blocked;
  int count = 0;
  for (const RankState& r : ranks_) {
    const Program& prog = program(r);
    for (size_t s = 0; s < r.streams.size(); ++s) {
      const size_t pc = r.streams[s].pc;
      if (pc >= prog.streams[s].instrs.size()) continue;
      if (count++ < 8) {
        blocked += "\n  rank " + std::to_string(r.rank) + " stream '" + prog.streams[s].name + "' at instruction " +
                   std::to_string(pc) + " (" + prog.streams[s].instrs[pc].label + ")";
      }
    }
  }
  if (count > 0) {
    return failed_precondition("simulation deadlocked at t=" + std::to_string(now_) + " s with " +
                               std::to_string(count) +
                               " blocked streams (first ones below); the plan's order, events or send/recv pairs do "
                               "not match" +
                               blocked);
  }
  SimResult out;
  out.reduced = !options_.full;
  for (RankState& r : ranks_) out.step_time_s = std::max(out.step_time_s, r.stats.finish_s);
  for (RankState& r : ranks_) {
    account(r, out.step_time_s);
    out.ranks.push_back(std::move(r.stats));
  }
  out.instructions = instructions_;
  out.flows = fluid_.flows_started();
  out.rate_updates = fluid_.rate_updates();
  out.full_rate_updates = fluid_.full_rate_updates();
  out.comm_templates = templates_.num_templates();
  return out;
}

// SimOptions::core_pool: off, or every field in range with every rank simulated.
Status check_core_pool(const SimOptions& o) {
  const CorePool& p = o.core_pool;
  if (!(p.cores >= 0 && std::isfinite(p.cores))) {
    return invalid_argument("simulate_plan: core_pool.cores = " + std::to_string(p.cores) + " must be >= 0 (0: off)");
  }
  if (p.cores == 0) return ok_status();
  if (!o.full) {
    return invalid_argument(
        "simulate_plan: a core pool shares a node's cores among the ranks computing at each moment, so it needs "
        "every rank simulated; set SimOptions::full (representative ranks price each rank at the static share: "
        "leave core_pool off)");
  }
  for (double e : p.sharing) {
    if (!(e > 0 && std::isfinite(e))) {
      return invalid_argument("simulate_plan: core_pool.sharing holds " + std::to_string(e) +
                              "; every entry must be a finite efficiency > 0 (1: no loss)");
    }
  }
  if (!(p.rank_cores > 0 && p.rank_cores <= p.cores) || !(p.price_cores > 0 && std::isfinite(p.price_cores)) ||
      p.ranks_per_node < 1) {
    return invalid_argument("simulate_plan: core_pool needs 0 < rank_cores (" + std::to_string(p.rank_cores) +
                            ") <= cores (" + std::to_string(p.cores) + "), price_cores > 0 (" +
                            std::to_string(p.price_cores) + ") and ranks_per_node >= 1 (" +
                            std::to_string(p.ranks_per_node) + ")");
  }
  return ok_status();
}

// SimOptions::expert_loads: off, or for this plan's ep with every rank simulated and a price for the experts.
Status check_expert_loads(const SimOptions& o, const compile::Plan& plan) {
  const ExpertRankLoads& l = o.expert_loads;
  if (!l.on()) return ok_status();
  if (!o.full) {
    return invalid_argument(
        "simulate_plan: expert loads per ep rank need every rank simulated; set SimOptions::full (representative "
        "ranks price the busiest rank: Calibration::expert_load_imbalance)");
  }
  if (l.loads.ep != std::max(1, plan.mesh.ep)) {
    return invalid_argument("simulate_plan: expert loads for ep=" + std::to_string(l.loads.ep) +
                            ", the plan has ep=" + std::to_string(plan.mesh.ep) + "; compute them for the plan's ep");
  }
  for (size_t s = 0; s < l.loads.step_factor.size(); ++s) {
    const auto& step = l.loads.step_factor[s];
    bool shaped = step.size() == l.loads.layers.size();
    for (const auto& ranks : step) shaped = shaped && static_cast<int>(ranks.size()) == l.loads.ep;
    if (!shaped) {
      return invalid_argument("simulate_plan: expert loads of step " + std::to_string(s) +
                              " are not one factor per ep " + "rank (" + std::to_string(l.loads.ep) +
                              ") for each of the " + std::to_string(l.loads.layers.size()) + " MoE layers");
    }
  }
  if (!(l.plan_load > 0) || !l.expert_time) {
    return invalid_argument("simulate_plan: expert loads need plan_load > 0 and an expert_time price");
  }
  return ok_status();
}

// `sum`'s times (of a simulation of the same plan and ranks) scaled by `keep`, plus `one`'s scaled by w.
void blend_times(const SimResult& one, double keep, double w, SimResult* sum) {
  sum->step_time_s = keep * sum->step_time_s + w * one.step_time_s;
  for (size_t i = 0; i < sum->ranks.size() && i < one.ranks.size(); ++i) {
    RankStats& to = sum->ranks[i];
    const RankStats& from = one.ranks[i];
    for (double RankStats::*f : {&RankStats::finish_s, &RankStats::busy_s, &RankStats::exposed_comm_s,
                                 &RankStats::bubble_s, &RankStats::comm_s}) {
      to.*f = keep * (to.*f) + w * (from.*f);
    }
    for (auto& g : to.exposed_by_group_s) g.second *= keep;
    for (const auto& [group, sec] : from.exposed_by_group_s) add_group_seconds(group, w * sec, &to.exposed_by_group_s);
    for (size_t k = 0; k < to.cpu_s_by_stream.size() && k < from.cpu_s_by_stream.size(); ++k) {
      to.cpu_s_by_stream[k] = keep * to.cpu_s_by_stream[k] + w * from.cpu_s_by_stream[k];
    }
  }
}

// `base` (the run's mean loads) with its times replaced by the mean of `steps`' (SimResult::load_step_times_s); its
// ranks, names and memory kept.
SimResult mean_of_steps(SimResult base, const std::vector<SimResult>& steps) {
  for (size_t k = 0; k < steps.size(); ++k) {
    blend_times(steps[k], k == 0 ? 0.0 : 1.0, 1.0 / static_cast<double>(steps.size()), &base);
    base.load_step_times_s.push_back(steps[k].step_time_s);
  }
  return base;
}

Result<SimResult> simulate_once(const compile::Plan& plan, const Network& net, const TaskTimeFn& task_time,
                                const SimOptions& options) {
  PIPER_ASSIGN_OR_RETURN(CommTemplates templates, CommTemplates::create(net, plan, !options.full));
  templates.set_reuse_slices(options.reuse_slice_templates);
  templates.set_halo_model(options.halo);
  std::vector<TemplateInfo> infos;
  for (size_t t = 0; t < plan.templates.size(); ++t) {
    PIPER_ASSIGN_OR_RETURN(TemplateInfo info, prepare(plan.templates[t], static_cast<int>(t), task_time));
    infos.push_back(std::move(info));
  }
  Executor ex(plan, net, options, std::move(templates), std::move(infos));
  return ex.run();
}

}  // namespace

Result<SimResult> simulate_plan(const compile::Plan& plan, const Network& net, const TaskTimeFn& task_time,
                                const SimOptions& options) {
  if (plan.templates.empty() || plan.world_size < 1) return invalid_argument("simulate_plan: the plan has no ranks");
  if (plan.world_size % std::max(1, plan.mesh.dp * plan.mesh.tp) != 0 ||
      plan.world_size != plan.mesh.pp * plan.mesh.dp * plan.mesh.tp) {
    return invalid_argument("simulate_plan: world_size " + std::to_string(plan.world_size) +
                            " is not pp*dp*tp = " + std::to_string(plan.mesh.pp * plan.mesh.dp * plan.mesh.tp));
  }
  PIPER_RETURN_IF_ERROR(check_core_pool(options));
  PIPER_RETURN_IF_ERROR(check_expert_loads(options, plan));
  PIPER_ASSIGN_OR_RETURN(SimResult base, simulate_once(plan, net, task_time, options));
  const std::vector<size_t> steps = load_steps(options.expert_loads);
  if (steps.empty()) return base;
  std::vector<SimResult> each;
  for (size_t s : steps) {
    SimOptions one = options;
    one.record_timeline = false;
    one.expert_loads.loads = options.expert_loads.loads.at_step(s);
    PIPER_ASSIGN_OR_RETURN(SimResult r, simulate_once(plan, net, task_time, one));
    each.push_back(std::move(r));
  }
  return mean_of_steps(std::move(base), each);
}

double SyncCost::exchange_lag_at(double task_s) const {
  if (exchange_lag.empty()) return 0;
  if (task_s <= exchange_lag.front().first) return exchange_lag.front().second;
  for (size_t i = 1; i < exchange_lag.size(); ++i) {
    const auto [t1, lag1] = exchange_lag[i];
    if (task_s > t1) continue;
    const auto [t0, lag0] = exchange_lag[i - 1];
    return t1 > t0 ? lag0 + (lag1 - lag0) * (task_s - t0) / (t1 - t0) : lag1;
  }
  return exchange_lag.back().second;
}

}  // namespace piper::sim
