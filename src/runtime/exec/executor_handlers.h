// The executor's handlers (internal, not a public header): one object per kind of communication, each with its
// own state (and a lock where streams share that state), over the core of executor_impl.h.
//
// Every handler implements the Handler interface: resolve (create(): an instruction of its kind into a Task),
// run (one such Task, on its stream's thread), begin_step / end_step (around a step, no stream running),
// prepare_norm (before the global gradient norm, once per step, every gradient task and reduction done) and
// grad_sq (its share of the squared norm: the chunks whose gradients it holds in another form than whole).
//
//   PipelineP2p     pipeline send / recv of hidden states, and af-pipe's dense m2n edges (executor_p2p.cc)
//   DataParallel    the dp gradient all-reduce and ZeRO 1-3: shards, reduce-scatters, parameter all-gathers,
//                   re-sharding at the free of a gathered buffer, sharded updates (executor_dp.cc)
//   TensorParallel  the tp gather / scatter / reduce of hidden states, the sequence slice of unsplit chunks,
//                   the plan's gradient sums over tp (executor_tp.cc); tp_overlap's pieces of split chunks and of their
//                   all-gathers and reduce-scatters (executor_tp_overlap.cc)
//   ExpertParallel  ep dispatch / combine (flat or HALO), expert placement and migration, expert gradient
//                   scaling and norm ownership, the per-step expert load (executor_ep.cc)
//   M2n             af-pipe's routed attention <-> experts exchanges (eight variants) and the FFN group's
//                   combine (executor_m2n.cc)
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "piper/runtime/exec/executor_impl.h"

namespace piper::comm {
class HaloContext;
}

namespace piper::runtime::detail {

class Handler {
 public:
  explicit Handler(Core& core) : core_(core) {}
  virtual ~Handler() = default;
  Handler(const Handler&) = delete;
  Handler& operator=(const Handler&) = delete;

  // create(): fills `t` for instruction `in` of this handler's kind (the core set t->in and t->handler).
  virtual Status resolve(const compile::Instruction& in, Task* t) = 0;
  // create(), after every instruction is resolved.
  virtual Status setup() { return ok_status(); }
  // Runs one resolved Task on its stream's thread.
  virtual Status run(const Task& t) = 0;
  // Before a step's streams start / after they all ended without failure.
  virtual void begin_step() {}
  virtual Status end_step(StepResult* /*result*/) { return ok_status(); }
  // Multi-rank, once per step before the global norm (after every gradient task and reduction).
  virtual Status prepare_norm() { return ok_status(); }
  // This rank's share of `chunk`'s squared gradient norm when this handler holds the chunk's gradient (its
  // slices, shards or experts); nullopt leaves the chunk to the next handler and then to the core.
  virtual std::optional<double> grad_sq(const Chunk& /*chunk*/) { return std::nullopt; }

 protected:
  Core& core_;
};

// Pipeline send / recv: one hidden state (or its gradient) with the peer of the plan's tag on the p2p
// communicator. No state of its own.
class PipelineP2p final : public Handler {
 public:
  using Handler::Handler;
  Status resolve(const compile::Instruction& in, Task* t) override;
  Status run(const Task& t) override;

 private:
  Status send(const Task& t);
  Status recv(const Task& t);
};

// The data-parallel gradient reduction (all-reduce, zero=0) and ZeRO 1-3. Thread-safety: the shards' layout is
// fixed at create(); mu_ guards what the streams change during a step (gathered copies, packs, the window of
// full gradients, reductions done).
class DataParallel final : public Handler {
 public:
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
    int gathered = 0;             // ZeRO-3: all-gathered copies whose plan buffer is not freed yet (mu_)
    // Each tensor rank's shard counts in the norm: experts reduced over the plan's edp group
    // (Plan::experts_reduce_over_edp), whose shards span the tensor ranks. Set once, where the shard is built.
    bool every_tp_rank_owns = false;
    comm::Communicator* group = nullptr;  // the ranks the chunk is sharded over (dp or edp)
  };

