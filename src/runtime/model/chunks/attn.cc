// attn: pre-norm causal GQA self-attention with rotary positions and the residual add. Q, K and V come from one
// fused projection (w_qkv = [Wq; Wk; Wv], one GEMM forward and one per backward task instead of three).
// Like flash attention, the s x s probabilities are not stashed: B recomputes them from the stashed (rotated)
// q and k into a temporary buffer, so the stash matches the resource model (src/cost/activations.h).
#include <algorithm>

#include "piper/kernels/cpu/ops.h"
#include "piper/runtime/model/chunks/parts.h"

namespace piper::runtime {
namespace {

struct AttnStash : Stash {
  int64_t batch = 0, seq = 0;
  std::shared_ptr<const Tensor> x;  // input (norm input)
  Tensor rstd, xn, q, k, v, o;      // q, k after rotary; o = attention output (out-projection input)
  // B -> W
  std::shared_ptr<const Tensor> dout;
  Tensor dqkv, dxn;  // dqkv = [dq | dk | dv] per token (before rotary for q, k)
  Tensor d_o;        // B, from backward_in to backward_rest: the out-projection's input gradient
};

class AttnChunk : public RowPiecesChunk {
 public:
  AttnChunk(int layer, const ChunkDims& d, uint64_t seed, Allocator* allocator, bool residual)
      : RowPiecesChunk(Part::kAttention, layer, d, allocator), residual_(residual) {
    const int64_t qd = d.num_heads * d.head_dim, kd = d.num_kv_heads * d.head_dim;
    add_param("norm", {d.hidden}, seed, 0.0f, 1.0f, false);
    add_param("w_qkv", {qd + 2 * kd, d.hidden}, seed, init_std(), 0.0f, true);
    add_param("wo", {d.hidden, qd}, seed, residual_init_std(d), 0.0f, true);
  }

  // Run whole, as its pieces over every row (RowPiecesChunk).
  int64_t stash_rows(const Stash& stash) const override {
    const auto& st = static_cast<const AttnStash&>(stash);
    return st.batch * st.seq;
  }

  std::unique_ptr<Stash> forward_begin(const Microbatch& mb, std::shared_ptr<const Tensor> x) override {
    const int64_t n = mb.num_tokens(), h = dims_.hidden;
    auto st = std::make_unique<AttnStash>();
    st->batch = mb.batch;
    st->seq = mb.seq;
    st->x = std::move(x);
    st->rstd = new_output({n}, MemCategory::kActivations);
    st->xn = new_output({n, h}, MemCategory::kActivations);
    st->q = new_output({n, qdim()}, MemCategory::kActivations);
    st->k = new_output({n, kdim()}, MemCategory::kActivations);
    st->v = new_output({n, kdim()}, MemCategory::kActivations);
    return st;
  }

  // Norm and the QKV projection of `rows`.
  void forward_in(Stash& stash, RowRange r) override {
    auto& st = static_cast<AttnStash&>(stash);
    const int64_t h = dims_.hidden, w = qdim() + 2 * kdim();
    if (r.size() == 0) return;
    kernels::rmsnorm_forward(st.xn.data() + r.begin * h, st.rstd.data() + r.begin, st.x->data() + r.begin * h,
                             this->w(0), r.size(), h, dims_.norm_eps);
    Tensor qkv = new_output({r.size(), w}, MemCategory::kBuffers);
    kernels::linear_forward(qkv.data(), st.xn.data() + r.begin * h, this->w(1), r.size(), h, w);
    unpack(qkv, &st.q, &st.k, &st.v, r);
  }

  // Rotary and the attention core: every row.
  void forward_rest(Stash& stash) override {
    auto& st = static_cast<AttnStash&>(stash);
    kernels::rotary_forward(st.q.data(), st.q.data(), st.batch, st.seq, dims_.num_heads, dims_.head_dim,
                            dims_.rope_theta);
    kernels::rotary_forward(st.k.data(), st.k.data(), st.batch, st.seq, dims_.num_kv_heads, dims_.head_dim,
                            dims_.rope_theta);
    st.o = new_output({st.batch * st.seq, qdim()}, MemCategory::kActivations);
    Tensor probs = new_output({st.batch, dims_.num_heads, st.seq, st.seq}, MemCategory::kBuffers);
    kernels::attention_forward(st.o.data(), probs.data(), st.q.data(), st.k.data(), st.v.data(), shape(st));
  }

  // The out-projection (and the residual) of `rows` into y.
  void forward_out(Stash& stash, RowRange r, Tensor* y) override {
    auto& st = static_cast<AttnStash&>(stash);
    const int64_t h = dims_.hidden;
    if (r.size() == 0) return;
    float* yr = y->data() + r.begin * h;
    kernels::linear_forward(yr, st.o.data() + r.begin * qdim(), w(2), r.size(), qdim(), h);
    if (residual_) add_into(yr, yr, st.x->data() + r.begin * h, r.size() * h);
  }

  void backward_begin(Stash& stash, std::shared_ptr<const Tensor> dout) override {
    auto& st = static_cast<AttnStash&>(stash);
    st.dout = std::move(dout);
    st.d_o = new_output({st.batch * st.seq, qdim()}, MemCategory::kBuffers);
  }

  // The out-projection's input gradient of `rows`.
  void backward_in(Stash& stash, RowRange r) override {
    auto& st = static_cast<AttnStash&>(stash);
    if (r.size() == 0) return;
    kernels::linear_backward_input(st.d_o.data() + r.begin * qdim(), st.dout->data() + r.begin * dims_.hidden, w(2),
                                   r.size(), qdim(), dims_.hidden);
  }

