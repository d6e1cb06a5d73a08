// Internal to the executor (executor.cc: program setup, compute, events, memory, updates; executor_comm.cc:
// send/recv and collectives of multi-rank programs, gradient norm and loss across ranks). Not a public header.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "piper/runtime/dist_context.h"
#include "piper/runtime/executor.h"

namespace piper::runtime::detail {

// A tensor-parallel collective over hidden states (the shard pass's tp_ag / tp_rs / tp_ar nodes).
bool is_tp_exchange(const ir::Node& n);

using StashKey = std::tuple<int, std::string, int>;  // (layer, part, mb)

std::string key_name(const StashKey& k);

// One instruction with everything resolved at create().
struct Task {
  const compile::Instruction* in = nullptr;
  Chunk* chunk = nullptr;
  ir::Pass pass = ir::Pass::kNone;
  int mb = -1;
  StashKey key;
  std::vector<ir::NodeId> sources;  // F: producers' F nodes; B/BW: consumers' B/BW nodes (edge order)
  int consumers = 0;                // tasks that read this task's message
  bool recomputed = false;          // F of a chunk whose stash is dropped and rebuilt before its backward
  bool rerun = false;               // the rebuilding F (the second compute of the same node)
  int grad_index = -1;              // W/BW: how many weight-gradient tasks of the chunk come before it
  // send/recv: the world rank on the other side, the message kind; send: the producing task's node.
  int peer = -1;
  bool gradient = false;
  ir::NodeId source = ir::kNoNode;
  // collectives: the group's communicator and degree.
  comm::Communicator* comm = nullptr;
  int degree = 1;
};

struct EpState;  // executor_ep.cc

template <typename Msg>
struct Pending {
  Msg msg;
  int remaining = 0;
};

}  // namespace piper::runtime::detail

namespace piper::runtime {

struct Executor::Impl {
  using Task = detail::Task;
  using StashKey = detail::StashKey;

  const ir::Graph* graph = nullptr;
  Model* model = nullptr;
  Optimizer* optimizer = nullptr;
  Allocator* allocator = nullptr;
  DistContext* dist = nullptr;  // null on one rank
  TraceRecorder* trace = nullptr;  // null: no timeline recorded
  std::vector<std::vector<Task>> streams;
  std::map<int, StashKey> buffer_owner;
  std::map<Chunk*, int> updates_expected;
  std::map<const Chunk*, bool> norm_owner;  // multi-rank: this rank counts the chunk in the global norm
  int64_t grad_tasks_total = 0;
  int64_t reductions_total = 0;
  std::set<const Chunk*> reduced;  // chunks with a gradient reduction
  // ZeRO-1: chunks whose gradients are reduce-scattered; this rank owns flat elements [begin, end).
  struct Shard {
    int64_t begin = 0, end = 0, per_rank = 0;
    bool per_microbatch = false;  // ZeRO-2: one reduce-scatter per microbatch
    int count = 0;                // reduce-scatters of the chunk per step
  };
  std::map<const Chunk*, Shard> shards;  // gradient all-reduce / reduce-scatter instructions of the step
  int num_events = 0;
  int num_mb = 1;
  int64_t planned_peak = 0;

  // Per-step state, guarded by mu.
  std::mutex mu;
  std::mutex norm_mu;  // serialises the multi-rank norm exchange
  std::condition_variable cv;
  std::atomic<bool> stop{false};  // mirrors `failed` for threads polling communication
  std::map<ir::NodeId, detail::Pending<Activation>> fwd;
  std::map<ir::NodeId, detail::Pending<Gradient>> bwd;
  std::map<StashKey, std::unique_ptr<Stash>> stashes;
  std::map<StashKey, std::vector<Activation>> recompute_inputs;  // inputs kept for the re-run of a dropped F
  std::vector<char> events;
  std::map<Chunk*, int> updates_done;
  int64_t grad_tasks_done = 0;
  int64_t reductions_done = 0;
  std::map<const Chunk*, int> packs_done;  // ZeRO-2: microbatch gradients taken out of the full buffer
  std::map<const Chunk*, int> shard_reductions;
  std::map<const Chunk*, std::vector<float>> shard_acc;  // ZeRO-2: this rank's accumulated gradient shard
  bool norm_done = false;
  double grad_norm = 0;
  bool failed = false;
  Status error;
  std::vector<double> loss_mb, aux_mb;
  std::map<std::string, double> task_seconds;
  int64_t planned_live = 0;
  // Buffers of communication abandoned in flight after a failure: kept until the executor dies.
  std::vector<std::shared_ptr<const void>> abandoned;
  // The batch of the running step.
  const Batch* batch = nullptr;
  int64_t mbs = 0;