  using Handler::Handler;
  Status resolve(const compile::Instruction& in, Task* t) override;
  // After every instruction is resolved: shrinks the optimizer state, gradients (ZeRO-2/3) and parameters
  // (ZeRO-3) of sharded chunks to this rank's shard.
  Status setup() override;
  Status run(const Task& t) override;
  void begin_step() override;
  std::optional<double> grad_sq(const Chunk& chunk) override;

  // An alloc whose buffer holds the ZeRO-3 parameters of `chunk` that the next all-gather materialises.
  void own_param_buffer(int buffer, Chunk* chunk) { param_buffers_[buffer] = chunk; }
  // The free of a buffer: true when it was a gathered-parameter buffer (the last one re-shards the chunk).
  Result<bool> free_buffer(const compile::Instruction& in);
  // Before a compute task: ZeRO-3 parameters gathered (not for W).
  Status check_gathered(const Task& t);
  // Before a weight-gradient task of a ZeRO-2/3 chunk: waits until the previous microbatch's gradient left the
  // full tensors and at most kFullGradWindow chunks hold one, then allocates them (zero).
  Status before_grad_task(const Task& t);
  // Every gradient reduction of the step has run.
  bool reductions_complete();
  // The optimizer update of `chunk`: its shard (ZeRO) or all of it. A chunk whose all-gather the plan defers
  // (deferred_) then holds a pending gather.
  void update(Optimizer& optimizer, Chunk& chunk);
  // Between steps: runs every pending deferred all-gather, in (layer, part) order on every rank (each group sees
  // its collectives in one order), so that every rank holds the whole updated parameters (Executor::
  // complete_param_gathers).
  Status complete_deferred_gathers();

  const Shard* shard(const Chunk& chunk) const;
  Shard* shard(const Chunk& chunk);
  std::vector<Executor::ParamShard> param_shards(const Chunk& chunk);
  // The pieces of `chunk`'s gradient this rank holds reduced (the whole tensors; under ZeRO-1 the shard's part
  // of them, under ZeRO-2/3 of the accumulated shard) for the trainable parameters `select` accepts.
  std::vector<std::pair<float*, int64_t>> grad_pieces(Chunk& chunk, const std::function<bool(const Param&)>& select);
  // Expert migration of a ZeRO-sharded experts chunk: the moments (and the ZeRO-3 values) of the shard group
  // all-gathered into whole tensors per trainable parameter (kinds m, v[, value]), and back into this rank's shard.
  Result<std::vector<std::vector<std::vector<float>>>> gather_shard_state(Chunk& chunk, const Shard& sh);
  void scatter_shard_state(Chunk& chunk, Shard& sh, const std::vector<std::vector<std::vector<float>>>& whole);

  static constexpr int kFullGradWindow = 2;

 private:
  // Sets up shards_[chunk] for a group of `degree` ranks in which this rank is `rank` (once per chunk), and whether
  // every tensor rank's shard counts in the norm (Shard::every_tp_rank_owns).
  Shard& shard_of(Chunk* chunk, int degree, int rank, bool every_tp_rank_owns);
  void materialize_grads(Chunk* chunk, Shard& sh);
  Status all_reduce(const Task& t);
  Status reduce_scatter(const Task& t);
  Status gather_params(const Task& t);
  // ZeRO-1/2: every rank of `comm` contributes its shard of `chunk`'s whole parameters and receives the others'.
  Status gather_whole(Chunk& chunk, const Shard& sh, comm::Communicator& comm);
  void reduction_done();

  std::map<const Chunk*, Shard> shards_;
  std::map<int, Chunk*> param_buffers_;  // ZeRO-3: plan buffers of gathered parameters (freed = re-shard)
  std::set<const Chunk*> reduced_;       // chunks with a gradient all-reduce or ZeRO-1 reduce-scatter
  // ZeRO-1/2 chunks whose parameter all-gather the plan places before the next step's forward (param_gather
  // "before_forward": the instruction has no update before it), fixed at create(). `pending` (mu_): the chunk was
  // updated since its last gather, so the other ranks' shards of its whole parameters are a step old; false at the
  // start (every replica holds the same initial or resumed parameters), so the first step's gather has nothing to
  // move and is skipped.
  struct DeferredGather {
    comm::Communicator* comm = nullptr;
    bool pending = false;
  };
  std::map<const Chunk*, DeferredGather> deferred_;
  int64_t reductions_total_ = 0;
  std::mutex mu_;
  int64_t reductions_done_ = 0;
  std::map<const Chunk*, int> packs_done_;  // ZeRO-2: microbatch gradients taken out of the full buffer
  int full_grads_live_ = 0;  // ZeRO-2/3: chunks whose full gradient tensors exist (at most kFullGradWindow)
};

