// Internal to the executor (not a public header): its core and the Task every instruction is resolved into.
//
// The core (detail::Core; executor.cc, executor_comm.cc) owns what every instruction shares: the streams (one
// thread each), the events between them, the message table (take / publish), the stashes of activations, memory
// tracking of the plan's buffers, the step's losses, the timeouts and the failure of a step. Each kind of
// communication is a handler (executor_handlers.h) with its own state and lock: pipeline p2p, data parallelism
// and ZeRO, tensor parallelism, expert parallelism (flat or HALO) and M2N. The core resolves every instruction
// into a Task, gives each communication Task to its handler (Task::handler) and calls the handlers at the start
// and end of a step and for their share of the gradient norm.
//
// Locks: the core's `mu` guards its per-step state; a handler's lock guards only that handler's state. A thread
// may take a handler's lock while it holds `mu` (a wait_until predicate reads a handler's state), never `mu` while
// it holds a handler's lock. A handler that changes what another stream waits for calls notify() after
// releasing its own lock.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "piper/runtime/exec/dist_context.h"
#include "piper/runtime/exec/executor.h"
#include "piper/runtime/exec/message_table.h"

namespace piper::runtime::detail {

// A tensor-parallel collective over hidden states (the shard pass's tp_ag / tp_rs / tp_ar nodes): the plan's
// roles kTpGather, kTpScatter, kTpReduce.
bool is_tp_exchange(const compile::Instruction& in);
// The experts' etp all-gather or reduce-scatter of rows (executor_ep_etp.cc).
bool is_etp_exchange(const compile::Instruction& in);

// (layer, name, mb): a chunk's F state under its part's name (Instruction::part_name), an ep exchange's under
// "dispatch" / "combine", an af-pipe exchange's under "m2n" and the experts' layer.
using StashKey = std::tuple<int, std::string, int>;

std::string key_name(const StashKey& k);

class Handler;
class PipelineP2p;
class DataParallel;
class TensorParallel;
class ExpertParallel;
class M2n;

// One instruction with everything resolved at create().
struct Task {
  const compile::Instruction* in = nullptr;
  Handler* handler = nullptr;  // send / recv / collective: the handler that runs it
  Chunk* chunk = nullptr;
  ir::Pass pass = ir::Pass::kNone;
  int mb = -1;
  StashKey key;
  std::vector<ir::NodeId> sources;  // F: producers' F nodes; B/BW: consumers' B/BW nodes (edge order)
  int consumers = 0;                // tasks that read this task's message
  bool recomputed = false;          // F of a chunk whose stash is dropped and rebuilt before its backward
  bool rerun = false;               // the rebuilding F (the second compute of the same node)
  int grad_index = -1;              // W/BW: how many weight-gradient tasks of the chunk come before it
  // tp_overlap pieces (compile::Segment; executor_tp_overlap.cc): the index of this piece among its node's pieces
  // of the same segment; whether it is the node's last compute piece (the last kOut piece, or kRest when the
  // output GEMM is whole), which publishes, stashes and counts the node as one whole task would; a collective
  // piece's split chunk (the node whose input it gathers or whose output it reduce-scatters).
  int piece = 0;
  bool last_piece = true;
  ir::NodeId split_owner = ir::kNoNode;
  // send/recv: the world rank on the other side, the message kind; send: the producing task's node.
  int peer = -1;
  bool gradient = false;
  ir::NodeId source = ir::kNoNode;
  // collectives: the group's communicator and degree.
  comm::Communicator* comm = nullptr;
  int degree = 1;
  // m2n between attention and experts (executor_m2n.cc): the world ranks of the other side it exchanges with
  // (Plan::m2n_peers) and which of them is this rank's same-dp peer (Plan::p2p_peer); whether this rank is the FFN
  // side of it; m2n_local: the FFN group combines the experts' output (the head is on the FFN rank, or the next
  // attention on another attention rank than the router).
  bool m2n_ffn = false, m2n_local = false;
  std::vector<int> peers;
  size_t same_dp_peer = 0;
};

class Core {
 public:
  Core();
  ~Core();