  // The attention core's and rotary's backward: every row.
  void backward_rest(Stash& stash) override {
    auto& st = static_cast<AttnStash&>(stash);
    const int64_t n = st.batch * st.seq, qd = qdim(), kd = kdim();
    Tensor dq = new_output({n, qd}, MemCategory::kBuffers);
    Tensor dk = new_output({n, kd}, MemCategory::kBuffers);
    Tensor dv = new_output({n, kd}, MemCategory::kBuffers);
    {
      Tensor probs = new_output({st.batch, dims_.num_heads, st.seq, st.seq}, MemCategory::kBuffers);
      kernels::attention_probs(probs.data(), st.q.data(), st.k.data(), shape(st));
      kernels::attention_backward_input(dq.data(), dk.data(), dv.data(), st.d_o.data(), st.q.data(), st.k.data(),
                                        st.v.data(), probs.data(), shape(st));
    }
    st.d_o = Tensor();
    kernels::rotary_backward_input(dq.data(), dq.data(), st.batch, st.seq, dims_.num_heads, dims_.head_dim,
                                   dims_.rope_theta);
    kernels::rotary_backward_input(dk.data(), dk.data(), st.batch, st.seq, dims_.num_kv_heads, dims_.head_dim,
                                   dims_.rope_theta);
    st.dqkv = new_output({n, qd + 2 * kd}, MemCategory::kBuffers);
    pack(dq, dk, dv, &st.dqkv, n);
    st.dxn = new_output({n, dims_.hidden}, MemCategory::kBuffers);
  }

  // The QKV projection's and the norm's input gradients (and the residual's) of `rows` into dx.
  void backward_out(Stash& stash, RowRange r, Tensor* dx) override {
    auto& st = static_cast<AttnStash&>(stash);
    const int64_t h = dims_.hidden, w3 = qdim() + 2 * kdim();
    if (r.size() == 0) return;
    float* dxn = st.dxn.data() + r.begin * h;
    float* dxr = dx->data() + r.begin * h;
    kernels::linear_backward_input(dxn, st.dqkv.data() + r.begin * w3, w(1), r.size(), h, w3);
    kernels::rmsnorm_backward_input(dxr, dxn, st.x->data() + r.begin * h, w(0), st.rstd.data() + r.begin, r.size(), h);
    if (residual_) add_into(dxr, dxr, st.dout->data() + r.begin * h, r.size() * h);
  }

  void backward_weight(const StepContext& ctx, Stash& stash) override {
    auto& st = static_cast<AttnStash&>(stash);
    const int64_t n = st.batch * st.seq, h = dims_.hidden, qd = qdim(), kd = kdim();
    kernels::rmsnorm_backward_weight(g(0), st.dxn.data(), st.x->data(), st.rstd.data(), n, h);
    kernels::linear_backward_weight(g(1), st.dqkv.data(), st.xn.data(), n, h, qd + 2 * kd);
    kernels::linear_backward_weight(g(2), st.dout->data(), st.o.data(), n, qd, h);
    st.dout.reset();
    st.dqkv = Tensor();
    st.dxn = Tensor();
  }

 private:
  // [rows, qd + 2kd] <-> q [n, qd], k, v [n, kd].
  // qkv holds rows r of [q | k | v].
  void unpack(const Tensor& qkv, Tensor* q, Tensor* k, Tensor* v, RowRange r) const {
    const int64_t qd = qdim(), kd = kdim(), w = qd + 2 * kd;
    for (int64_t t = r.begin; t < r.end; ++t) {
      const float* src = qkv.data() + (t - r.begin) * w;
      std::copy(src, src + qd, q->data() + t * qd);
      std::copy(src + qd, src + qd + kd, k->data() + t * kd);
      std::copy(src + qd + kd, src + w, v->data() + t * kd);
    }
  }
  void pack(const Tensor& q, const Tensor& k, const Tensor& v, Tensor* qkv, int64_t n) const {
    const int64_t qd = qdim(), kd = kdim(), w = qd + 2 * kd;
    for (int64_t t = 0; t < n; ++t) {
      float* dst = qkv->data() + t * w;
      std::copy(q.data() + t * qd, q.data() + (t + 1) * qd, dst);
      std::copy(k.data() + t * kd, k.data() + (t + 1) * kd, dst + qd);
      std::copy(v.data() + t * kd, v.data() + (t + 1) * kd, dst + qd + kd);
    }
  }
  int64_t qdim() const { return dims_.num_heads * dims_.head_dim; }
  int64_t kdim() const { return dims_.num_kv_heads * dims_.head_dim; }
  const float* w(size_t i) const { return params_[i].value.data(); }
  float* g(size_t i) { return params_[i].grad.data(); }
  kernels::AttentionShape shape(const AttnStash& st) const {
    return {st.batch, st.seq, dims_.num_heads, dims_.num_kv_heads, dims_.head_dim};
  }
  bool residual_;  // false on tensor ranks > 0 (tp_slice.h): the residual is added once over the TP group
};

}  // namespace

std::unique_ptr<Chunk> make_attn_chunk(int layer, const ChunkDims& dims, uint64_t seed, Allocator* allocator,
                                       bool residual) {
  return std::make_unique<AttnChunk>(layer, dims, seed, allocator, residual);
}

}  // namespace piper::runtime
