#include "piper/runtime/model/model.h"

namespace piper::runtime {
namespace {

Status unsupported(const ModelSpec& m, const std::string& feature) {
  return invalid_argument("model '" + m.name + "' uses " + feature +
                          ", which the CPU runtime's chunks do not implement; they support standard attention with "
                          "RoPE, RMSNorm, SwiGLU MLPs and experts, softmax/sigmoid top-k routers and an untied head");
}

}  // namespace

Result<ChunkDims> runtime_dims(const ModelSpec& m, const ModelOptions& o) {
  PIPER_RETURN_IF_ERROR(m.validate());
  if (m.attention != AttentionType::kStandard) return unsupported(m, "MLA attention");
  if (m.qk_norm || m.qk_norm_full) return unsupported(m, "QK-norm");
  if (m.attention_bias) return unsupported(m, "attention biases");
  if (m.attention_sinks) return unsupported(m, "attention sinks");
  if (m.sliding_window > 0) return unsupported(m, "sliding-window attention");
  if (m.mlp != MlpType::kSwiGLU) return unsupported(m, "a GELU MLP");
  if (m.mlp_bias) return unsupported(m, "MLP biases");
  if (m.tie_embeddings) return unsupported(m, "tied embeddings");
  if (m.norm != NormType::kRMSNorm) return unsupported(m, "LayerNorm");
  if (m.learned_positions) return unsupported(m, "learned position embeddings");
  if (m.head_dim % 2 != 0) return unsupported(m, "an odd head_dim (RoPE needs an even one)");
  if (m.is_moe()) {
    if (m.moe.expert_bias) return unsupported(m, "expert biases");
    if (m.moe.num_groups > 1) return unsupported(m, "group-limited routing");
  }
  ChunkDims d;
  d.hidden = m.hidden_size;
  d.num_heads = m.num_heads;
  d.num_kv_heads = m.num_kv_heads > 0 ? m.num_kv_heads : m.num_heads;
  d.head_dim = m.head_dim > 0 ? m.head_dim : m.hidden_size / m.num_heads;
  d.intermediate = m.intermediate_size;
  d.num_experts = m.moe.num_experts;
  d.top_k = m.moe.top_k;
  d.expert_intermediate = m.moe.expert_intermediate_size;
  d.num_shared_experts = m.moe.num_shared_experts;
  d.shared_intermediate = m.moe.shared_expert_intermediate_size;
  d.router_score = m.moe.router == RouterType::kSigmoid ? kernels::ScoreFunc::kSigmoid : kernels::ScoreFunc::kSoftmax;
  d.norm_topk = m.moe.norm_topk_prob;
  d.routed_scaling = m.moe.routed_scaling_factor;
  d.expert_bias = m.moe.router_bias;
  d.aux_loss_coef = m.moe.router_bias ? 0.0 : o.aux_loss_coef;
  d.bias_update_rate = o.bias_update_rate;
  if (!(o.router_skew >= 0.0)) {
    return invalid_argument("router skew must be >= 0 (a preference for low-index experts), got " +
                            std::to_string(o.router_skew));
  }
  if (o.router_skew > 0.0 && !m.is_moe()) {
    return invalid_argument("model '" + m.name + "' has no experts to skew the routing of; drop the router skew");
  }
  d.router_skew = o.router_skew;
  d.vocab = m.vocab_size;
  d.rope_theta = m.rope_theta;
  d.num_layers = m.num_layers;
  if (o.expert_ranks > 1 || o.expert_rank != 0) {
    if (!m.is_moe() || o.expert_ranks < 1 || m.moe.num_experts % o.expert_ranks != 0 || o.expert_rank < 0 ||
        o.expert_rank >= o.expert_ranks) {
      return invalid_argument("model '" + m.name + "': expert rank " + std::to_string(o.expert_rank) + " of " +
                              std::to_string(o.expert_ranks) + " does not split its " +
                              std::to_string(m.moe.num_experts) + " experts evenly; pick ep dividing num_experts");
    }
    d.num_local_experts = m.moe.num_experts / o.expert_ranks;
    d.expert_begin = o.expert_rank * d.num_local_experts;
  }
  return d;
}

Result<std::unique_ptr<Model>> Model::create(const ModelSpec& spec, const ModelOptions& options, uint64_t seed,
                                             Allocator* allocator) {
  return create(spec, options, seed, allocator, [](int, Part) { return true; });
}

Result<std::unique_ptr<Model>> Model::create(const ModelSpec& spec, const ModelOptions& options, uint64_t seed,
                                             Allocator* allocator, const KeepFn& keep) {
  auto model = std::unique_ptr<Model>(new Model());
  PIPER_ASSIGN_OR_RETURN(model->dims_, runtime_dims(spec, options));
  auto add = [&](Part part, int layer) -> Status {
    if (!keep(layer, part)) return ok_status();
    PIPER_ASSIGN_OR_RETURN(auto chunk, make_chunk(part, layer, model->dims_, seed, allocator));
    model->chunks_.push_back(std::move(chunk));
    return ok_status();
  };
  PIPER_RETURN_IF_ERROR(add(Part::kEmbedding, 0));
  for (int l = 0; l < spec.num_layers; ++l) {
    PIPER_RETURN_IF_ERROR(add(Part::kAttention, l));
    if (spec.is_moe_layer(l)) {
      PIPER_RETURN_IF_ERROR(add(Part::kRouter, l));
      PIPER_RETURN_IF_ERROR(add(Part::kExperts, l));
      if (spec.moe.num_shared_experts > 0) PIPER_RETURN_IF_ERROR(add(Part::kSharedExperts, l));
    } else {
      PIPER_RETURN_IF_ERROR(add(Part::kDenseMlp, l));
    }
  }
  PIPER_RETURN_IF_ERROR(add(Part::kHead, spec.num_layers - 1));
  return model;
}

Chunk* Model::find(int layer, std::optional<Part> part) const {
  for (const auto& c : chunks_) {
    if (c->layer() == layer && c->part() == part) return c.get();
  }
  return nullptr;
}

Status Model::replace_chunk(std::unique_ptr<Chunk> chunk) {
  for (auto& c : chunks_) {
    if (c->layer() == chunk->layer() && c->part() == chunk->part()) {
      c = std::move(chunk);
      return ok_status();
    }
  }
  return invalid_argument("model: no chunk " + chunk->name() + " to replace");
}

std::vector<Param*> Model::params() const {
  std::vector<Param*> out;
  for (const auto& c : chunks_) {
    for (Param& p : c->params()) out.push_back(&p);
  }
  return out;
}

int64_t Model::num_params() const {
  int64_t n = 0;
  for (const Param* p : params()) n += p->trainable ? p->value.numel() : 0;
  return n;
}

void Model::zero_grads() {
  for (const auto& c : chunks_) c->zero_grads();
}

}  // namespace piper::runtime