  const compile::Plan* plan = nullptr;
  // The first instruction of this rank's program lowering each node: messages are named by node ids
  // (Instruction::inputs / outputs), and a producer's or consumer's kind, pass and chunk are its instruction's.
  std::map<ir::NodeId, const compile::Instruction*> by_node;
  const compile::Instruction& instr_of(ir::NodeId id) const { return *by_node.at(id); }
  const std::string& name_of(ir::NodeId id) const { return instr_of(id).label; }
  Model* model = nullptr;
  Optimizer* optimizer = nullptr;
  Allocator* allocator = nullptr;
  DistContext* dist = nullptr;     // null on one rank
  TraceRecorder* trace = nullptr;  // null: no timeline recorded
  std::vector<std::vector<Task>> streams;
  std::vector<std::string> stream_names;  // the program's, by stream index
  std::map<int, StashKey> buffer_owner;
  // Buffers that only count bytes: a recomputed forward's checkpoint (its input, which the chunk's stash keeps
  // for the re-run), allocated before the same forward as its activations' buffer.
  std::set<int> counted_only;
  std::map<Chunk*, int> updates_expected;
  // Multi-rank: this rank counts the chunk in the global norm (chunks that no handler claims: grad_sq).
  std::map<const Chunk*, bool> norm_owner;
  int64_t grad_tasks_total = 0;
  int num_events = 0;
  int num_mb = 1;
  int64_t planned_peak = 0;

  // The handlers (executor_handlers.h), built by create() for every executor; one without instructions of its
  // kind has no effect. `handlers` lists them in the order of their per-step hooks and norm shares.
  std::unique_ptr<PipelineP2p> p2p;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<TensorParallel> tp;
  std::unique_ptr<ExpertParallel> ep;
  std::unique_ptr<M2n> m2n;
  std::vector<Handler*> handlers;

  // Per-step state, guarded by mu.
  std::mutex mu;
  std::mutex norm_mu;  // serialises the multi-rank norm exchange
  std::condition_variable cv;
  std::atomic<bool> stop{false};  // mirrors `failed` for threads polling communication
  std::map<StashKey, std::unique_ptr<Stash>> stashes;
  std::map<StashKey, std::vector<Activation>> recompute_inputs;  // inputs kept for the re-run of a dropped F
  std::vector<char> events;
  std::map<Chunk*, int> updates_done;
  int64_t grad_tasks_done = 0;
  bool norm_done = false;
  double grad_norm = 0;
  bool failed = false;
  Status error;
  std::vector<double> loss_mb, aux_mb;
  std::map<std::string, double> task_seconds;
  std::map<std::string, double> stream_cpu_s;  // StepResult::stream_cpu_s
  int64_t planned_live = 0;
  // Buffers of communication abandoned in flight after a failure: kept until the executor dies.
  std::vector<std::shared_ptr<const void>> abandoned;
  // The batch of the running step (set before the streams start, read-only while they run).
  const Batch* batch = nullptr;
  int64_t mbs = 0;

  // The core's message table (message_table.h): what each task published for its consumers this step. Every
  // task takes its inputs and publishes its output through the four calls below.
  detail::MessageTable messages;
  // `reader`'s copy of node `src`'s message (Activation forward, Gradient backward); an internal error naming
  // both when it is not there (the plan runs the reader before the producer).
  template <typename Msg>
  Result<Msg> take_message(const Task& reader, ir::NodeId src);
  // `t`'s output (Activation) or gradient (Gradient), for its t.consumers readers.
  template <typename Msg>
  void publish_message(const Task& t, Msg msg) {
    messages.publish(t.in->node, std::move(msg), t.consumers);
  }
  // A pipeline or tensor-parallel message is one hidden state or its gradient: the hidden tensor of t.source's
  // message (t.gradient: its Gradient), refused when it carries a routing (a router -> experts edge or its
  // gradient) across `boundary` ("ranks", "tensor ranks").
  // With several t.sources (a tp all-gather after experts and shared experts): their tensors summed in edge order.
  Result<std::shared_ptr<const Tensor>> take_hidden(const Task& t, const std::string& boundary);
  Result<std::shared_ptr<const Tensor>> take_hidden_sum(const Task& t, const std::string& boundary);
  // Publishes `x` as t's Activation::hidden (t.gradient: Gradient::dhidden).
  void publish_hidden(const Task& t, std::shared_ptr<const Tensor> x);