struct SplitNode;

// Tensor parallelism (docs/runtime.md). Its layout is fixed at create(); mu_ guards the split nodes of
// tp_overlap, which a chunk's pieces on the compute stream share with its collective's pieces on the tp stream.
class TensorParallel final : public Handler {
 public:
  explicit TensorParallel(Core& core);
  ~TensorParallel() override;
  Status init(const compile::Program& program);
  Status resolve(const compile::Instruction& in, Task* t) override;
  Status run(const Task& t) override;
  void begin_step() override;
  // tp_overlap (executor_tp_overlap.cc): a compute piece of a split chunk (create(): checks the chunk runs in
  // row pieces; run: its share of the chunk's work, docs/runtime.md "tp_overlap").
  Status resolve_piece(const compile::Instruction& in, Task* t);
  Status run_piece(const Task& t, StepContext& ctx);
  // After every instruction is resolved: every chunk whose gradients are partial over tp has the plan's sum.
  Status setup() override;
  // Every tp gradient sum of the step has run (the update waits for it, with the data-parallel reductions).
  bool grad_sums_complete();
  // Split chunks: split tensors count on every tensor rank, replicated ones on tensor rank 0, over this rank's
  // ZeRO shard when the chunk is sharded.
  std::optional<double> grad_sq(const Chunk& chunk) override;
  // Sequence parallelism: a chunk that is not split over tp sees this rank's slice of the microbatch's tokens.
  // Vocabulary parallelism: a split head gathers its cross-entropy statistics over tp (gather_over_vocab).
  Status context(const Task& t, StepContext* ctx, Microbatch* mb);
  // How many token slices a hidden state between chunks is cut into (tp under sequence parallelism, else 1).
  int token_shards() const { return sequence_parallel_ ? size_ : 1; }
  // How many token slices a microbatch's loss is computed on: 1 when the plan splits the head over tp (every
  // tensor rank's head sees every token and computes the same loss), else token_shards().
  int loss_shards() const { return head_split_ ? 1 : token_shards(); }
  int size() const { return size_; }
  bool sequence_parallel() const { return sequence_parallel_; }

 private:
  int size_ = 1, rank_ = 0;
  bool sequence_parallel_ = false;            // the plan exchanges sequence slices (all-gather / reduce-scatter)
  std::set<const Chunk*> sliced_;             // chunks split over tp (tp_slice.h)
  std::unique_ptr<comm::Communicator> sync_;  // the tp group in its own matching context (router statistics)
  // The plan's gradient sums over tp (CommRole::kTpGradSum), on their own communicator: one stream posts them, in
  // the plan's order on every tensor rank.
  std::unique_ptr<comm::Communicator> grads_;
  std::set<const Chunk*> grad_sums_;  // chunks with a tp gradient sum; fixed at create()
  int64_t grad_sums_done_ = 0;        // this step's; mu_
  Status resolve_grad_sum(const compile::Instruction& in, Task* t);
  // Whether some of the chunk's trainable tensors get only a share of their gradient on each tensor rank: the
  // tensors a split chunk keeps whole (tp_param_split), or under sequence parallelism all of an unsplit chunk's
  // but experts the plan reduces over edp (ir::add_tp_grad_sums, the compiler's rule).
  bool partial_over_tp(const Chunk& chunk) const;
  // The chunk's gradients that are partial over tp: the tensors a split chunk keeps whole, or under sequence
  // parallelism all of an unsplit chunk's; under ZeRO this rank's shard of them (DataParallel::grad_pieces).
  std::vector<std::pair<float*, int64_t>> partial_grads(Chunk& chunk);
  Status grad_sum(const Task& t);
  bool head_split_ = false;                   // the plan shards the head over tp (on any pipeline rank)
  // af-pipe: an all-gather whose producer is this FFN rank's experts F combines their rows first (M2n), over
  // this communicator (null: an FFN group of one rank).
  std::map<ir::NodeId, comm::Communicator*> combines_;
  Result<std::shared_ptr<const Tensor>> take_input(const Task& t);
  std::unique_ptr<comm::Communicator> vocab_;  // the tp group for the split head's statistics (its own context)
  Status gather_over_vocab(const float* mine, float* all, int64_t count);
  template <typename T>
  Result<std::vector<T>> gather_small(comm::Communicator& c, const T* mine, int64_t count, const std::string& what);

