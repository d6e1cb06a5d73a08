// attn: pre-norm causal GQA self-attention with rotary positions and the residual add.
// Like flash attention, the s x s probabilities are not stashed: B recomputes them from the stashed (rotated)
// q and k into a temporary buffer, so the stash matches the resource model (src/cost/activations.h).
#include "piper/kernels/cpu/ops.h"
#include "piper/runtime/chunks/parts.h"

namespace piper::runtime {
namespace {

struct AttnStash : Stash {
  int64_t batch = 0, seq = 0;
  std::shared_ptr<const Tensor> x;  // input (norm input)
  Tensor rstd, xn, q, k, v, o;      // q, k after rotary; o = attention output (out-projection input)
  // B -> W
  std::shared_ptr<const Tensor> dout;
  Tensor dq, dk, dv, dxn;
};

class AttnChunk : public Chunk {
 public:
  AttnChunk(int layer, const ChunkDims& d, uint64_t seed, Allocator* allocator) : Chunk("attn", layer, d, allocator) {
    const int64_t qd = d.num_heads * d.head_dim, kd = d.num_kv_heads * d.head_dim;
    add_param("norm", {d.hidden}, seed, 0.0f, 1.0f, false);
    add_param("wq", {qd, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("wk", {kd, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("wv", {kd, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("wo", {d.hidden, qd}, seed, residual_init_std(d), 0.0f, true);
  }

  Result<std::unique_ptr<Stash>> forward(const StepContext& ctx, const Microbatch& mb,
                                         const std::vector<const Activation*>& inputs, Activation* out) override {
    const int64_t n = mb.num_tokens(), h = dims_.hidden, qd = qdim(), kd = kdim();
    auto st = std::make_unique<AttnStash>();
    st->batch = mb.batch;
    st->seq = mb.seq;
    PIPER_ASSIGN_OR_RETURN(st->x, sum_hidden(*this, inputs, n, h, allocator_));
    st->rstd = new_tensor({n}, MemCategory::kActivations);
    st->xn = new_tensor({n, h}, MemCategory::kActivations);
    kernels::rmsnorm_forward(st->xn.data(), st->rstd.data(), st->x->data(), w(0), n, h, dims_.norm_eps);
    st->q = new_tensor({n, qd}, MemCategory::kActivations);
    st->k = new_tensor({n, kd}, MemCategory::kActivations);
    st->v = new_tensor({n, kd}, MemCategory::kActivations);
    kernels::linear_forward(st->q.data(), st->xn.data(), w(1), n, h, qd);
    kernels::linear_forward(st->k.data(), st->xn.data(), w(2), n, h, kd);
    kernels::linear_forward(st->v.data(), st->xn.data(), w(3), n, h, kd);
    kernels::rotary_forward(st->q.data(), st->q.data(), mb.batch, mb.seq, dims_.num_heads, dims_.head_dim,
                            dims_.rope_theta);
    kernels::rotary_forward(st->k.data(), st->k.data(), mb.batch, mb.seq, dims_.num_kv_heads, dims_.head_dim,
                            dims_.rope_theta);
    st->o = new_tensor({n, qd}, MemCategory::kActivations);
    {
      Tensor probs = new_tensor({mb.batch, dims_.num_heads, mb.seq, mb.seq}, MemCategory::kBuffers);
      kernels::attention_forward(st->o.data(), probs.data(), st->q.data(), st->k.data(), st->v.data(), shape(*st));
    }
    auto y = new_shared({n, h}, MemCategory::kActivations);
    kernels::linear_forward(y->data(), st->o.data(), w(4), n, qd, h);
    add_into(y->data(), y->data(), st->x->data(), n * h);
    out->hidden = std::move(y);
    return std::unique_ptr<Stash>(std::move(st));
  }

  Status backward_input(const StepContext& ctx, const std::vector<const Gradient*>& grads, Stash& stash,
                        Gradient* dx) override {
    auto& st = static_cast<AttnStash&>(stash);
    const int64_t n = st.batch * st.seq, h = dims_.hidden, qd = qdim(), kd = kdim();
    PIPER_ASSIGN_OR_RETURN(st.dout, sum_dhidden(*this, grads, n, h, allocator_));
    Tensor d_o = new_tensor({n, qd}, MemCategory::kBuffers);
    kernels::linear_backward_input(d_o.data(), st.dout->data(), w(4), n, qd, h);
    st.dq = new_tensor({n, qd}, MemCategory::kBuffers);
    st.dk = new_tensor({n, kd}, MemCategory::kBuffers);
    st.dv = new_tensor({n, kd}, MemCategory::kBuffers);
    {
      Tensor probs = new_tensor({st.batch, dims_.num_heads, st.seq, st.seq}, MemCategory::kBuffers);
      Tensor o2 = new_tensor({n, qd}, MemCategory::kBuffers);
      kernels::attention_forward(o2.data(), probs.data(), st.q.data(), st.k.data(), st.v.data(), shape(st));
      kernels::attention_backward_input(st.dq.data(), st.dk.data(), st.dv.data(), d_o.data(), st.q.data(),
                                        st.k.data(), st.v.data(), probs.data(), shape(st));
    }
    kernels::rotary_backward_input(st.dq.data(), st.dq.data(), st.batch, st.seq, dims_.num_heads, dims_.head_dim,
                                   dims_.rope_theta);
    kernels::rotary_backward_input(st.dk.data(), st.dk.data(), st.batch, st.seq, dims_.num_kv_heads,
                                   dims_.head_dim, dims_.rope_theta);
    st.dxn = new_tensor({n, h}, MemCategory::kBuffers);
    Tensor tmp = new_tensor({n, h}, MemCategory::kBuffers);
    kernels::linear_backward_input(st.dxn.data(), st.dq.data(), w(1), n, h, qd);
    kernels::linear_backward_input(tmp.data(), st.dk.data(), w(2), n, h, kd);
    add_into(st.dxn.data(), st.dxn.data(), tmp.data(), n * h);
    kernels::linear_backward_input(tmp.data(), st.dv.data(), w(3), n, h, kd);
    add_into(st.dxn.data(), st.dxn.data(), tmp.data(), n * h);
    auto dxt = new_shared({n, h}, MemCategory::kBuffers);
    kernels::rmsnorm_backward_input(dxt->data(), st.dxn.data(), st.x->data(), w(0), st.rstd.data(), n, h);
    add_into(dxt->data(), dxt->data(), st.dout->data(), n * h);
    dx->dhidden = std::move(dxt);
    return ok_status();
  }

  void backward_weight(const StepContext& ctx, Stash& stash) override {
    auto& st = static_cast<AttnStash&>(stash);
    const int64_t n = st.batch * st.seq, h = dims_.hidden, qd = qdim(), kd = kdim();
    kernels::rmsnorm_backward_weight(g(0), st.dxn.data(), st.x->data(), st.rstd.data(), n, h);
    kernels::linear_backward_weight(g(1), st.dq.data(), st.xn.data(), n, h, qd);
    kernels::linear_backward_weight(g(2), st.dk.data(), st.xn.data(), n, h, kd);
    kernels::linear_backward_weight(g(3), st.dv.data(), st.xn.data(), n, h, kd);
    kernels::linear_backward_weight(g(4), st.dout->data(), st.o.data(), n, qd, h);
    st.dout.reset();
    st.dq = Tensor();
    st.dk = Tensor();
    st.dv = Tensor();
    st.dxn = Tensor();
  }

 private:
  int64_t qdim() const { return dims_.num_heads * dims_.head_dim; }
  int64_t kdim() const { return dims_.num_kv_heads * dims_.head_dim; }
  const float* w(size_t i) const { return params_[i].value.data(); }
  float* g(size_t i) { return params_[i].grad.data(); }
  kernels::AttentionShape shape(const AttnStash& st) const {
    return {st.batch, st.seq, dims_.num_heads, dims_.num_kv_heads, dims_.head_dim};
  }
};

}  // namespace

std::unique_ptr<Chunk> make_attn_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator) {
  return std::make_unique<AttnChunk>(layer, dims, seed, allocator);
}

}  // namespace piper::runtime
