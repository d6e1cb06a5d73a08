// Activation bytes per token that one forward keeps for its backward, block by block, before any parallelism:
// the one formula shared by the closed form (cost/activations.h, which adds tensor parallelism and
// recomputation) and the compiled plan (ir/build_graph.cc, whose chunks are these blocks; the simulator's and
// the runtime's planned memory come from there). docs/resource_model.md "Activations" has the derivation
// (Korthikanti et al., arXiv:2205.05198, generalised to GQA/MLA, SwiGLU, flash attention and MoE).
//
// `whole` is the part every tensor-parallel rank keeps in full without sequence parallelism (a projection's
// replicated input, dropout masks); `split` is what tensor parallelism divides. A block's input norm is not in
// it: the norm inputs (one hidden state per norm) are counted by norm_input_bytes_per_token.
#pragma once

#include <cstdint>
#include <string>

#include "piper/spec/model_spec.h"

namespace piper {

struct ActivationShape {
  int64_t seq_len = 4096;
  double act_bytes = 2;         // activation dtype width
  bool dropout = false;         // 1-byte masks after attention, after the MLP and on the s x s probabilities
  bool flash_attention = true;  // fused attention: no s x s tensors, an fp32 log-sum-exp per head instead
  int etp = 1;                  // expert tensor parallelism: multiplies the experts' rows (gathered over etp)
  // Megatron's module recomputation (Strategy::recompute_modules): the MoE layer's pre-MLP norm output
  // ("layernorm") and the routed experts' activation output ("moe_act") are dropped and re-run.
  bool recompute_moe_norm = false;
  bool recompute_moe_act = false;
};

// Megatron's --recompute-modules names that the flags below model (Strategy::recompute_modules and the ir's
// RecomputeDirective::modules accept exactly these).
inline constexpr const char* kRecomputeModules[] = {"layernorm", "moe_act"};
bool is_recompute_module(const std::string& name);

struct BlockActivation {
  double whole = 0;
  double split = 0;
  double total() const { return whole + split; }
};

// Attention: the QKV input (MLA: the down-projection input, latents and decoupled RoPE key), Q, K, V, the
// out-projection input, the dropout mask; with keep_core also the core's own stash (log-sum-exp, or the s x s
// probabilities without flash attention).
BlockActivation attention_activation_per_token(const ModelSpec& m, const ActivationShape& a, bool keep_core);
// Dense MLP: the fc1 input (+ dropout mask) whole; GELU 2 and SwiGLU 3 tensors of the intermediate width split.
BlockActivation dense_mlp_activation_per_token(const ModelSpec& m, const ActivationShape& a);

// The MoE blocks, per token of the layer (tokens are split over tensor-parallel ranks as a whole):
// router: its input (the post-attention norm's output, also the experts' and shared experts' input; not with
// recompute_moe_norm), the fp32 router probabilities (E) and the fp32 routing weights of the chosen experts (k);
double moe_router_activation_per_token(const ModelSpec& m, const ActivationShape& a);
// routed experts: the dispatched tokens (k copies of h), their intermediates (GELU 2 / SwiGLU 3 tensors of the
// expert width; one fewer, the activation output, with recompute_moe_act) and outputs before the weighted
// combine (k copies of h), + the dropout mask. With expert tensor parallelism the rank computes its 1/etp of the
// expert width for the rows all etp ranks gathered: the h-wide rows count etp times, the intermediates once;
double moe_experts_activation_per_token(const ModelSpec& m, const ActivationShape& a);
// shared experts: their intermediates (their input is the router's).
double moe_shared_activation_per_token(const ModelSpec& m, const ActivationShape& a);

// One norm's input: a hidden state.
double norm_input_bytes_per_token(const ModelSpec& m, const ActivationShape& a);

// LM head and loss: Megatron's 4sbh(1 + V/h) (the fp32 final-norm input and logits), all split by vocabulary
// parallelism; embedding: its dropout mask (h bytes with dropout, else nothing) besides the int64 token ids,
// which every rank keeps (kTokenIdBytes).
constexpr double kTokenIdBytes = 8;
double head_activation_per_token(const ModelSpec& m);
BlockActivation embedding_activation_per_token(const ModelSpec& m, const ActivationShape& a);

// The working set of one chunk's backward on top of the activations it stashed, per token: the largest set of
// tensors live at once while B (and W, fused with it) runs, as Piper's runtime allocates them
// (runtime/model/chunks): the incoming output gradient, the gradients of the chunk's GEMM outputs and the input
// gradient it returns. Attention: dout + the larger of {d_o, dq dk dv, the recomputed probabilities H·s (with
// materialised scores)}, {dq dk dv, dqkv, dxn} and {dqkv, dxn, dx}; dense MLP and shared experts: dout, dxn, dx
// 3h + the gate/up gradients; router: the experts' three gradients (dhidden, dnormed, dtopk_w), dlogits, dhn, dx;
// routed experts: per routed row (k per token, etp times the rows of 1/etp the width under expert tensor
// parallelism) dyp, dxp and the gate/up gradients (+ the gradient row returned over the all-to-all under ep), and
// per token dout and dhn without ep, the residual's gradient with it; head: dxn, dx 2h + the fp32 logits gradient.
// Under tensor parallelism (tp) the sharded widths are divided by tp, the MoE terms (tokens split over tp) by
// tp, the hidden-width terms by tp with sequence parallelism (sp) only. The routed experts' per-row part is at the
// mean rank's load: multiply experts_rows by the rank's load.
struct BackwardWorkingSet {
  double attention = 0, dense_mlp = 0, router = 0, experts_token = 0, experts_rows = 0, shared = 0, head = 0;
  double experts(double load) const { return experts_token + load * experts_rows; }
};
BackwardWorkingSet backward_working_set_per_token(const ModelSpec& m, const ActivationShape& a, int tp, bool sp,
                                                  bool expert_parallel, bool materialised_scores);

// B -> W: with a split backward the weight-gradient task W needs the gradients of the outputs of every
// weight-bearing op, so B's results live until W. Per token, by chunk: attention: the pre-norm output grad h, the
// QKV output grads (q + k + v widths; MLA also its latents), the out-projection output grad h; dense MLP: norm
// output grad h, output grad h, gate/up output grads (2f SwiGLU, f GELU); router: norm output grad h and the fp32
// logits grad E; routed experts per routed row at the mean rank's load: the output grad h (k h etp under expert
// tensor parallelism: the etp group's rows) and the gate/up grads (etp times the rows of 1/etp the width: k f_e);
// shared experts like a dense MLP; head: the fp32 logits grad V and the final-norm output grad h; embedding: its
// output grad h. Divided as the working set above (MoE terms by tp, hidden widths by tp with sp only).
struct WeightGradInputs {
  double attention = 0, dense_mlp = 0, router = 0, experts_rows = 0, shared = 0, head = 0, embedding = 0;
};
WeightGradInputs weight_grad_inputs_per_token(const ModelSpec& m, const ActivationShape& a, int tp, bool sp);

}  // namespace piper