  // tp_overlap (executor_tp_overlap.cc).
  Status resolve_collective_piece(const compile::Instruction& in, Task* t);
  Status gather_piece(const Task& t);   // one ring step of a split all-gather
  Status scatter_piece(const Task& t);  // one row block of a split reduce-scatter
  Status begin_pieces(const Task& t, SplitNode& s);
  Status piece_input(const Task& t, SplitNode& s, int64_t n, int64_t h);
  Status finish_pieces(const Task& t, SplitNode& s, StepContext& ctx);
  std::shared_ptr<SplitNode> split_node(ir::NodeId node);
  std::map<ir::NodeId, int> collective_pieces_;  // create() only: pieces seen per collective node
  std::mutex mu_;
  std::map<ir::NodeId, std::shared_ptr<SplitNode>> splits_;  // this step's split chunk nodes; mu_
};

struct EpExchange;

// A MoE combine's output gradient: its consumers' dhidden, each [tokens, h], summed in edge order (the first itself
// when there is one). The expert all-to-all's combine B (executor_ep.cc) and etp's in-place combine B with ep = 1
// (executor_ep_etp.cc) start from it.
Result<std::shared_ptr<const Tensor>> sum_consumer_gradients(const std::vector<Gradient>& grads, int64_t tokens,
                                                             int64_t h);

// Expert parallelism (executor_ep.cc) and the expert load. Thread-safety: mu_ guards the exchanges between a
// dispatch and its backward; the placement tables change only between steps.
class ExpertParallel final : public Handler {
 public:
  explicit ExpertParallel(Core& core);
  ~ExpertParallel() override;
  // An all_to_all instruction (dispatch/combine over ep): group, producers, consumers.
  Status resolve(const compile::Instruction& in, Task* t) override;
  // MoE layers, expert norm ownership, the HALO context (collective over ep).
  Status setup() override;
  Status run(const Task& t) override;
  // The tokens each expert received this step (StepResult::expert_tokens), summed over the ranks.
  Status end_step(StepResult* result) override;
  // Expert gradients become the mean over the ep group's objectives.
  Status prepare_norm() override;
  // Experts chunks count once: on the first expert-data-parallel replica.
  std::optional<double> grad_sq(const Chunk& chunk) override;
  // af-pipe: this FFN rank's experts serve the ep attention ranks of its block over M2N; their gradient scaling
  // and norm ownership are expert parallelism's over `group`.
  Status serve_m2n(comm::Communicator* group);

  bool parallel() const { return comm_ != nullptr; }
  const std::map<int, std::vector<int>>& placement() const;
  int experts_per_rank() const;
  // Checks a placement table (every layer an experts layer, each a permutation of the experts).
  Status check_placement(const std::map<int, std::vector<int>>& placement) const;
  void set_tables(const std::map<int, std::vector<int>>& placement);
  Result<ExpertMigration> migrate(const std::map<int, std::vector<int>>& placement);

 private:
  struct Call;  // one all-to-all being run: flat/HALO exchanges and the dispatch/combine F/B
  // Expert tensor parallelism (executor_ep_etp.cc): the all-gather of the experts' input rows over etp and the
  // reduce-scatter of their partial outputs, F and B.
  Status resolve_etp(const compile::Instruction& in, Task* t);
  Status run_etp(const Task& t);
  // One layer of migrate whose placement changes to `next`: counts the experts that change rank, and on the
  // rank holding the layer's experts moves their state (ZeRO shards gathered first, re-sharded after).
  Status migrate_layer(int layer, const std::vector<int>& next, const std::map<std::string, Tensor*>& moments,
                       ExpertMigration* out);