  Status execute(const Task& t);
  Status compute(const Task& t);
  void run_stream(size_t s);
  void fail(const Status& st) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed) {
      failed = true;
      error = st;
    }
    stop = true;
    cv.notify_all();
  }

  // Tensor parallelism (executor_tp.cc; docs/runtime.md).
  struct TensorParallel {
    int size = 1, rank = 0;
    bool sequence_parallel = false;  // the plan exchanges sequence slices (all-gather / reduce-scatter)
    std::set<const Chunk*> sliced;   // chunks split over tp (tp_slice.h)
    std::unique_ptr<comm::Communicator> sync;  // the tp group in its own matching context (grad sums, router)
  };
  TensorParallel tp;
  Status init_tp(const compile::Program& program);
  Status resolve_tp(const compile::Instruction& in, Task* t);
  Status tp_exchange(const Task& t);
  // Sequence parallelism: a chunk that is not split over tp sees this rank's slice of the microbatch's tokens.
  Status tp_context(const Task& t, StepContext* ctx, Microbatch* mb);
  // Sums over tp the gradients that are partial on each tensor rank (replicated parameters); once per step.
  Status tp_sync_grads();
  // Squared gradient norm of a split chunk that this rank counts (split tensors: every tensor rank; replicated
  // ones: tensor rank 0).
  double tp_grad_sq(const Chunk& chunk) const;

  // executor_comm.cc
  Status resolve_comm(const compile::Instruction& in, Task* t);
  Status send(const Task& t);
  Status recv(const Task& t);
  Status collective(const Task& t);
  Status reduce_scatter(const Task& t);
  Status gather_params(const Task& t);
  // Polls `h` until done, the step failed elsewhere (Unavailable; `keep` is parked in `abandoned`), or the
  // context's timeout passed (DeadlineExceeded naming the ranks that did not arrive).
  Status wait_comm(comm::Communicator& c, comm::Handle& h, std::shared_ptr<const void> keep, const std::string& what);
  // The global gradient norm over every rank (each parameter counted once).
  Result<double> global_grad_norm();
  // Sums (loss, aux) over the ranks that own them; returns the step's mean loss and aux loss.
  Status reduce_losses(double* loss, double* aux);

  // executor_ep.cc: expert parallelism and the expert load. Null without experts in the graph.
  std::shared_ptr<detail::EpState> ep;
  // An all_to_all instruction (dispatch/combine over ep): group, producers, consumers.
  Status resolve_ep(const compile::Instruction& in, Task* t);
  // After every instruction is resolved: MoE layers, expert norm owners, the HALO context (collective over ep).
  Status ep_setup();
  Status ep_exchange(const Task& t);
  // Before the global norm: expert gradients become the mean over the ep group's objectives.
  void ep_scale_grads();
  // Tokens each expert received this step, per MoE layer, summed over the ranks (collective when distributed).
  Status collect_expert_tokens(std::map<int, std::vector<int64_t>>* out);
  // Checks a placement table (every layer an experts layer, each a permutation of the experts).
  Status check_expert_placement(const std::map<int, std::vector<int>>& placement) const;
  Result<ExpertMigration> ep_migrate(const std::map<int, std::vector<int>>& placement);
  static const std::map<int, std::vector<int>> kNoPlacement;
};

}  // namespace piper::runtime
