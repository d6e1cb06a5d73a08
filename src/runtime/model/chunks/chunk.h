// Chunk: one model part of the IR graph (tag `part` of a chunk node) as runnable CPU code for one microbatch.
//
// Parts and the tensors on their data edges (n = tokens of the microbatch, h = hidden size):
//   embed   ids -> hidden x0 [n, h]
//   attn    x -> x + Wo·attention(rope(Wq·rms(x)), rope(Wk·rms(x)), Wv·rms(x))           (GQA, causal)
//   router  x -> {hidden x (the residual, passed through), routed: normed hn = rms(x), top-k experts and weights}
//   experts {x, routed} -> x + unpermute(grouped SwiGLU experts(permute(hn)))
//   shared  x -> shared SwiGLU(rms(x))                       (no residual: experts carries it; own norm weight)
//   mlp     x -> x + SwiGLU(rms(x))                          (dense layers)
//   head    x -> loss = cross-entropy(Wout·rms(x), targets)
// Under tensor parallelism embed and head may hold a slice of the vocabulary's rows (tp_slice.h, VocabSlice).
// A chunk with several incoming hidden tensors (the layer after experts + shared) sums them in edge order.
// The backward direction carries Gradient messages along the reversed edges; a chunk with several consumers
// sums their gradients in edge order.
//
// Tasks: forward() returns the Stash kept until the backward; backward_input() (B) writes the gradient message
// for the producers and keeps what backward_weight() needs in the stash; backward_weight() (W) ACCUMULATES
// into the parameters' gradients, so microbatches add up. BW is B then W. The objective is the mean over the M
// microbatches of each microbatch's mean token loss (+ the routers' load-balance losses, also averaged), so
// the head's B uses dloss = 1 / M.
// Memory: stashed tensors are counted as activations, gradient messages and B->W intermediates as buffers, all
// through the allocator given at construction. Parameters were initialised from the seed by the Model.
// Thread-safety: tasks of different microbatches may run on different threads; the router's expert counters
// (aux-loss-free balancing) are the only shared mutable state and are guarded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/kernels/cpu/moe_reference.h"
#include "piper/spec/part.h"
#include "piper/tensor/tensor.h"

namespace piper::runtime {

// The part of a ModelSpec the chunks need, plus runtime choices.
struct ChunkDims {
  int64_t hidden = 0;
  int num_heads = 0, num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;         // dense MLP width
  int num_experts = 0, top_k = 0;
  int64_t expert_intermediate = 0;
  int num_shared_experts = 0;
  int64_t shared_intermediate = 0;  // per shared expert
  kernels::ScoreFunc router_score = kernels::ScoreFunc::kSoftmax;
  bool norm_topk = true;
  double routed_scaling = 1.0;
  bool expert_bias = false;       // DeepSeek's aux-loss-free balancing bias (updated after each step)
  double aux_loss_coef = 0.0;     // Switch-style load-balance loss weight (0 = off)
  double bias_update_rate = 1e-3; // bias step per optimizer step (expert_bias only)
  // Testing: a fixed selection-only preference for low-index experts (ModelOptions::router_skew).
  double router_skew = 0.0;
  int64_t vocab = 0;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  int num_layers = 0;
  // Expert parallelism: this rank's experts are [expert_begin, expert_begin + num_local_experts) of the
  // num_experts (0 local = all of them). Their weights are those experts' slices of the whole model's tensors.
  int expert_begin = 0;
  int num_local_experts = 0;
  int local_experts() const { return num_local_experts > 0 ? num_local_experts : num_experts; }
};

// One microbatch of token ids, [batch, seq] row-major.
struct Microbatch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
  int64_t batch = 0, seq = 0;
  int64_t num_tokens() const { return batch * seq; }
};

// Per-step context shared by every task.
struct StepContext {
  int num_microbatches = 1;
  Allocator* allocator = nullptr;
  bool recompute = false;  // this forward re-runs an earlier one before its backward (no step statistics)
  // Module recomputation (the plan's Instruction::recompute_norm / recompute_act): the forward drops its norm
  // output (router) or activation output (experts) and the backward recomputes it.
  bool recompute_norm = false;
  bool recompute_act = false;
  // Sequence parallelism: the task sees one of `token_shards` equal slices of the microbatch's tokens (the
  // others are on the other tensor-parallel ranks). The head scales its loss gradient by 1 / token_shards (the
  // objective is the mean over all slices); the router sums its balancing statistics over the slices with
  // `sum_over_shards` (every slice's task calls it at the same point; values are summed in place).
  int token_shards = 1;
  std::function<Status(double* values, int64_t count)> sum_over_shards = nullptr;
  // Vocabulary parallelism: a head split over tp (tp_slice.h) gathers its cross-entropy statistics from the tensor
  // ranks that hold the other rows of the vocabulary: gather_over_vocab(mine, all, count) writes every tensor
  // rank's `count` floats in rank order (all[r * count + i]). Every tensor rank's head calls it at the same point
  // of the same task. Null where the head is whole.
  std::function<Status(const float* mine, float* all, int64_t count)> gather_over_vocab = nullptr;
};