  bool has_experts_ = false;
  int ep_ = 1;  // group size (1: no expert parallelism, only the load count)
  int experts_per_rank_ = 0;
  bool halo_ = false;
  comm::Communicator* comm_ = nullptr;
  std::unique_ptr<comm::HaloContext> halo_context_;
  std::set<int> moe_layers_;  // layers with an experts chunk in the plan (every rank: same plan)
  // Expert parallelism: per MoE layer the logical expert in each physical slot, and its inverse.
  std::map<int, std::vector<int>> slot_expert_, expert_slot_;
  bool owns_expert_norm_ = false;
  std::mutex mu_;
  std::map<std::pair<int, int>, std::shared_ptr<EpExchange>> exchanges_;  // (layer, mb); mu_
  // etp: per (layer, mb) the rows each rank of the etp group contributed (from the F all-gather to the B
  // reduce-scatter); mu_
  std::map<std::pair<int, int>, std::vector<int64_t>> etp_rows_;
  // etp with ep = 1: per (layer, mb) the router's routing (weights for the combine, token count); mu_
  std::map<std::pair<int, int>, std::shared_ptr<const Routed>> etp_routed_;
  // ep = 1 with the experts reduced over the plan's edp group (etp > 1 or sequence parallelism; comm_ null): norm
  // and scaling as with ep.
  bool edp_without_ep_ = false;
};

struct M2nSource;
struct M2nSink;

// af-pipe's routed M2N exchanges (executor_m2n.cc). Thread-safety: mu_ guards the per-(layer, microbatch)
// routing of the attention side and rows of the FFN side, which the send and receive streams share.
class M2n final : public Handler {
 public:
  explicit M2n(Core& core);
  ~M2n() override;
  // Whether an m2n send / recv is a routed exchange this handler runs (true) or a dense edge that runs as a
  // pipeline message with the same-dp peer (false).
  Result<bool> routed(const compile::Instruction& in) const;
  Status resolve(const compile::Instruction& in, Task* t) override;
  // Runs the variant of (pass, side, direction) that Call's table names.
  Status run(const Task& t) override;
  // Before a compute task on an FFN rank: the experts' output rows for the head become its hidden input (the
  // combine inside the FFN group), and the head's gradient becomes the experts' row gradients (transposed).
  Status local_inputs(const Task& t, std::vector<Activation>* inputs);
  Status local_grads(const Task& t, std::vector<Gradient>* grads);
  // The combine inside the FFN group of the experts' output rows `a` (message of node `src`, microbatch `mb`) into
  // the same-dp source's hidden state, exchanging rows over `group` (null: an FFN group of one rank). `reader` names
  // the task in errors.
  Result<std::shared_ptr<const Tensor>> combine_local(const Task& reader, ir::NodeId src, int mb, const Activation& a,
                                                      comm::Communicator* group);
  // A communicator of the FFN rank's ep group for a combine that another stream than the compute stream runs (the
  // tp all-gather before a vocabulary-parallel head): create() only, the same on every rank of the group; null
  // when the group is one rank.
  Result<comm::Communicator*> combine_comm_off_compute();

 private:
  struct Call;  // one routed m2n instruction being run: its context, shared pieces and the eight variants
  std::shared_ptr<M2nSink> find_sink(std::pair<int, int> key);

  bool active_ = false;
  std::map<int, std::unique_ptr<comm::Communicator>> combine_comms_;  // FFN group per m2n_to stream (create())
  std::unique_ptr<comm::Communicator> combine_off_compute_;           // create(): combine_comm_off_compute()
  std::mutex mu_;
  std::map<std::pair<int, int>, std::shared_ptr<M2nSource>> sources_;  // mu_
  std::map<std::pair<int, int>, std::shared_ptr<M2nSink>> sinks_;      // mu_
};

}  // namespace piper::runtime::detail
