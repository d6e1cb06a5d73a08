#include "piper/ir/build_graph.h"

#include <algorithm>
#include <map>

namespace piper::ir {
namespace {

struct ChunkSpec {
  std::string part;
  int layer;
  int64_t params;
  int64_t active_params;      // parameters touched per token (routed experts: top_k of them)
  int64_t activation_elems;   // per token, kept from F to the backward
};

int64_t attention_params(const ModelSpec& m) {
  const int64_t h = m.hidden_size;
  if (m.attention == AttentionType::kMLA) {
    const MlaSpec& a = m.mla;
    int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
    int64_t q = a.q_lora_rank > 0 ? h * a.q_lora_rank + a.q_lora_rank * m.num_heads * qk : h * m.num_heads * qk;
    int64_t kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) +
                 a.kv_lora_rank * m.num_heads * (a.qk_nope_head_dim + a.v_head_dim);
    return q + kv + m.num_heads * a.v_head_dim * h;
  }
  int64_t hd = m.head_dim > 0 ? m.head_dim : h / m.num_heads;
  return h * m.num_heads * hd * 2 + h * m.num_kv_heads * hd * 2;
}

int64_t mlp_params(const ModelSpec& m, int64_t width) { return (m.mlp == MlpType::kSwiGLU ? 3 : 2) * m.hidden_size * width; }

// Local copy of the element sizes so that the IR does not need piper_spec's object code.
int64_t elem_bytes(DType d) { return d == DType::kFP32 ? 4 : d == DType::kFP8 ? 1 : 2; }

bool moe_layer(const ModelSpec& m, int l) {
  if (m.moe.num_experts <= 0 || l < m.moe.first_k_dense_layers) return false;
  int freq = m.moe.layer_freq > 0 ? m.moe.layer_freq : 1;
  return (l - m.moe.first_k_dense_layers) % freq == 0;
}

}  // namespace

Result<Graph> build_graph(const ModelSpec& model, const TrainSpec& train, const MeshInfo& mesh) {
  if (model.num_layers < 1 || model.hidden_size < 1 || model.num_heads < 1 || model.vocab_size < 1) {
    return invalid_argument("build_graph: model '" + model.name +
                            "' needs num_layers, hidden_size, num_heads and vocab_size >= 1");
  }
  if (train.micro_batch_size < 1 || train.seq_len < 1) {
    return invalid_argument("build_graph: micro_batch_size and seq_len must be >= 1");
  }
  const int64_t h = model.hidden_size;
  const int64_t tokens = train.micro_batch_size * train.seq_len;
  const int64_t act_bytes = elem_bytes(train.activation_dtype);
  std::vector<ChunkSpec> chunks;
  chunks.push_back({"embed", 0, model.vocab_size * h, 0, h});
  for (int l = 0; l < model.num_layers; ++l) {
    int64_t attn = attention_params(model);
    chunks.push_back({"attn", l, attn, attn, 8 * h});
    if (moe_layer(model, l)) {
      const MoeSpec& e = model.moe;
      int64_t expert = mlp_params(model, e.expert_intermediate_size);
      chunks.push_back({"router", l, h * e.num_experts, h * e.num_experts, h});
      chunks.push_back({"experts", l, expert * e.num_experts, expert * e.top_k,
                        e.top_k * (h + 3 * e.expert_intermediate_size)});
      if (e.num_shared_experts > 0) {
        int64_t shared = mlp_params(model, e.shared_expert_intermediate_size) * e.num_shared_experts;
        chunks.push_back({"shared", l, shared, shared, h + 3 * e.shared_expert_intermediate_size});
      }
    } else {
      int64_t mlp = mlp_params(model, model.intermediate_size);
      chunks.push_back({"mlp", l, mlp, mlp, h + 3 * model.intermediate_size});
    }
  }
  int64_t head = model.tie_embeddings ? 0 : model.vocab_size * h;
  chunks.push_back({"head", model.num_layers - 1, head, model.vocab_size * h, model.vocab_size});

  Graph g;
  g.mesh = mesh;
  g.num_layers = model.num_layers;
  g.param_bytes = static_cast<int>(elem_bytes(train.param_dtype));
  g.grad_bytes = static_cast<int>(elem_bytes(train.grad_dtype));
  g.moe_top_k = std::max(1, model.moe.top_k);
  std::vector<NodeId> fwd, bwd;
  for (const ChunkSpec& c : chunks) {
    std::string base = (c.part == "embed" || c.part == "head") ? c.part : "L" + std::to_string(c.layer) + "." + c.part;
    auto add = [&](NodeKind kind, Pass pass, const char* suffix) {
      Node n;
      n.kind = kind;
      n.tags.layer = c.layer;
      n.tags.part = c.part;
      n.tags.pass = pass;
      n.name = base + "." + suffix;
      n.param_count = c.params;
      int64_t fwd_flops = 2 * tokens * c.active_params;
      if (c.part == "attn") fwd_flops += 2 * tokens * train.seq_len * model.num_heads * (model.head_dim > 0 ? model.head_dim : h / model.num_heads);
      if (pass == Pass::kF) {
        n.flops = fwd_flops;
        n.activation_bytes = tokens * c.activation_elems * act_bytes;
      } else if (pass == Pass::kBW) {
        n.flops = 2 * fwd_flops;
      }
      return g.add_node(std::move(n));
    };
    fwd.push_back(add(NodeKind::kChunk, Pass::kF, "F"));
    bwd.push_back(add(NodeKind::kChunk, Pass::kBW, "BW"));
    NodeId u = add(NodeKind::kUpdate, Pass::kU, "U");
    g.add_edge(bwd.back(), u, EdgeKind::kData, c.params * elem_bytes(train.grad_dtype));
    g.add_edge(fwd.back(), bwd.back(), EdgeKind::kData, tokens * c.activation_elems * act_bytes);
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
    if (chunks[i].part == "router") {
      size_t router = i++, experts = i++;
      link(attn, router);
      link(router, experts);
      prev.push_back(experts);
      if (i < chunks.size() && chunks[i].part == "shared" && chunks[i].layer == l) {
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
