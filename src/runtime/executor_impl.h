// Internal to the executor (executor.cc: program setup, compute, events, memory, updates; executor_comm.cc:
// send/recv and collectives of multi-rank programs, gradient norm and loss across ranks). Not a public header.
#pragma once

#include <atomic>
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

#include "piper/runtime/dist_context.h"
#include "piper/runtime/executor.h"
#include "piper/runtime/message_table.h"

namespace piper::runtime::detail {

// A tensor-parallel collective over hidden states (the shard pass's tp_ag / tp_rs / tp_ar nodes): the plan's
// roles kTpGather, kTpScatter, kTpReduce.
bool is_tp_exchange(const compile::Instruction& in);

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
  // m2n between attention and experts (executor_m2n.cc): the world ranks of the other side it exchanges with;
  // whether this rank is the FFN side of it; m2n_local: the FFN group combines the experts' output (the head is
  // on the FFN rank, or the next attention on another attention rank than the router).
  bool m2n_routed = false, m2n_ffn = false, m2n_local = false;
  std::vector<int> peers;
};

struct EpState;   // executor_ep.cc
struct M2nState;  // executor_m2n.cc

}  // namespace piper::runtime::detail

namespace piper::runtime {

struct Executor::Impl {
  using Task = detail::Task;
  using StashKey = detail::StashKey;

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
  std::map<int, StashKey> buffer_owner;
  // Buffers that only count bytes: a recomputed forward's checkpoint (its input, which the chunk's stash keeps
  // for the re-run), allocated before the same forward as its activations' buffer.
  std::set<int> counted_only;
  std::map<Chunk*, int> updates_expected;
  std::map<const Chunk*, bool> norm_owner;  // multi-rank: this rank counts the chunk in the global norm
  int64_t grad_tasks_total = 0;
  int64_t reductions_total = 0;
  std::set<const Chunk*> reduced;  // chunks with a gradient reduction
  // ZeRO: chunks whose gradients are reduce-scattered; this rank owns flat elements [begin, end) of the chunk's
  // trainable parameters taken as one vector (zero padded to per_rank * degree).
  struct Shard {
    int64_t begin = 0, end = 0, per_rank = 0;
    bool per_microbatch = false;  // ZeRO-2/3: one reduce-scatter per microbatch, gradient accumulated sharded
    bool params_sharded = false;  // ZeRO-3: only [begin, end) of the parameters is kept between uses
    int count = 0;                // reduce-scatters of the chunk per step
    std::vector<Shape> shapes;    // per trainable parameter
    Tensor grad;                  // ZeRO-2/3: this rank's accumulated gradient shard [end - begin] (mean over dp)
    std::vector<Tensor> values;   // ZeRO-3: per trainable parameter its elements inside [begin, end)
    int gathered = 0;             // ZeRO-3: all-gathered copies whose plan buffer is not freed yet
    // Sharded over edp x tp (the experts under tp with sequence parallelism): the reduce-scatter also sums the
    // tensor ranks' partial gradients, so the tp sum skips the chunk and every rank owns its shard in the norm.
    bool over_tp = false;
    comm::Communicator* group = nullptr;  // the ranks the chunk is sharded over (dp, edp or edp_tp)
  };
  std::map<const Chunk*, Shard> shards;  // gradient all-reduce / reduce-scatter instructions of the step
  // Sets up shards[chunk] for a group of `degree` ranks in which this rank is `rank` (once per chunk).
  Shard& shard_of(Chunk* chunk, int degree, int rank);
  // After every instruction is resolved: shrinks the optimizer state, gradients (ZeRO-2/3) and parameters
  // (ZeRO-3) of sharded chunks to this rank's shard.
  Status shard_state();
  std::map<int, Chunk*> param_buffers;  // ZeRO-3: plan buffers of gathered parameters (freed = re-shard)
  // ZeRO-2/3: the full gradient tensors exist only while a microbatch's gradient is accumulated (W/BW) until its
  // reduce-scatter takes it; allocates them (zero) if absent. Caller holds mu.
  void materialize_grads(Chunk* chunk, Shard& sh);
  int num_events = 0;
  int num_mb = 1;
  int64_t planned_peak = 0;

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
  int64_t reductions_done = 0;
  std::map<const Chunk*, int> packs_done;  // ZeRO-2: microbatch gradients taken out of the full buffer
  std::map<const Chunk*, int> shard_reductions;
  int full_grads_live = 0;  // ZeRO-2/3: chunks whose full gradient tensors exist (at most kFullGradWindow)
  static constexpr int kFullGradWindow = 2;
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
  Result<std::shared_ptr<const Tensor>> take_hidden(const Task& t, const std::string& boundary);
  // Publishes `x` as t's Activation::hidden (t.gradient: Gradient::dhidden).
  void publish_hidden(const Task& t, std::shared_ptr<const Tensor> x);