// Router -> experts: the normed input and the routing decision.
struct Routed {
  std::shared_ptr<const Tensor> normed;  // [n, h]
  std::vector<int32_t> topk_idx;         // [n, k]
  Tensor topk_w;                         // [n, k]
  kernels::Routing routing;
  // Module recomputation ("layernorm"): the router recomputes `normed` for its backward, so whoever keeps the
  // routing past the experts' forward keeps it through routing_only() and the norm output is freed.
  bool normed_recomputed = false;
};

// What a consumer of the router's message keeps for the backward: `r` itself, or, when the router recomputes its
// norm output, a copy of the routing without `normed` (so that the norm output lives only until it is consumed).
std::shared_ptr<const Routed> routing_only(const std::shared_ptr<const Routed>& r);

// Expert parallelism: routed rows exchanged over the ep group, in dispatch order (source rank, token, slot).
//   dispatch -> experts (F): rows = the normed tokens, expert = local expert of each row, weight = its routing weight
//   experts -> combine (F):  rows = the expert outputs (the combine weights them at the source)
//   combine -> experts (B):  rows = the (routed-scaled) output gradients, expert and weight as in the forward
//   experts -> dispatch (B): rows = the input gradients, dweight = d loss / d routing weight of each row
struct EpRows {
  std::shared_ptr<const Tensor> rows;  // [R, h]
  std::vector<int32_t> expert;         // [R]
  std::vector<float> weight;           // [R]
  std::vector<float> dweight;          // [R]
};

// Tensors on a forward data edge.
struct Activation {
  std::shared_ptr<const Tensor> hidden;  // [n, h]; null for the head (it produces only the loss)
  std::shared_ptr<const Routed> routed;  // router -> experts only
  std::shared_ptr<const EpRows> ep;      // expert parallelism: dispatch -> experts -> combine
};

// Tensors on a backward data edge (gradients of the Activation fields).
struct Gradient {
  std::shared_ptr<const Tensor> dhidden;
  std::shared_ptr<const Tensor> dnormed;  // experts -> router
  std::shared_ptr<const Tensor> dtopk_w;  // experts -> router
  std::shared_ptr<const EpRows> ep;       // expert parallelism: combine -> experts -> dispatch
};

// What a forward keeps for its backward. Chunks derive their own.
struct Stash {
  virtual ~Stash() = default;
  double loss = 0;      // head: mean token cross-entropy of the microbatch
  double aux_loss = 0;  // router: weighted load-balance loss of the microbatch (already divided by M)
};

// One parameter tensor (and its gradient). Non-trainable state (the router's balancing bias) has no grad.
struct Param {
  std::string name;  // "L1.attn.wq"
  Tensor value;
  Tensor grad;       // same shape; empty when !trainable
  bool trainable = true;
  bool decay = true;  // weight decay applies (not to norm weights)
  // A rank that holds only a slice of the whole model's tensor `name` (EP: its experts; TP: its heads or
  // columns) says where it lies: the whole tensor's shape and this slice's offset along each dimension (value's
  // shape is the extent). Both empty = the whole tensor. Checkpoints store and load tensors by (name, box), so
  // that a checkpoint written under one slicing loads under another (runtime/checkpoint/checkpoint.h).
  Shape global_shape;
  Shape global_offset;
  // A slice that is not one box of the whole tensor (TP's fused w_qkv: this rank's Q, K and V rows lie in three
  // separate row ranges of the whole) lists its row blocks instead: rows [row, row + rows) of value lie at
  // `offset` in the whole tensor of global_shape (global_offset is then unused). Empty = value is one box.
  struct RowBlock {
    int64_t row = 0, rows = 0;
    Shape offset;
  };
  std::vector<RowBlock> global_blocks;
};

// Rows [begin, end) of a microbatch's tokens ([batch, seq] row-major).
struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// A tensor-parallel chunk (attn, mlp, shared) run as row pieces under tp_overlap (docs/runtime.md, "tp_overlap"):
// its first GEMM runs per block of input rows as the all-gather delivers them, its last GEMM per block of output
// rows that a reduce-scatter piece takes. Every call of one task runs on one thread, in this order:
//   F: forward_begin, forward_in (once per row block, every row once), forward_rest, forward_out (every row once)
//   B: backward_begin, backward_in (every row once), backward_rest, backward_out (every row once)
// The row-wise parts: F in = norm + first GEMM (attn: QKV; mlp: gate and up), rest = what needs every row (attn:
// rotary and the attention core; mlp: the SwiGLU gate), out = last GEMM (attn: wo; mlp: down) + residual into
// y's rows. B in = the last GEMM's input gradient, rest = the core's backward, out = the first GEMM's input
// gradient + the norm's + residual into dx's rows. backward_weight() runs whole once B's pieces are done.
// forward_begin's `x` [n, h] may still be filling: forward_in reads only the rows it is given.
class PiecewiseChunk {
 public:
  virtual ~PiecewiseChunk() = default;
  virtual std::unique_ptr<Stash> forward_begin(const Microbatch& mb, std::shared_ptr<const Tensor> x) = 0;
  virtual void forward_in(Stash& stash, RowRange rows) = 0;
  virtual void forward_rest(Stash& stash) = 0;
  virtual void forward_out(Stash& stash, RowRange rows, Tensor* y) = 0;  // y: [n, h], the chunk's partial output
  virtual void backward_begin(Stash& stash, std::shared_ptr<const Tensor> dout) = 0;
  virtual void backward_in(Stash& stash, RowRange rows) = 0;
  virtual void backward_rest(Stash& stash) = 0;
  virtual void backward_out(Stash& stash, RowRange rows, Tensor* dx) = 0;  // dx: [n, h]
};