  // Timeouts and waits. Waits for another stream of this rank (events, gradients) give up after kWaitTimeout.
  static constexpr std::chrono::seconds kWaitTimeout{600};
  // wait_comm polls `h` until done, the step failed elsewhere (Unavailable; `keep` is parked
  // in `abandoned`), or the context's timeout passed (DeadlineExceeded naming the ranks that did not arrive).
  Status wait_comm(comm::Communicator& c, comm::Handle& h, std::shared_ptr<const void> keep, const std::string& what);
  // Blocks until `ready()` (evaluated under mu; it may take a handler's lock) or the step failed (Unavailable
  // naming `what`); DeadlineExceeded naming `what` after `timeout`.
  Status wait_until(const std::function<bool()>& ready, std::chrono::duration<double> timeout, const std::string& what);
  // Wakes every wait_until after a handler changed what they wait for (call without a handler's lock held).
  void notify();
  // Adds `seconds` to the step's task_seconds[key].
  void add_seconds(const std::string& key, double seconds);
  void fail(const Status& st);

  // create(): every instruction resolved into its Task (executor.cc).
  Status index_program(const compile::Program& program);  // by_node; every node a data flow names is in it
  Status resolve(const compile::Stream& stream, size_t i, Task* t);
  Status resolve_comm(const compile::Instruction& in, Task* t);
  Status resolve_alloc(const compile::Stream& stream, size_t i);
  Status resolve_compute(const compile::Instruction& in, Task* t);
  Status wire_compute(const compile::Instruction& in, Task* t);
  std::map<ir::NodeId, int> computes_of_node;       // create() only
  std::map<std::pair<ir::NodeId, compile::Segment>, int> pieces_of_node;  // create() only: tp_overlap pieces
  std::map<const Chunk*, int> grad_tasks_of_chunk;  // create() only

  Status execute(const Task& t);
  Status compute(const Task& t);
  Status forward(const Task& t, StepContext& ctx);
  Status backward(const Task& t, StepContext& ctx);
  // The end of a forward task, whole or in tp_overlap pieces: its stash, a recomputed forward's inputs, the
  // microbatch's losses and its output message (publish: false where the reduce-scatter's pieces publish it).
  Status keep_forward(const Task& t, std::unique_ptr<Stash> stash, std::vector<Activation> inputs, Activation out,
                      bool publish);
  Status free_buffer(const compile::Instruction& in);
  Status update(const Task& t);
  void run_stream(size_t s);  // run_tasks, its thread's CPU time added to stream_cpu_s
  void run_tasks(size_t s);
  void begin_step(const Batch& batch);
  Result<StepResult> end_step();

  // executor_comm.cc: the global gradient norm over every rank (each parameter counted once: the handlers'
  // shares, then the chunks no handler claims), and the step's loss over the ranks that own it.
  Result<double> global_grad_norm();
  Status reduce_losses(double* loss, double* aux);
  // The balancing-bias routers' expert loads summed over their replicas, once per step before any update.
  Status sum_bias_counts();
};

template <typename Msg>
Result<Msg> Core::take_message(const Task& reader, ir::NodeId src) {
  std::optional<Msg> msg = messages.take<Msg>(src);
  if (!msg) {
    return internal_error("'" + reader.in->label + "': the " + (std::is_same_v<Msg, Gradient> ? "gradient" : "output") +
                          " of '" + name_of(src) + "' is not available: the plan runs it before its producer");
  }
  return std::move(*msg);
}

}  // namespace piper::runtime::detail

namespace piper::runtime {

struct Executor::Impl : detail::Core {};

}  // namespace piper::runtime
