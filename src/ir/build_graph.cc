#include "piper/ir/build_graph.h"

#include <algorithm>
#include <cmath>

#include "piper/base/checked_math.h"
#include "piper/spec/activation_counting.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/counting.h"
#include "piper/spec/part.h"

namespace piper::ir {
namespace {

// Parameter counts come from piper_spec (counting.h), the one source of truth shared with `piper info` and
// the resource model; the norms are attached to the chunk that applies them (input norm -> attn, post-attention
// norm -> router or mlp, final norm -> head), so the chunks' parameters add up to count_params(model).total().
// FLOPs: 2 per matmul weight a token touches; the attention chunk also carries the attention core, so the F
// FLOPs of all chunks add up to forward_flops_per_token(model, seq) per token.
struct ChunkSpec {
  Part part;  // tagged by its name (chunk_name: spec/part.h)
  int layer;
  int64_t params;
  double flops_per_token;  // forward
  BlockActivation act;     // bytes per token kept from F to the backward (whole: not split by tp without sp)
  double checkpoint = 0;   // bytes per token a recomputed F keeps: its input
  // Of `act`, what module recomputation drops (RecomputeDirective::modules): the pre-MLP norm output (router,
  // whole) and the experts' activation output.
  double norm_output = 0;
  double act_output = 0;
  double scratch = 0;      // bytes per token of the backward's working set (backward_working_set_per_token)
  double weight_grad = 0;  // bytes per token B leaves for W under a split backward (weight_grad_inputs_per_token)
};

double scratch_of(Part part, const BackwardWorkingSet& ws, double expert_load) {
  switch (part) {
    case Part::kAttention:
      return ws.attention;
    case Part::kDenseMlp:
      return ws.dense_mlp;
    case Part::kRouter:
      return ws.router;
    case Part::kExperts:
      return ws.experts(expert_load);
    case Part::kSharedExperts:
      return ws.shared;
    case Part::kHead:
      return ws.head;
    default:
      return 0.0;  // the embedding's backward adds its input gradient into the table's rows
  }
}

double weight_grad_of(Part part, const WeightGradInputs& w, double expert_load) {
  switch (part) {
    case Part::kEmbedding:
      return w.embedding;
    case Part::kAttention:
      return w.attention;
    case Part::kDenseMlp:
      return w.dense_mlp;
    case Part::kRouter:
      return w.router;
    case Part::kExperts:
      return expert_load * w.experts_rows;
    case Part::kSharedExperts:
      return w.shared;
    case Part::kHead:
      return w.head;
    default:
      return 0.0;
  }
}

// Of a chunk's parameters, those whose gradient is a partial sum over tp when the chunk is split over tp: the
// tensors it keeps whole that sit behind the split GEMMs' input gradient, which the tp collectives outside the chunk
// sum only after the chunk's backward (Piper's chunks hold their norm; Megatron-LM sums the same norm weights under
// sequence parallelism): the norm (weight and bias) and a QK norm over the head dimension (each rank's heads only).
// The column-parallel biases, the sinks and a full QK norm split with the heads or units; an output bias or learned
// positions get the whole gradient on every tensor rank.
int64_t tp_whole_params(Part part, const ModelSpec& m) {
  switch (part) {
    case Part::kAttention:
      return norm_params(m) + (m.qk_norm && !m.qk_norm_full ? 2 * m.head_dim : 0);
    case Part::kDenseMlp:
    case Part::kSharedExperts:  // the runtime's shared experts normalise their input with a norm of their own
    case Part::kHead:
      return norm_params(m);
    default:
      return 0;  // the split embedding holds only its vocabulary rows; router and experts are never split over tp
  }
}

// Bytes per parameter the optimizer holds: the fp32 master copy when the parameters are not it, and its state
// buffers (spec::optimizer_state_buffers), as cost::ByteConvention counts them.
Result<int> optimizer_bytes(const TrainSpec& train) {
  const int master = train.master_dtype == train.param_dtype ? 0 : dtype_bytes(train.master_dtype);
  Result<int> buffers = optimizer_state_buffers(train.optimizer);
  if (!buffers.ok()) return buffers.status().with_context("build_graph");
  return master + *buffers * dtype_bytes(train.optimizer_dtype);
}

}  // namespace

Result<Graph> build_graph(const ModelSpec& model, const TrainSpec& train, const MeshInfo& mesh, double expert_load,
                          bool materialised_scores) {
  if (model.num_layers < 1 || model.hidden_size < 1 || model.num_heads < 1 || model.vocab_size < 1) {
    return invalid_argument("build_graph: model '" + model.name +
                            "' needs num_layers, hidden_size, num_heads and vocab_size >= 1");
  }
  if (!(expert_load > 0 && std::isfinite(expert_load))) {
    return invalid_argument("build_graph: expert_load = " + std::to_string(expert_load) +
                            " must be a positive number (1 = balanced experts)");
  }
  if (train.micro_batch_size < 1 || train.seq_len < 1) {
    return invalid_argument("build_graph: micro_batch_size and seq_len must be >= 1");
  }
  const int64_t h = model.hidden_size;
  const int64_t tokens = train.micro_batch_size * train.seq_len;
  // Edges carry activations in the wire dtype (bf16 under the fp8 recipes); the stash is activation_bytes().
  const int64_t act_bytes = std::llround(train.comm_bytes());
  const ParamCounts counts = count_params(model);
  const int64_t norm = norm_params(model);
  // Activations as the closed form counts them (spec/activation_counting.h, flash attention, no dropout): the
  // attention chunk keeps its norm's input and the attention block, the router the post-attention norm's input
  // and its own, the experts and shared experts theirs. A recomputed chunk keeps its input: the layer input
  // (attn), the attention output (router, mlp), the router's normed output and routing (k int32 indices and
  // k fp32 weights: experts), the shared experts' output (summed by the next layer), as Piper's runtime does.
  ActivationShape shape;
  shape.seq_len = train.seq_len;
  shape.act_bytes = train.activation_bytes();
  ActivationShape recompute_norm = shape, recompute_act = shape;
  recompute_norm.recompute_moe_norm = true;
  recompute_act.recompute_moe_act = true;
  const double hidden = norm_input_bytes_per_token(model, shape);
  BlockActivation attn_act = attention_activation_per_token(model, shape, true);
  attn_act.whole += hidden;
  std::vector<ChunkSpec> chunks;
  chunks.push_back({Part::kEmbedding,
                    0,
                    counts.embedding.total,
                    0.0,
                    {kTokenIdBytes + embedding_activation_per_token(model, shape).whole, 0},
                    kTokenIdBytes});
  for (int l = 0; l < model.num_layers; ++l) {
    const size_t attn = chunks.size();
    chunks.push_back({Part::kAttention, l, attention_params(model) + norm, 0.0, attn_act, hidden});
    double ffn_weights = 0;  // matmul weights one token touches after attention
    if (model.is_moe_layer(l)) {
      const MoeSpec& e = model.moe;
      const double router = static_cast<double>(h) * e.num_experts;
      const double experts = static_cast<double>(e.top_k) * mlp_params(model, e.expert_intermediate_size, false);
      const double router_act = moe_router_activation_per_token(model, shape);
      const double experts_act = expert_load * moe_experts_activation_per_token(model, shape);
      chunks.push_back({Part::kRouter,
                        l,
                        router_params(model) + norm,
                        2 * router,
                        {hidden + router_act, 0},
                        hidden,
                        router_act - moe_router_activation_per_token(model, recompute_norm)});
      chunks.push_back({Part::kExperts,
                        l,
                        e.num_experts * expert_params(model),
                        2 * experts,
                        {0, experts_act},
                        hidden + 8.0 * e.top_k,
                        0,
                        experts_act - expert_load * moe_experts_activation_per_token(model, recompute_act)});
      ffn_weights = router + experts;
      if (e.num_shared_experts > 0) {
        const double shared =
            static_cast<double>(e.num_shared_experts) * mlp_params(model, e.shared_expert_intermediate_size, false);
        chunks.push_back({Part::kSharedExperts,
                          l,
                          shared_experts_params(model),
                          2 * shared,
                          {0, moe_shared_activation_per_token(model, shape)},
                          hidden});
        ffn_weights += shared;
      }
    } else {
      const double mlp = static_cast<double>(mlp_params(model, model.intermediate_size, false));
      BlockActivation mlp_act = dense_mlp_activation_per_token(model, shape);
      mlp_act.whole += hidden;
      chunks.push_back({Part::kDenseMlp, l, dense_mlp_params(model) + norm, 2 * mlp, mlp_act, hidden});
      ffn_weights = mlp;
    }
    // Attention projections and core: the layer's forward FLOPs minus what the FFN side does.
    chunks[attn].flops_per_token = layer_forward_flops_per_token(model, l, train.seq_len) - 2 * ffn_weights;
  }
  chunks.push_back({Part::kHead,
                    model.num_layers - 1,
                    counts.head.total + norm,
                    2.0 * static_cast<double>(model.vocab_size) * static_cast<double>(h),
                    {0, head_activation_per_token(model)},
                    hidden});

  ActivationShape ws_shape = shape;
  ws_shape.etp = std::max(1, mesh.etp);
  const BackwardWorkingSet ws =
      backward_working_set_per_token(model, ws_shape, 1, false, mesh.ep > 1, materialised_scores);
  const WeightGradInputs wg = weight_grad_inputs_per_token(model, ws_shape, 1, false);
  for (ChunkSpec& c : chunks) {
    c.scratch = scratch_of(c.part, ws, expert_load);
    c.weight_grad = weight_grad_of(c.part, wg, expert_load);
  }

  // Every count below is a per-token value times the microbatch's tokens, rounded to int64: checked once here
  // (checked_math.h), so no node gets a wrapped or undefined FLOP or byte count (the backward's 2x included).
  for (const ChunkSpec& c : chunks) {
    const double t = static_cast<double>(tokens);
    for (double v :
         {3 * c.flops_per_token * t, c.act.total() * t, c.checkpoint * t, c.scratch * t, c.weight_grad * t}) {
      if (!checked_llround(v).has_value()) {
        return invalid_argument("build_graph: layer " + std::to_string(c.layer) + " " + chunk_name(c.part) +
                                " of model '" + model.name +
                                "' with micro_batch_size*seq_len = " + std::to_string(tokens) +
                                " tokens needs more than 2^63 FLOPs or bytes per microbatch; lower micro_batch_size or "
                                "seq_len");
      }
    }
  }
  if (!checked_mul(tokens, h).has_value() || !checked_mul(tokens * h, act_bytes).has_value()) {
    return invalid_argument(
        "build_graph: micro_batch_size*seq_len*hidden_size overflows int64 bytes; lower "
        "micro_batch_size or seq_len");
  }
  Graph g;
  g.mesh = mesh;
  g.num_layers = model.num_layers;
  g.param_bytes = dtype_bytes(train.param_dtype);
  g.grad_bytes = dtype_bytes(train.grad_dtype);
  PIPER_ASSIGN_OR_RETURN(g.optimizer_bytes, optimizer_bytes(train));
  g.moe_top_k = std::max(1, model.moe.top_k);
  g.moe_dispatch_ratio = train.dispatch_bytes() / train.comm_bytes();
  std::vector<NodeId> fwd, bwd;
  for (const ChunkSpec& c : chunks) {
    const std::string name = chunk_name(c.part);
    std::string base =
        (c.part == Part::kEmbedding || c.part == Part::kHead) ? name : "L" + std::to_string(c.layer) + "." + name;
    auto add = [&](NodeKind kind, Pass pass, const char* suffix) {
      Node n;
      n.kind = kind;
      n.tags.layer = c.layer;
      n.tags.part = name;
      n.tags.pass = pass;
      n.name = base + "." + suffix;
      n.param_count = c.params;
      n.tp_whole_params = tp_whole_params(c.part, model);
      const auto fwd_flops = static_cast<int64_t>(std::llround(c.flops_per_token * static_cast<double>(tokens)));
      if (pass == Pass::kF) {
        n.flops = fwd_flops;
        auto bytes = [&](double per_token) {
          return static_cast<int64_t>(std::llround(per_token * static_cast<double>(tokens)));
        };
        n.activation_bytes = bytes(c.act.total());
        n.activation_whole_bytes = bytes(c.act.whole);
        n.checkpoint_bytes = bytes(c.checkpoint);
        n.norm_output_bytes = bytes(c.norm_output);
        n.act_output_bytes = bytes(c.act_output);
      } else if (pass == Pass::kBW) {
        n.flops = 2 * fwd_flops;
        n.backward_scratch_bytes = static_cast<int64_t>(std::llround(c.scratch * static_cast<double>(tokens)));
        n.weight_grad_bytes = static_cast<int64_t>(std::llround(c.weight_grad * static_cast<double>(tokens)));
      }
      return g.add_node(std::move(n));
    };
    fwd.push_back(add(NodeKind::kChunk, Pass::kF, "F"));
    bwd.push_back(add(NodeKind::kChunk, Pass::kBW, "BW"));
    NodeId u = add(NodeKind::kUpdate, Pass::kU, "U");
    g.add_edge(bwd.back(), u, EdgeKind::kData, c.params * g.grad_bytes);
    g.add_edge(fwd.back(), bwd.back(), EdgeKind::kData, g.node(fwd.back()).activation_bytes);
  }
  // Forward data flow; the backward mirrors it. A MoE layer's router feeds experts; experts and shared both
  // read the attention output and feed the next layer.
  const int64_t hidden_bytes = tokens * h * act_bytes;
  auto link = [&](size_t a, size_t b) {
    g.add_edge(fwd[a], fwd[b], EdgeKind::kData, hidden_bytes);
    g.add_edge(bwd[b], bwd[a], EdgeKind::kData, hidden_bytes);
  };
  std::vector<size_t> prev = {0};  // chunks whose output feeds the next layer
  size_t i = 1;
  for (int l = 0; l < model.num_layers; ++l) {
    size_t attn = i++;
    for (size_t p : prev) link(p, attn);
    prev.clear();
    if (chunks[i].part == Part::kRouter) {
      size_t router = i++, experts = i++;
      link(attn, router);
      link(router, experts);
      prev.push_back(experts);
      if (i < chunks.size() && chunks[i].part == Part::kSharedExperts && chunks[i].layer == l) {
        link(attn, i);
        prev.push_back(i++);
      }
    } else {
      link(attn, i);
      prev.push_back(i++);
    }
  }
  for (size_t p : prev) link(p, i);
  return g;
}

}  // namespace piper::ir