class Chunk {
 public:
  Chunk(Part part, int layer, const ChunkDims& dims, Allocator* allocator)
      : part_(part), layer_(layer), dims_(dims), allocator_(allocator) {}
  virtual ~Chunk() = default;
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  Part part() const { return part_; }
  int layer() const { return layer_; }
  // "embed", "head" or "L3.attn" (spec/part.h's chunk_name: checkpoint tensors are named by it).
  std::string name() const;
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }

  // Validates the inputs (count, shapes, token ids) and runs F.
  virtual Result<std::unique_ptr<Stash>> forward(const StepContext& ctx, const Microbatch& mb,
                                                 const std::vector<const Activation*>& inputs, Activation* out) = 0;
  // B: `grads` are the consumers' gradient messages (empty for the head). Writes *dx (empty for embed).
  virtual Status backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads, Stash& stash,
                                Gradient* dx) = 0;
  // W: accumulates parameter gradients and releases the B->W intermediates.
  virtual void backward_weight(const StepContext& ctx, Stash& stash) = 0;
  // The row pieces of this chunk (attn, mlp, shared), or null when it runs only whole.
  virtual PiecewiseChunk* piecewise() { return nullptr; }
  // After the optimizer step of this chunk (router: balancing-bias update). Default: nothing.
  virtual void after_update() {}
  // router with a balancing bias (moe.router_bias): the tokens per expert this rank routed since the last update,
  // which the executor replaces by their sum over the router's replicas before after_update (the bias follows the
  // whole batch's loads, as on one rank). Other chunks: empty.
  virtual std::vector<int64_t>* bias_counts() { return nullptr; }
  // experts: the rows (token slots) each of the num_experts experts received in forwards since the last call
  // (zero for experts this rank does not hold), then restarts the count. Other chunks: empty.
  virtual std::vector<int64_t> take_expert_tokens() { return {}; }

  // Zeroes every gradient (start of a step).
  void zero_grads();

 protected:
  // Adds a parameter initialised N(0, stddev) from (seed, name), or to `fill` when stddev == 0.
  // `offset`: the draw starts at element `offset` of the (seed, name) stream (a slice of a larger tensor).
  Tensor* add_param(const std::string& short_name, const Shape& shape, uint64_t seed, float stddev, float fill,
                    bool decay, bool trainable = true, uint64_t offset = 0);
  Tensor new_tensor(const Shape& shape, MemCategory category) const;
  std::shared_ptr<Tensor> new_shared(const Shape& shape, MemCategory category) const;
  // Contents unspecified: only for a kernel output that is written entirely before it is read (no memset).
  Tensor new_output(const Shape& shape, MemCategory category) const;
  std::shared_ptr<Tensor> new_shared_output(const Shape& shape, MemCategory category) const;

  Part part_;
  int layer_;
  ChunkDims dims_;
  Allocator* allocator_;
  std::vector<Param> params_;
};

// A chunk that runs whole as its own row pieces over every row (attn, mlp, shared): forward and backward_input
// call the PiecewiseChunk steps over [0, n), so the whole path and tp_overlap's split path are one code.
class RowPiecesChunk : public Chunk, public PiecewiseChunk {
 public:
  using Chunk::Chunk;
  PiecewiseChunk* piecewise() override { return this; }
  Result<std::unique_ptr<Stash>> forward(const StepContext& ctx, const Microbatch& mb,
                                         const std::vector<const Activation*>& inputs, Activation* out) override;
  Status backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads, Stash& stash,
                        Gradient* dx) override;

 protected:
  // The token rows of the microbatch whose forward made `stash`.
  virtual int64_t stash_rows(const Stash& stash) const = 0;
};

// Sums the hidden tensors of `inputs` in order (one input: shared, no copy; a sum is allocated like the first). Errors if there are none or a
// shape differs from [n, h].
Result<std::shared_ptr<const Tensor>> sum_hidden(const Chunk& chunk, const std::vector<const Activation*>& inputs,
                                                 int64_t n, int64_t h);
// Sums the dhidden tensors of `grads` in order (one: shared). Errors if none.
Result<std::shared_ptr<const Tensor>> sum_dhidden(const Chunk& chunk, const std::vector<const Gradient*>& grads,
                                                  int64_t n, int64_t h);

// The chunk for (part, layer); InvalidArgument for a part that is no chunk. Parameters are drawn from `seed`.
Result<std::unique_ptr<Chunk>> make_chunk(Part part, int layer, const ChunkDims& dims, uint64_t seed,
                                          Allocator* allocator);

}  // namespace piper::runtime
