#include "piper/cost/activations.h"

#include <algorithm>

namespace piper::cost {
namespace {

ActivationShape shape_of(const ActivationOptions& o) {
  ActivationShape a;
  a.seq_len = o.seq_len;
  a.act_bytes = o.act_bytes;
  a.dropout = o.dropout;
  a.flash_attention = o.flash_attention;
  a.etp = o.etp;
  a.recompute_moe_norm = o.recompute_moe_norm;
  a.recompute_moe_act = o.recompute_moe_act;
  return a;
}

// MoE FFN block per token, already divided by tp (tokens are split over TP ranks before dispatch).
double moe_bytes(const ModelSpec& m, const ActivationOptions& o) {
  const ActivationShape a = shape_of(o);
  return (moe_router_activation_per_token(m, a) + o.expert_load * moe_experts_activation_per_token(m, a) +
          moe_shared_activation_per_token(m, a)) /
         o.tp;
}

}  // namespace

LayerActivation layer_activation_peak_bytes_per_token(const ModelSpec& m, bool moe_layer, const ActivationOptions& o) {
  ActivationOptions none = o;
  none.recompute = Recompute::kNone;
  return layer_activation_bytes_per_token(m, moe_layer, none);
}

LayerActivation layer_activation_bytes_per_token(const ModelSpec& m, bool moe_layer, const ActivationOptions& o) {
  const double t = o.tp;
  const double rep_div = o.sp ? t : 1.0;
  LayerActivation out;
  if (o.recompute == Recompute::kFull) {
    const double h = static_cast<double>(m.hidden_size);
    out.norms = o.act_bytes * h / rep_div;  // the layer input
    if (!o.recompute_per_chunk) return out;
    out.attention = o.act_bytes * h / rep_div;  // the attention output: input of router/experts/shared/mlp
    if (moe_layer) {
      const double k = m.moe.top_k;
      double bytes = o.act_bytes * h + 8 * k;  // router's normed output (experts' input) and routing
      if (m.moe.num_shared_experts > 0) bytes += o.act_bytes * h;  // shared output, summed by the next layer
      out.mlp = bytes / t;
    }
    return out;
  }
  const ActivationShape a = shape_of(o);
  if (o.recompute == Recompute::kSelective && o.recompute_per_chunk) {
    // Piper's plan recomputes the whole attention chunk (projections and core) from its input, the norm input
    // already counted in `norms`; its stash is re-materialised one chunk at a time during the backward.
    out.attention = 0;
  } else {
    const BlockActivation attn = attention_activation_per_token(m, a, o.recompute == Recompute::kNone);
    out.attention = attn.whole / rep_div + attn.split / t;
  }
  if (moe_layer) {
    out.mlp = moe_bytes(m, o);
  } else {
    const BlockActivation mlp = dense_mlp_activation_per_token(m, a);
    out.mlp = mlp.whole / rep_div + mlp.split / t;
  }
  out.norms = 2 * norm_input_bytes_per_token(m, a) / rep_div;
  return out;
}

double layer_weight_grad_input_bytes_per_token(const ModelSpec& m, bool moe_layer, const ActivationOptions& o) {
  const WeightGradInputs w = weight_grad_inputs_per_token(m, shape_of(o), o.tp, o.sp);
  if (!moe_layer) return w.attention + w.dense_mlp;
  return w.attention + w.router + o.expert_load * w.experts_rows + w.shared;
}

double head_weight_grad_input_bytes_per_token(const ModelSpec& m, const ActivationOptions& o) {
  return weight_grad_inputs_per_token(m, shape_of(o), o.tp, o.sp).head;
}

double embedding_weight_grad_input_bytes_per_token(const ModelSpec& m, const ActivationOptions& o) {
  return weight_grad_inputs_per_token(m, shape_of(o), o.tp, o.sp).embedding;
}

LayerWorkingSet backward_working_set_bytes_per_token(const ModelSpec& m, const ActivationOptions& o) {
  const BackwardWorkingSet ws =
      backward_working_set_per_token(m, shape_of(o), o.tp, o.sp, o.expert_parallel, o.materialised_scores);
  LayerWorkingSet out;
  out.attention = ws.attention;
  out.dense_mlp = ws.dense_mlp;
  out.moe = m.is_moe() ? std::max({ws.router, ws.experts(o.expert_load), ws.shared}) : 0.0;
  out.head = ws.head;
  return out;
}

double head_activation_bytes_per_token(const ModelSpec& m, const ActivationOptions& o) {
  return head_activation_per_token(m) / o.tp;
}

double embedding_activation_bytes_per_token(const ModelSpec& m, const ActivationOptions& o) {
  const BlockActivation e = embedding_activation_per_token(m, shape_of(o));
  return kTokenIdBytes + e.whole / (o.sp ? o.tp : 1) + e.split / o.tp;
}

}  // namespace piper::cost