  // create(): every instruction resolved into its Task (executor.cc).
  Status index_program(const compile::Program& program);  // by_node; every node a data flow names is in it
  Status resolve(const compile::Stream& stream, size_t i, Task* t);
  Status resolve_alloc(const compile::Stream& stream, size_t i);
  Status resolve_compute(const compile::Instruction& in, Task* t);
  Status wire_compute(const compile::Instruction& in, Task* t);
  std::map<ir::NodeId, int> computes_of_node;           // create() only
  std::map<const Chunk*, int> grad_tasks_of_chunk;      // create() only

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
    bool sequence_parallel = false;            // the plan exchanges sequence slices (all-gather / reduce-scatter)
    std::set<const Chunk*> sliced;             // chunks split over tp (tp_slice.h)
    std::unique_ptr<comm::Communicator> sync;  // the tp group in its own matching context (grad sums, router)
  };
  TensorParallel tp;
  Status init_tp(const compile::Program& program);
  Status resolve_tp(const compile::Instruction& in, Task* t);
  Status tp_exchange(const Task& t);
  // Sequence parallelism: a chunk that is not split over tp sees this rank's slice of the microbatch's tokens.
  Status tp_context(const Task& t, StepContext* ctx, Microbatch* mb);
  // Sums over tp the gradients that are partial on each tensor rank (replicated parameters); once per step.
  // Under ZeRO only this rank's data-parallel shard of them is summed (the shards of one chunk cover the same
  // elements on every tensor rank: each holds the same chunk structure).
  Status tp_sync_grads();
  // Squared gradient norm of a split chunk that this rank counts (split tensors: every tensor rank; replicated
  // ones: tensor rank 0), over this rank's ZeRO shard when the chunk is sharded.
  double tp_grad_sq(const Chunk& chunk);
  // The pieces of `chunk`'s gradient this rank holds reduced (the whole tensors; under ZeRO-1 the shard's part
  // of them, under ZeRO-2/3 of the accumulated shard) for the trainable parameters `select` accepts.
  std::vector<std::pair<float*, int64_t>> grad_pieces(Chunk& chunk, const std::function<bool(const Param&)>& select);

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
  struct EpCall;  // one all-to-all being run: flat/HALO exchanges and the dispatch/combine F/B (executor_ep.cc)
  // Before the global norm: expert gradients become the mean over the ep group's objectives.
  void ep_scale_grads();
  // Tokens each expert received this step, per MoE layer, summed over the ranks (collective when distributed).
  Status collect_expert_tokens(std::map<int, std::vector<int64_t>>* out);
  // af-pipe: this FFN rank's experts serve the ep attention ranks of its block over M2N (executor_m2n.cc); their
  // gradient scaling and norm ownership are expert parallelism's over `group`.
  Status ep_serve_m2n(comm::Communicator* group);

  // executor_m2n.cc: disaggregated attention/FFN (af-pipe). An m2n instruction whose other end is an experts
  // chunk is a routed exchange (true); a dense one (false) runs as a pipeline send/recv with the same-dp peer.
  std::shared_ptr<detail::M2nState> m2n;
  Result<bool> resolve_m2n(const compile::Instruction& in, Task* t);
  // Runs the variant of (pass, side, direction) that M2nCall's table names (executor_m2n.cc).
  Status m2n_exchange(const Task& t);
  struct M2nCall;  // one routed m2n instruction being run: its context, shared pieces and the eight variants
  // Before a compute task on an FFN rank: the experts' output rows for the head become its hidden input (the
  // combine inside the FFN group), and the head's gradient becomes the experts' row gradients (transposed).
  Status m2n_local_inputs(const Task& t, std::vector<Activation>* inputs);
  Status m2n_local_grads(const Task& t, std::vector<Gradient>* grads);
  // Checks a placement table (every layer an experts layer, each a permutation of the experts).
  Status check_expert_placement(const std::map<int, std::vector<int>>& placement) const;
  Result<ExpertMigration> ep_migrate(const std::map<int, std::vector<int>>& placement);
  // One layer of ep_migrate whose placement changes to `next`: counts the experts that change rank, and on the
  // rank holding the layer's experts moves their state (ZeRO shards gathered first, re-sharded after).
  Status migrate_layer(int layer, const std::vector<int>& next, const std::map<std::string, Tensor*>& moments,
                       ExpertMigration* out);
  // Expert migration of a ZeRO-sharded experts chunk: the moments (and the ZeRO-3 values) of the shard group
  // all-gathered into whole tensors per trainable parameter (kinds m, v[, value]), and back into this rank's shard.
  Result<std::vector<std::vector<std::vector<float>>>> gather_shard_state(Chunk& chunk, const Shard& sh);
  void scatter_shard_state(Chunk& chunk, Shard& sh, const std::vector<std::vector<std::vector<float>>>& whole);
  static const std::map<int, std::vector<int>> kNoPlacement;
};

template <typename Msg>
Result<Msg> Executor::Impl::take_message(const Task& reader, ir::NodeId src) {
  std::optional<Msg> msg = messages.take<Msg>(src);
  if (!msg) {
    return internal_error("'" + reader.in->label + "': the " + (std::is_same_v<Msg, Gradient> ? "gradient" : "output") +
                          " of '" + name_of(src) + "' is not available: the plan runs it before its producer");
  }
  return std::move(*msg);
}

}  // namespace piper::runtime
