// GpuTrainer on the CUDA kernels (see gpu_trainer.h). Tensors are DeviceBuffers; every chunk of the model runs
// as a fixed sequence of kernel calls mirroring its CPU chunk (runtime/model/chunks/*.cc).
#include "piper/runtime/gpu/gpu_trainer.h"

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "piper/kernels/cpu/moe_reference.h"
#include "piper/kernels/cpu/optimizer.h"
#include "piper/kernels/cuda/cuda_api.h"
#include "piper/runtime/data/data_loader.h"
#include "piper/runtime/data/data_source.h"
#include "piper/runtime/exec/memory_pool.h"
#include "piper/runtime/model/model.h"

namespace piper::runtime {
namespace {

namespace cu = kernels::cuda;
using cu::Bf16;
using cu::DeviceBuffer;
using Buf = std::shared_ptr<DeviceBuffer>;

Buf f32(int64_t n, bool zero = false) { return std::make_shared<DeviceBuffer>(cu::device_array<float>(n, zero)); }
Buf b16(int64_t n) { return std::make_shared<DeviceBuffer>(cu::device_array<Bf16>(n)); }
float* F(const Buf& b) { return b ? b->as<float>() : nullptr; }
Bf16* H(const Buf& b) { return b ? b->as<Bf16>() : nullptr; }

// Linear layers on bf16 operands, w [out, in] (the CPU's linear_* contracts).
void linear_fwd(float* y, const Bf16* x, const Bf16* w, int64_t n, int64_t in, int64_t out) {
  cu::gemm_bf16(false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}
void linear_bwd_in(float* dx, const Bf16* dy, const Bf16* w, int64_t n, int64_t in, int64_t out, float beta) {
  cu::gemm_bf16(false, false, n, in, out, 1.0f, dy, out, w, in, beta, dx, in);
}
void linear_bwd_w(float* dw, const Bf16* dy, const Bf16* x, int64_t n, int64_t in, int64_t out) {
  cu::gemm_bf16(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
}
Buf to_bf16(const float* x, int64_t n) {
  Buf b = b16(n);
  cu::cast_to_bf16(H(b), x, n);
  return b;
}

// One parameter on the device: fp32 master, its bf16 copy (GEMM operand), gradient and AdamW moments.
struct DParam {
  Param* host = nullptr;
  int64_t n = 0;
  DeviceBuffer p, pb, g, m, v;
  float* w() const { return p.as<float>(); }
  const Bf16* wb() const { return pb.as<Bf16>(); }
  float* grad() const { return g.as<float>(); }
};

// What one chunk keeps from its forward for its backward (one microbatch at a time).
struct Saved {
  Buf x, xn, xnb, rstd;             // chunk input, normed input (fp32, bf16), 1/rms
  Buf q, k, v, o, ob, lse;          // attention
  Buf g, u, hh, hhb;                // SwiGLU intermediates (dense or per expert row)
  Buf scores, topk_w, aux_ds, idx;  // router (idx: int32 [n, k] on the device)
  Buf xpb, yp;                      // experts: permuted input (bf16), expert outputs
  Buf probs;                        // head
  std::vector<int32_t> topk_idx;
  kernels::Routing routing;
  Buf row_of_slot, token_of_row;
  Buf ids, targets;
  Buf dnormed, dtopk_w;  // experts -> router (B)
};

class GpuTrainerImpl : public GpuTrainer {
 public:
  Status init(const TrainOptions& options) {
    options_ = options;
    if (options.ranks != 1 || options.world != nullptr) {
      return invalid_argument("--device cuda trains on one GPU rank; got --ranks " + std::to_string(options.ranks) +
                              " (multi-GPU runs are not implemented yet: issue 11)");
    }
    PIPER_ASSIGN_OR_RETURN(Strategy s, train_strategy(options.strategy, options.global_batch));
    if (s.dp != 1 || s.tp != 1 || s.pp != 1 || s.ep != 1) {
      return invalid_argument("--device cuda runs one rank without parallelism; strategy " + s.to_string() +
                              " asks for dp/tp/pp/ep > 1");
    }
    mbs_ = s.mbs;
    microbatches_ = s.microbatches;
    if (options_.global_batch == 0) options_.global_batch = static_cast<int64_t>(s.mbs) * s.microbatches;
    if (static_cast<int64_t>(mbs_) * microbatches_ != options_.global_batch) {
      return invalid_argument("--device cuda: global batch " + std::to_string(options_.global_batch) + " is not mbs " +
                              std::to_string(mbs_) + " x microbatches " + std::to_string(microbatches_));
    }
    PIPER_RETURN_IF_ERROR(cu::device_status());
    device_ = cu::device_description();
    pool_ = std::make_unique<MemoryPool>(&tracker_);
    PIPER_ASSIGN_OR_RETURN(model_, Model::create(options.model, options.model_options, options.seed, pool_.get()));
    dims_ = model_->dims();
    if (dims_.head_dim > cu::kMaxAttnHeadDim) {
      return invalid_argument("--device cuda: head_dim " + std::to_string(dims_.head_dim) + " > " +
                              std::to_string(cu::kMaxAttnHeadDim) + " (the attention kernel's limit)");
    }
    for (const auto& c : model_->chunks()) {
      std::vector<DParam*> ps;
      for (Param& p : c->params()) {
        auto d = std::make_unique<DParam>();
        d->host = &p;
        d->n = p.value.numel();
        d->p = cu::device_array<float>(d->n);
        cu::copy_to_device(d->p.get(), p.value.data(), static_cast<size_t>(d->n) * sizeof(float));
        d->pb = cu::device_array<Bf16>(d->n);
        cu::cast_to_bf16(d->pb.as<Bf16>(), d->w(), d->n);
        if (p.trainable) {
          d->g = cu::device_array<float>(d->n, true);
          d->m = cu::device_array<float>(d->n, true);
          d->v = cu::device_array<float>(d->n, true);
        }
        ps.push_back(d.get());
        params_.push_back(std::move(d));
      }
      chunk_params_.push_back(std::move(ps));
    }
    expert_counts_.assign(model_->chunks().size(), std::vector<int64_t>(static_cast<size_t>(dims_.num_experts), 0));
    PIPER_ASSIGN_OR_RETURN(Corpus corpus, load_corpus(options.data, options.model.vocab_size));
    PIPER_ASSIGN_OR_RETURN(DataLoader loader, DataLoader::create(std::move(corpus.tokens), options.seq_len,
                                                                 options_.global_batch, options.seed));
    loader_ = std::make_unique<DataLoader>(std::move(loader));
    cu::synchronize();
    return ok_status();
  }

  Result<TrainStepStats> step() override {
    try {
      return run_step();
    } catch (const cu::CudaError& e) {
      return internal_error(std::string("--device cuda: ") + e.what());
    }
  }
  std::string device() const override { return device_; }
  int microbatches() const override { return microbatches_; }
  int64_t mbs() const override { return mbs_; }
  Result<std::vector<std::pair<std::string, std::vector<float>>>> gradients() override {
    try {
      std::vector<std::pair<std::string, std::vector<float>>> out;
      for (const auto& p : params_) {
        if (p->host->trainable) out.emplace_back(p->host->name, cu::download<float>(p->g.get(), p->n));
      }
      return out;
    } catch (const cu::CudaError& e) {
      return internal_error(std::string("--device cuda: ") + e.what());
    }
  }

 private:
  Result<TrainStepStats> run_step() {
    const auto t0 = std::chrono::steady_clock::now();
    loader_->next_batch(&batch_);
    for (auto& p : params_) {
      if (p->host->trainable) cu::fill_zero(p->g.get(), static_cast<size_t>(p->n) * sizeof(float));
    }
    TrainStepStats s;
    const int64_t seq = batch_.seq_len, per_mb = static_cast<int64_t>(mbs_) * seq;
    for (int mb = 0; mb < microbatches_; ++mb) {
      const int32_t* in = batch_.inputs.data() + mb * per_mb;
      const int32_t* tg = batch_.targets.data() + mb * per_mb;
      for (int64_t i = 0; i < per_mb; ++i) {
        if (in[i] < 0 || in[i] >= dims_.vocab || tg[i] < 0 || tg[i] >= dims_.vocab) {
          return out_of_range("--device cuda: token id outside the vocabulary [0, " + std::to_string(dims_.vocab) +
                              ") in microbatch " + std::to_string(mb));
        }
      }
      double loss = 0, aux = 0;
      PIPER_RETURN_IF_ERROR(microbatch(in, tg, mbs_, seq, &loss, &aux));
      s.loss += loss;
      s.aux_loss += aux;
    }
    s.loss /= microbatches_;
    // Global-norm clipping and AdamW (runtime/model/optimizer.cc's rules).
    double total = 0;
    for (auto& p : params_) {
      if (!p->host->trainable) continue;
      const int64_t blocks = (p->n + cu::kNormBlock - 1) / cu::kNormBlock;
      DeviceBuffer parts = cu::device_array<double>(blocks);
      cu::sum_squares_blocks(parts.as<double>(), p->grad(), p->n);
      for (double x : cu::download<double>(parts.get(), blocks)) total += x;
    }
    s.grad_norm = std::sqrt(total);
    // Checked before the update, so a diverged step leaves the weights as they were.
    PIPER_RETURN_IF_ERROR(check_step_finite(s.loss, s.grad_norm, step_ + 1, options_.optimizer.lr));
    const double clip = kernels::clip_scale(s.grad_norm, options_.optimizer.grad_clip);
    ++step_;
    double lr = options_.optimizer.lr;
    if (options_.warmup_steps > 0) {
      lr *=
          std::min(1.0, static_cast<double>(std::max<int64_t>(step_, 1)) / static_cast<double>(options_.warmup_steps));
    }
    cu::AdamWArgs a;
    a.lr = static_cast<float>(lr);
    a.b1 = static_cast<float>(options_.optimizer.beta1);
    a.b2 = static_cast<float>(options_.optimizer.beta2);
    a.bc1 = static_cast<float>(1.0 - std::pow(options_.optimizer.beta1, static_cast<double>(step_)));
    a.bc2 = static_cast<float>(1.0 - std::pow(options_.optimizer.beta2, static_cast<double>(step_)));
    a.eps = static_cast<float>(options_.optimizer.eps);
    a.grad_scale = static_cast<float>(clip);
    for (auto& p : params_) {
      if (!p->host->trainable) continue;
      a.wd = p->host->decay ? static_cast<float>(options_.optimizer.weight_decay) : 0.0f;
      cu::adamw(p->w(), p->pb.as<Bf16>(), p->grad(), p->m.as<float>(), p->v.as<float>(), p->n, a);
    }
    // Aux-loss-free balancing: the bias moves on the host (router_update_bias) and goes back to the device.
    if (dims_.expert_bias) {
      for (size_t c = 0; c < model_->chunks().size(); ++c) {
        if (model_->chunks()[c]->part() != Part::kRouter) continue;
        DParam* bias = chunk_params_[c][2];
        kernels::router_update_bias(bias->host->value.data(), expert_counts_[c].data(), dims_.num_experts,
                                    dims_.bias_update_rate);
        cu::copy_to_device(bias->p.get(), bias->host->value.data(), static_cast<size_t>(bias->n) * sizeof(float));
        std::fill(expert_counts_[c].begin(), expert_counts_[c].end(), 0);
      }
    }
    cu::synchronize();
    s.step = step_;
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.tokens_per_s = s.seconds > 0 ? static_cast<double>(options_.global_batch * seq) / s.seconds : 0;
    return s;
  }

  // Forward then backward of one microbatch; adds its gradients; its loss and aux loss (already / M).
  Status microbatch(const int32_t* ids, const int32_t* targets, int64_t batch, int64_t seq, double* loss, double* aux) {
    const auto& chunks = model_->chunks();
    const int64_t n = batch * seq;
    std::vector<Saved> saved(chunks.size());
    Buf cur, layer_in;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const Part part = chunks[c]->part();
      Saved& st = saved[c];
      const auto& P = chunk_params_[c];
      if (part == Part::kEmbedding) {
        st.ids = std::make_shared<DeviceBuffer>(cu::upload(std::vector<int32_t>(ids, ids + n)));
        cur = f32(n * dims_.hidden);
        cu::embedding_forward(F(cur), st.ids->as<int32_t>(), P[0]->w(), n, dims_.hidden);
      } else if (part == Part::kAttention) {
        cur = attn_forward(st, P, cur, batch, seq);
      } else if (part == Part::kDenseMlp) {
        cur = ffn_forward(st, P, cur, n, dims_.intermediate, true);
      } else if (part == Part::kRouter) {
        layer_in = cur;
        PIPER_ASSIGN_OR_RETURN(double a, router_forward(st, P, cur, n, c));
        *aux += a;
      } else if (part == Part::kExperts) {
        if (c == 0 || chunks[c - 1]->part() != Part::kRouter) return internal_error("experts chunk without its router");
        cur = experts_forward(st, P, saved[c - 1], cur, n);
      } else if (part == Part::kSharedExperts) {
        Buf y = ffn_forward(st, P, layer_in, n, shared_width(), false);
        cu::add_scaled(F(y), F(cur), F(y), 1.0f, n * dims_.hidden);
        cur = y;
      } else if (part == Part::kHead) {
        st.targets = std::make_shared<DeviceBuffer>(cu::upload(std::vector<int32_t>(targets, targets + n)));
        *loss = head_forward(st, P, cur, n);
      } else {
        return invalid_argument("--device cuda: no GPU path for chunk part '" + std::string(to_string(part)) + "'");
      }
    }
    // Backward in reverse chunk order; dcur = gradient of the last forward output (the main path).
    Buf dcur, dshared;
    for (size_t c = chunks.size(); c-- > 0;) {
      const Part part = chunks[c]->part();
      Saved& st = saved[c];
      const auto& P = chunk_params_[c];
      if (part == Part::kHead) {
        dcur = head_backward(st, P, n);
      } else if (part == Part::kSharedExperts) {
        dshared = ffn_backward(st, P, dcur, n, shared_width(), false);
      } else if (part == Part::kExperts) {
        experts_backward(st, P, saved[c - 1], dcur, n);
      } else if (part == Part::kRouter) {
        dcur = router_backward(st, P, dcur, dshared, n);
        dshared.reset();
      } else if (part == Part::kDenseMlp) {
        dcur = ffn_backward(st, P, dcur, n, dims_.intermediate, true);
      } else if (part == Part::kAttention) {
        dcur = attn_backward(st, P, dcur, batch, seq);
      } else if (part == Part::kEmbedding) {
        std::vector<int32_t> host_ids(ids, ids + n);
        const cu::EmbeddingPlan plan = cu::build_embedding_plan(host_ids.data(), n, dims_.vocab);
        DeviceBuffer off = cu::upload(plan.offsets), tok = cu::upload(plan.tokens);
        cu::embedding_backward_weight(P[0]->grad(), F(dcur), off.as<int64_t>(), tok.as<int64_t>(), dims_.vocab,
                                      dims_.hidden);
      }
      saved[c] = Saved();  // release the stash
    }
    return ok_status();
  }

  int64_t shared_width() const { return dims_.shared_intermediate * std::max(1, dims_.num_shared_experts); }

  void norm_forward(Saved& st, const DParam* w, const Buf& x, int64_t n) {
    const int64_t h = dims_.hidden;
    st.x = x;
    st.xn = f32(n * h);
    st.xnb = b16(n * h);
    st.rstd = f32(n);
    cu::rmsnorm_forward(F(st.xn), H(st.xnb), F(st.rstd), F(x), w->w(), n, h, dims_.norm_eps);
  }
  // dx = rmsnorm_B(dxn) (+ add); the norm weight's gradient accumulates.
  Buf norm_backward(const Saved& st, const DParam* w, const Buf& dxn, const Buf& add, int64_t n) {
    const int64_t h = dims_.hidden;
    Buf dx = f32(n * h);
    cu::rmsnorm_backward_input(F(dx), F(dxn), F(st.x), w->w(), F(st.rstd), F(add), n, h);
    cu::rmsnorm_backward_weight(w->grad(), F(dxn), F(st.x), F(st.rstd), n, h);
    return dx;
  }

  // ---- attn: params norm, w_qkv [qd + 2kd, h], wo [h, qd]
  Buf attn_forward(Saved& st, const std::vector<DParam*>& P, const Buf& x, int64_t batch, int64_t seq) {
    const int64_t n = batch * seq, h = dims_.hidden, qd = dims_.num_heads * dims_.head_dim;
    const int64_t kd = dims_.num_kv_heads * dims_.head_dim, w = qd + 2 * kd;
    norm_forward(st, P[0], x, n);
    Buf qkv = f32(n * w);
    linear_fwd(F(qkv), H(st.xnb), P[1]->wb(), n, h, w);
    st.q = f32(n * qd), st.k = f32(n * kd), st.v = f32(n * kd);
    cu::copy_columns(F(st.q), qd, F(qkv), w, n, qd);
    cu::copy_columns(F(st.k), kd, F(qkv) + qd, w, n, kd);
    cu::copy_columns(F(st.v), kd, F(qkv) + qd + kd, w, n, kd);
    cu::rotary(F(st.q), F(st.q), batch, seq, dims_.num_heads, dims_.head_dim, dims_.rope_theta, 1.0);
    cu::rotary(F(st.k), F(st.k), batch, seq, dims_.num_kv_heads, dims_.head_dim, dims_.rope_theta, 1.0);
    st.o = f32(n * qd);
    st.lse = f32(batch * dims_.num_heads * seq);
    cu::attention_forward(F(st.o), F(st.lse), F(st.q), F(st.k), F(st.v), shape(batch, seq));
    st.ob = to_bf16(F(st.o), n * qd);
    Buf y = f32(n * h);
    linear_fwd(F(y), H(st.ob), P[2]->wb(), n, qd, h);
    cu::add_scaled(F(y), F(y), F(x), 1.0f, n * h);
    return y;
  }
  Buf attn_backward(Saved& st, const std::vector<DParam*>& P, const Buf& dout, int64_t batch, int64_t seq) {
    const int64_t n = batch * seq, h = dims_.hidden, qd = dims_.num_heads * dims_.head_dim;
    const int64_t kd = dims_.num_kv_heads * dims_.head_dim, w = qd + 2 * kd;
    Buf doutb = to_bf16(F(dout), n * h);
    Buf d_o = f32(n * qd);
    linear_bwd_in(F(d_o), H(doutb), P[2]->wb(), n, qd, h, 0.0f);
    linear_bwd_w(P[2]->grad(), H(doutb), H(st.ob), n, qd, h);
    Buf dq = f32(n * qd), dk = f32(n * kd), dv = f32(n * kd);
    cu::attention_backward(F(dq), F(dk), F(dv), F(d_o), F(st.o), F(st.lse), F(st.q), F(st.k), F(st.v),
                           shape(batch, seq));
    cu::rotary(F(dq), F(dq), batch, seq, dims_.num_heads, dims_.head_dim, dims_.rope_theta, -1.0);
    cu::rotary(F(dk), F(dk), batch, seq, dims_.num_kv_heads, dims_.head_dim, dims_.rope_theta, -1.0);
    Buf dqkv = f32(n * w);
    cu::copy_columns(F(dqkv), w, F(dq), qd, n, qd);
    cu::copy_columns(F(dqkv) + qd, w, F(dk), kd, n, kd);
    cu::copy_columns(F(dqkv) + qd + kd, w, F(dv), kd, n, kd);
    Buf dqkvb = to_bf16(F(dqkv), n * w);
    Buf dxn = f32(n * h);
    linear_bwd_in(F(dxn), H(dqkvb), P[1]->wb(), n, h, w, 0.0f);
    linear_bwd_w(P[1]->grad(), H(dqkvb), H(st.xnb), n, h, w);
    return norm_backward(st, P[0], dxn, dout, n);
  }
  cu::AttnShape shape(int64_t batch, int64_t seq) const {
    return {batch, seq, dims_.num_heads, dims_.num_kv_heads, dims_.head_dim};
  }

  // ---- mlp / shared: params norm, w_gate [f, h], w_up [f, h], w_down [h, f]
  Buf ffn_forward(Saved& st, const std::vector<DParam*>& P, const Buf& x, int64_t n, int64_t f, bool residual) {
    const int64_t h = dims_.hidden;
    norm_forward(st, P[0], x, n);
    st.g = f32(n * f), st.u = f32(n * f), st.hh = f32(n * f), st.hhb = b16(n * f);
    linear_fwd(F(st.g), H(st.xnb), P[1]->wb(), n, h, f);
    linear_fwd(F(st.u), H(st.xnb), P[2]->wb(), n, h, f);
    cu::swiglu_act_forward(F(st.hh), H(st.hhb), F(st.g), F(st.u), n * f);
    Buf y = f32(n * h);
    linear_fwd(F(y), H(st.hhb), P[3]->wb(), n, f, h);
    if (residual) cu::add_scaled(F(y), F(y), F(x), 1.0f, n * h);
    return y;
  }
  Buf ffn_backward(Saved& st, const std::vector<DParam*>& P, const Buf& dout, int64_t n, int64_t f, bool residual) {
    const int64_t h = dims_.hidden;
    Buf doutb = to_bf16(F(dout), n * h);
    Buf dh = f32(n * f), du = f32(n * f);
    linear_bwd_in(F(dh), H(doutb), P[3]->wb(), n, f, h, 0.0f);
    linear_bwd_w(P[3]->grad(), H(doutb), H(st.hhb), n, f, h);
    cu::swiglu_act_backward(F(dh), F(du), F(dh), F(st.g), F(st.u), n * f);  // dh becomes dg
    Buf dgb = to_bf16(F(dh), n * f), dub = to_bf16(F(du), n * f);
    Buf dxn = f32(n * h);
    linear_bwd_in(F(dxn), H(dgb), P[1]->wb(), n, h, f, 0.0f);
    linear_bwd_in(F(dxn), H(dub), P[2]->wb(), n, h, f, 1.0f);
    linear_bwd_w(P[1]->grad(), H(dgb), H(st.xnb), n, h, f);
    linear_bwd_w(P[2]->grad(), H(dub), H(st.xnb), n, h, f);
    return norm_backward(st, P[0], dxn, residual ? dout : nullptr, n);
  }

  // ---- router: params norm, w_router [E, h] (fp32 GEMMs), [bias]. Returns the aux loss (/ M).
  Result<double> router_forward(Saved& st, const std::vector<DParam*>& P, const Buf& x, int64_t n, size_t c) {
    const int64_t h = dims_.hidden, E = dims_.num_experts, K = dims_.top_k;
    norm_forward(st, P[0], x, n);
    st.scores = f32(n * E);
    cu::gemm_f32(false, true, n, E, h, 1.0f, F(st.xn), h, P[1]->w(), h, 0.0f, F(st.scores), E);
    Buf idx = std::make_shared<DeviceBuffer>(cu::device_array<int32_t>(n * K));
    st.topk_w = f32(n * K);
    cu::router_select(F(st.scores), idx->as<int32_t>(), F(st.topk_w), dims_.expert_bias ? P[2]->w() : nullptr, n,
                      static_cast<int>(E), static_cast<int>(K), dims_.router_score == kernels::ScoreFunc::kSoftmax,
                      dims_.norm_topk);
    st.topk_idx = cu::download<int32_t>(idx->get(), n * K);
    st.routing = kernels::build_routing(st.topk_idx.data(), n, static_cast<int>(K), static_cast<int>(E));
    st.row_of_slot = std::make_shared<DeviceBuffer>(cu::upload(st.routing.row_of_slot));
    st.token_of_row = std::make_shared<DeviceBuffer>(cu::upload(st.routing.token_of_row));
    st.idx = idx;
    if (dims_.expert_bias) {
      for (int e = 0; e < E; ++e) expert_counts_[c][static_cast<size_t>(e)] += st.routing.count(e);
    }
    const double coef = dims_.aux_loss_coef / microbatches_;
    std::vector<float> aux_ds(static_cast<size_t>(E), 0.0f);
    double aux = 0;
    if (coef > 0) {
      DeviceBuffer colsum = cu::device_array<double>(E);
      cu::column_sums(colsum.as<double>(), F(st.scores), n, E);
      const std::vector<double> p = cu::download<double>(colsum.get(), E);
      for (int e = 0; e < E; ++e) {
        const double count = static_cast<double>(st.routing.count(e));
        aux += count / static_cast<double>(n * K) * (p[static_cast<size_t>(e)] / static_cast<double>(n));
        aux_ds[static_cast<size_t>(e)] = static_cast<float>(coef * E) * static_cast<float>(count) /
                                         static_cast<float>(n * K) / static_cast<float>(n);
      }
      aux *= coef * E;
    }
    st.aux_ds = std::make_shared<DeviceBuffer>(cu::upload(aux_ds));
    return aux;
  }
  // experts_backward left dnormed and dtopk_w in this router's stash.
  Buf router_backward(Saved& st, const std::vector<DParam*>& P, const Buf& dout, const Buf& dshared, int64_t n) {
    const int64_t h = dims_.hidden, E = dims_.num_experts, K = dims_.top_k;
    Buf dlogits = f32(n * E);
    cu::router_dlogits(F(dlogits), F(st.dtopk_w), F(st.scores), st.idx->as<int32_t>(), F(st.topk_w), F(st.aux_ds), n,
                       static_cast<int>(E), static_cast<int>(K), dims_.router_score == kernels::ScoreFunc::kSoftmax,
                       dims_.norm_topk);
    Buf dhn = f32(n * h);
    cu::gemm_f32(false, false, n, h, E, 1.0f, F(dlogits), E, P[1]->w(), h, 0.0f, F(dhn), h);
    cu::add_scaled(F(dhn), F(dhn), F(st.dnormed), 1.0f, n * h);
    cu::gemm_f32(true, false, E, h, n, 1.0f, F(dlogits), E, F(st.xn), h, 1.0f, P[1]->grad(), h);
    Buf dx = norm_backward(st, P[0], dhn, dout, n);
    if (dshared) cu::add_scaled(F(dx), F(dx), F(dshared), 1.0f, n * h);
    return dx;
  }

  // ---- experts: w_gate, w_up [E, f, h], w_down [E, h, f]; grouped GEMMs over the rows of each expert.
  Buf experts_forward(Saved& st, const std::vector<DParam*>& P, Saved& router, const Buf& x, int64_t n) {
    const int64_t h = dims_.hidden, f = dims_.expert_intermediate, K = dims_.top_k, rows = n * K;
    const auto& off = router.routing.expert_offsets;
    st.x = x;
    st.xpb = b16(rows * h);
    cu::permute_forward(nullptr, H(st.xpb), F(router.xn), router.token_of_row->as<int64_t>(), rows, h);
    st.g = f32(rows * f), st.u = f32(rows * f), st.hh = f32(rows * f), st.hhb = b16(rows * f);
    cu::grouped_gemm_bf16(cu::expert_forward_problems(off, H(st.xpb), P[0]->wb(), F(st.g), h, f));
    cu::grouped_gemm_bf16(cu::expert_forward_problems(off, H(st.xpb), P[1]->wb(), F(st.u), h, f));
    cu::swiglu_act_forward(F(st.hh), H(st.hhb), F(st.g), F(st.u), rows * f);
    st.yp = f32(rows * h);
    cu::grouped_gemm_bf16(cu::expert_forward_problems(off, H(st.hhb), P[2]->wb(), F(st.yp), f, h));
    Buf y = f32(n * h);
    cu::unpermute_forward(F(y), F(st.yp), F(router.topk_w), router.row_of_slot->as<int64_t>(), F(x),
                          static_cast<float>(dims_.routed_scaling), n, static_cast<int>(K), h);
    return y;
  }
  void experts_backward(Saved& st, const std::vector<DParam*>& P, Saved& router, const Buf& dout, int64_t n) {
    const int64_t h = dims_.hidden, f = dims_.expert_intermediate, K = dims_.top_k, rows = n * K;
    const auto& off = router.routing.expert_offsets;
    Buf dyp = f32(rows * h), dypb = b16(rows * h);
    st.dtopk_w = f32(n * K);
    cu::unpermute_backward(F(dyp), H(dypb), F(st.dtopk_w), F(dout), F(st.yp), F(router.topk_w),
                           router.row_of_slot->as<int64_t>(), static_cast<float>(dims_.routed_scaling), n,
                           static_cast<int>(K), h);
    Buf dh = f32(rows * f), du = f32(rows * f);
    cu::grouped_gemm_bf16(cu::expert_backward_input_problems(off, H(dypb), P[2]->wb(), F(dh), f, h, 0.0f));
    cu::grouped_gemm_bf16(cu::expert_backward_weight_problems(off, H(dypb), H(st.hhb), P[2]->grad(), f, h));
    cu::swiglu_act_backward(F(dh), F(du), F(dh), F(st.g), F(st.u), rows * f);
    Buf dgb = to_bf16(F(dh), rows * f), dub = to_bf16(F(du), rows * f);
    Buf dxp = f32(rows * h);
    cu::grouped_gemm_bf16(cu::expert_backward_input_problems(off, H(dgb), P[0]->wb(), F(dxp), h, f, 0.0f));
    cu::grouped_gemm_bf16(cu::expert_backward_input_problems(off, H(dub), P[1]->wb(), F(dxp), h, f, 1.0f));
    cu::grouped_gemm_bf16(cu::expert_backward_weight_problems(off, H(dgb), H(st.xpb), P[0]->grad(), h, f));
    cu::grouped_gemm_bf16(cu::expert_backward_weight_problems(off, H(dub), H(st.xpb), P[1]->grad(), h, f));
    st.dnormed = f32(n * h);
    cu::permute_backward(F(st.dnormed), F(dxp), router.row_of_slot->as<int64_t>(), nullptr, n, static_cast<int>(K), h);
    router.dtopk_w = st.dtopk_w;
    router.dnormed = st.dnormed;
  }

  // ---- head: norm, w_out [V, h]; mean token cross-entropy.
  double head_forward(Saved& st, const std::vector<DParam*>& P, const Buf& x, int64_t n) {
    const int64_t h = dims_.hidden, V = dims_.vocab;
    norm_forward(st, P[0], x, n);
    st.probs = f32(n * V);
    linear_fwd(F(st.probs), H(st.xnb), P[1]->wb(), n, h, V);
    Buf row_loss = f32(n);
    cu::softmax_xent_forward(F(st.probs), F(row_loss), st.targets->as<int32_t>(), n, V);
    double total = 0;
    for (float l : cu::download<float>(row_loss->get(), n)) total += static_cast<double>(l);
    return n > 0 ? total / static_cast<double>(n) : 0.0;
  }
  Buf head_backward(Saved& st, const std::vector<DParam*>& P, int64_t n) {
    const int64_t h = dims_.hidden, V = dims_.vocab;
    Buf dl = f32(n * V), dlb = b16(n * V);
    const float scale = 1.0f / static_cast<float>(microbatches_) / static_cast<float>(n);
    cu::softmax_xent_backward(F(dl), H(dlb), F(st.probs), st.targets->as<int32_t>(), scale, n, V);
    Buf dxn = f32(n * h);
    linear_bwd_in(F(dxn), H(dlb), P[1]->wb(), n, h, V, 0.0f);
    linear_bwd_w(P[1]->grad(), H(dlb), H(st.xnb), n, h, V);
    return norm_backward(st, P[0], dxn, nullptr, n);
  }

  TrainOptions options_;
  int mbs_ = 1, microbatches_ = 1;
  int64_t step_ = 0;
  std::string device_;
  MemoryTracker tracker_;
  std::unique_ptr<MemoryPool> pool_;
  std::unique_ptr<Model> model_;
  ChunkDims dims_;
  std::vector<std::unique_ptr<DParam>> params_;
  std::vector<std::vector<DParam*>> chunk_params_;
  std::vector<std::vector<int64_t>> expert_counts_;
  std::unique_ptr<DataLoader> loader_;
  Batch batch_;
};

}  // namespace

Result<std::unique_ptr<GpuTrainer>> GpuTrainer::create(const TrainOptions& options) {
  auto t = std::make_unique<GpuTrainerImpl>();
  try {
    PIPER_RETURN_IF_ERROR(t->init(options));
  } catch (const cu::CudaError& e) {
    return internal_error(std::string("--device cuda: ") + e.what());
  }
  return std::unique_ptr<GpuTrainer>(std::move(t));
}

bool gpu_backend_built() { return true; }

}  // namespace piper::runtime
