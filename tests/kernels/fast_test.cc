// The fast fp32 kernels against the float reference, for both GEMM backends, and bit-identical results for 1
// and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "fd_util.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/kernels/cpu/ops.h"
#include "piper/tensor/rng.h"

namespace piper::kernels {
namespace {

using FVec = std::vector<float>;

using testing::random_vec;

void expect_close(const FVec& fast, const FVec& ref, const char* what) {
  ASSERT_EQ(fast.size(), ref.size());
  for (size_t i = 0; i < fast.size(); ++i) {
    ASSERT_NEAR(fast[i], ref[i], 2e-4f * (1.0f + std::abs(ref[i]))) << what << "[" << i << "]";
  }
}

// Runs `body` (which fills the listed outputs) with 1 and 2 threads and requires identical bits.
void expect_thread_invariant(const std::function<std::vector<FVec>()>& body, const char* what) {
  set_kernel_threads(1);
  const std::vector<FVec> one = body();
  set_kernel_threads(2);
  const std::vector<FVec> two = body();
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(one[i].data(), two[i].data(), one[i].size() * sizeof(float))) << what << " output " << i;
  }
}

class FastTest : public ::testing::TestWithParam<GemmBackend> {
 protected:
  void SetUp() override {
    if (!gemm_backend_available(GetParam())) GTEST_SKIP() << "backend not built in";
    ASSERT_TRUE(set_gemm_backend(GetParam()).ok());
  }
  void TearDown() override {
    (void)set_gemm_backend(gemm_backend_available(GemmBackend::kOneDnn) ? GemmBackend::kOneDnn
                                                                        : GemmBackend::kOpenBlas);
    set_kernel_threads(2);
  }
};

TEST_P(FastTest, LinearSwigluGelu) {
  const int64_t n = 37, d = 29, f = 23;
  const FVec x = random_vec(n * d, 1), wg = random_vec(f * d, 2, 0.3f), wu = random_vec(f * d, 3, 0.3f);
  const FVec wd = random_vec(d * f, 4, 0.3f), dy = random_vec(n * d, 5);
  auto run = [&](bool fast) {
    FVec y(n * d), g(n * f), u(n * f), h(n * f), dx(n * d), dg(n * f), du(n * f);
    FVec dwg(f * d, 0.5f), dwu(f * d, 0.5f), dwd(d * f, 0.5f), a(n * f), ha(n * f), ya(n * d), da(n * f), dxa(n * d);
    if (fast) {
      swiglu_forward(y.data(), g.data(), u.data(), h.data(), x.data(), wg.data(), wu.data(), wd.data(), n, d, f);
      swiglu_backward_input(dx.data(), dg.data(), du.data(), dy.data(), g.data(), u.data(), wg.data(), wu.data(),
                            wd.data(), n, d, f);
      swiglu_backward_weight(dwg.data(), dwu.data(), dwd.data(), dy.data(), x.data(), h.data(), dg.data(), du.data(), n,
                             d, f);
      gelu_mlp_forward(ya.data(), a.data(), ha.data(), x.data(), wu.data(), wd.data(), n, d, f);
      gelu_mlp_backward_input(dxa.data(), da.data(), dy.data(), a.data(), wu.data(), wd.data(), n, d, f);
    } else {
      ref::swiglu_forward(y.data(), g.data(), u.data(), h.data(), x.data(), wg.data(), wu.data(), wd.data(), n, d, f);
      ref::swiglu_backward_input(dx.data(), dg.data(), du.data(), dy.data(), g.data(), u.data(), wg.data(), wu.data(),
                                 wd.data(), n, d, f);
      ref::swiglu_backward_weight(dwg.data(), dwu.data(), dwd.data(), dy.data(), x.data(), h.data(), dg.data(),
                                  du.data(), n, d, f);
      ref::gelu_mlp_forward(ya.data(), a.data(), ha.data(), x.data(), wu.data(), wd.data(), n, d, f);
      ref::gelu_mlp_backward_input(dxa.data(), da.data(), dy.data(), a.data(), wu.data(), wd.data(), n, d, f);
    }
    return std::vector<FVec>{y, dx, dwg, dwu, dwd, ya, dxa};
  };
  const auto fast = run(true), slow = run(false);
  for (size_t i = 0; i < fast.size(); ++i) expect_close(fast[i], slow[i], "mlp");
  expect_thread_invariant([&] { return run(true); }, "mlp");
}

TEST_P(FastTest, AttentionGqa) {
  // One causal block of queries (33 < 64), two whole ones (128), three (150 = 64 + 64 + 22: a last block shorter
  // than the rest).
  for (const int64_t seq : {33, 128, 150}) {
    SCOPED_TRACE("seq " + std::to_string(seq));
    const AttentionShape s{2, seq, 4, 2, 16};
    const int64_t nq = s.batch * s.seq * s.q_heads * s.head_dim, nk = s.batch * s.seq * s.kv_heads * s.head_dim;
    const FVec q = random_vec(nq, 6), k = random_vec(nk, 7), v = random_vec(nk, 8), dout = random_vec(nq, 9);
    auto run = [&](bool fast) {
      FVec out(nq), probs(s.batch * s.q_heads * s.seq * s.seq), dq(nq), dk(nk, 9.0f), dv(nk, 9.0f);
      if (fast) {
        attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
        attention_backward_input(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                 probs.data(), s);
      } else {
        ref::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
        ref::attention_backward_input(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                      probs.data(), s);
      }
      return std::vector<FVec>{out, probs, dq, dk, dv};
    };
    const auto fast = run(true), slow = run(false);
    for (size_t i = 0; i < fast.size(); ++i) expect_close(fast[i], slow[i], "attention");
    expect_thread_invariant([&] { return run(true); }, "attention");
    // The probabilities alone (the backward's recomputation) are the forward's bits; stale contents are overwritten.
    FVec probs(fast[1].size(), std::nanf(""));
    attention_probs(probs.data(), q.data(), k.data(), s);
    EXPECT_EQ(0, std::memcmp(probs.data(), fast[1].data(), probs.size() * sizeof(float)));
  }
}

TEST_P(FastTest, MoeLayer) {
  const int64_t n = 41, d = 24, f = 20;
  RouterConfig cfg{6, 2, ScoreFunc::kSoftmax, true, 0.01};
  const FVec x = random_vec(n * d, 10);
  const FVec wr = random_vec(cfg.num_experts * d, 11);
  const std::vector<float> bias = {0.0f, 0.1f, 0.0f, -0.1f, -100.0f, 0.0f};  // expert 4 is never chosen: empty
  const FVec wg = random_vec(6 * f * d, 12, 0.3f), wu = random_vec(6 * f * d, 13, 0.3f);
  const FVec wd = random_vec(6 * d * f, 14, 0.3f), dy = random_vec(n * d, 15);
  auto run = [&](bool fast) {
    const int64_t rows = n * cfg.top_k;
    FVec scores(n * 6), topk_w(n * 2), xp(rows * d), yp(rows * d), g(rows * f), u(rows * f), h(rows * f), y(n * d);
    FVec dyp(rows * d), dtw(n * 2), dxp(rows * d), dg(rows * f), du(rows * f), dx(n * d), dx2(n * d), dlog(n * 6);
    FVec dwg(6 * f * d, 0.0f), dwu(6 * f * d, 0.0f), dwd(6 * d * f, 0.0f), dwr(6 * d, 0.0f), aux(1);
    std::vector<int32_t> idx(rows);
    if (fast) {
      router_forward(scores.data(), idx.data(), topk_w.data(), aux.data(), x.data(), wr.data(), bias.data(), n, d, cfg);
    } else {
      ref::router_forward(scores.data(), idx.data(), topk_w.data(), aux.data(), x.data(), wr.data(), bias.data(), n, d,
                          cfg);
    }
    const Routing r = build_routing(idx.data(), n, 2, 6);
    EXPECT_EQ(r.count(4), 0);
    if (fast) {
      permute_forward(xp.data(), x.data(), r, d);
      expert_swiglu_forward(yp.data(), g.data(), u.data(), h.data(), xp.data(), wg.data(), wu.data(), wd.data(), r, d,
                            f);
      unpermute_forward(y.data(), yp.data(), topk_w.data(), r, d);
      unpermute_backward_input(dyp.data(), dtw.data(), dy.data(), yp.data(), topk_w.data(), r, d);
      expert_swiglu_backward_input(dxp.data(), dg.data(), du.data(), dyp.data(), g.data(), u.data(), wg.data(),
                                   wu.data(), wd.data(), r, d, f);
      expert_swiglu_backward_weight(dwg.data(), dwu.data(), dwd.data(), dyp.data(), xp.data(), h.data(), dg.data(),
                                    du.data(), r, d, f);
      permute_backward_input(dx.data(), dxp.data(), r, d);
      router_backward_input(dx2.data(), dlog.data(), dtw.data(), scores.data(), idx.data(), topk_w.data(), wr.data(), n,
                            d, cfg);
      router_backward_weight(dwr.data(), dlog.data(), x.data(), n, d, cfg);
    } else {
      ref::permute_forward(xp.data(), x.data(), r, d);
      ref::expert_swiglu_forward(yp.data(), g.data(), u.data(), h.data(), xp.data(), wg.data(), wu.data(), wd.data(), r,
                                 d, f);
      ref::unpermute_forward(y.data(), yp.data(), topk_w.data(), r, d);
      ref::unpermute_backward_input(dyp.data(), dtw.data(), dy.data(), yp.data(), topk_w.data(), r, d);
      ref::expert_swiglu_backward_input(dxp.data(), dg.data(), du.data(), dyp.data(), g.data(), u.data(), wg.data(),
                                        wu.data(), wd.data(), r, d, f);
      ref::expert_swiglu_backward_weight(dwg.data(), dwu.data(), dwd.data(), dyp.data(), xp.data(), h.data(), dg.data(),
                                         du.data(), r, d, f);
      ref::permute_backward_input(dx.data(), dxp.data(), r, d);
      ref::router_backward_input(dx2.data(), dlog.data(), dtw.data(), scores.data(), idx.data(), topk_w.data(),
                                 wr.data(), n, d, cfg);
      ref::router_backward_weight(dwr.data(), dlog.data(), x.data(), n, d, cfg);
    }
    for (int64_t i = 4 * f * d; i < 5 * f * d; ++i) EXPECT_EQ(dwg[i], 0.0f);
    return std::vector<FVec>{y, dx, dx2, dwg, dwu, dwd, dwr, aux};
  };
  const auto fast = run(true), slow = run(false);
  for (size_t i = 0; i < fast.size(); ++i) expect_close(fast[i], slow[i], "moe");
  expect_thread_invariant([&] { return run(true); }, "moe");
}

TEST_P(FastTest, NormEmbeddingAndLmHead) {
  const int64_t n = 19, d = 13, vocab = 31;
  const FVec x = random_vec(n * d, 16), w = random_vec(d, 17), wv = random_vec(vocab * d, 18),
             dy = random_vec(n * d, 19);
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7) % vocab);
  auto run = [&](bool fast) {
    FVec y(n * d), rstd(n), dx(n * d), dw(d, 1.0f), emb(n * d), probs(n * vocab), dh(n * d), dlog(n * vocab);
    FVec dwv(vocab * d, 0.0f), loss(1), rot(n * d - 1), drot(n * d - 1);
    // rotary over x viewed as [batch 2, seq 6, heads 3, head_dim 4] (the first 144 of 247 values)
    if (fast) {
      rotary_forward(rot.data(), x.data(), 2, 6, 3, 4, 500.0);
      rotary_backward_input(drot.data(), dy.data(), 2, 6, 3, 4, 500.0);
    } else {
      ref::rotary_forward(rot.data(), x.data(), 2, 6, 3, 4, 500.0);
      ref::rotary_backward_input(drot.data(), dy.data(), 2, 6, 3, 4, 500.0);
    }
    if (fast) {
      rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, d, 1e-5);
      rmsnorm_backward_input(dx.data(), dy.data(), x.data(), w.data(), rstd.data(), n, d);
      rmsnorm_backward_weight(dw.data(), dy.data(), x.data(), rstd.data(), n, d);
      embedding_forward(emb.data(), ids.data(), wv.data(), n, vocab, d);
      lm_head_loss_forward(loss.data(), probs.data(), y.data(), wv.data(), ids.data(), n, d, vocab);
      lm_head_loss_backward_input(dh.data(), dlog.data(), probs.data(), ids.data(), wv.data(), 1.0f, n, d, vocab);
      lm_head_loss_backward_weight(dwv.data(), dlog.data(), y.data(), n, d, vocab);
    } else {
      ref::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, d, 1e-5);
      ref::rmsnorm_backward_input(dx.data(), dy.data(), x.data(), w.data(), rstd.data(), n, d);
      ref::rmsnorm_backward_weight(dw.data(), dy.data(), x.data(), rstd.data(), n, d);
      ref::embedding_forward(emb.data(), ids.data(), wv.data(), n, vocab, d);
      ref::lm_head_loss_forward(loss.data(), probs.data(), y.data(), wv.data(), ids.data(), n, d, vocab);
      ref::lm_head_loss_backward_input(dh.data(), dlog.data(), probs.data(), ids.data(), wv.data(), 1.0f, n, d, vocab);
      ref::lm_head_loss_backward_weight(dwv.data(), dlog.data(), y.data(), n, d, vocab);
    }
    return std::vector<FVec>{y, dx, dw, emb, loss, dh, dwv, rot, drot};
  };
  const auto fast = run(true), slow = run(false);
  for (size_t i = 0; i < fast.size(); ++i) expect_close(fast[i], slow[i], "norm/head");
  expect_thread_invariant([&] { return run(true); }, "norm/head");
}

INSTANTIATE_TEST_SUITE_P(Backends, FastTest, ::testing::Values(GemmBackend::kOneDnn, GemmBackend::kOpenBlas),
                         [](const ::testing::TestParamInfo<GemmBackend>& param_info) {
                           return std::string(to_string(param_info.param));
                         });

TEST(GemmTest, ParseAndEnvironmentWarning) {
  EXPECT_EQ(*parse_gemm_backend("openblas"), GemmBackend::kOpenBlas);
  EXPECT_FALSE(parse_gemm_backend("mkl").ok());
  EXPECT_NE(gemm_environment_warning(nullptr, true).find("unset"), std::string::npos);
  EXPECT_NE(gemm_environment_warning("Haswell", true).find("Cooperlake"), std::string::npos);
  EXPECT_EQ(gemm_environment_warning("Cooperlake", true), "");
  EXPECT_EQ(gemm_environment_warning("SkylakeX", true), "");
  EXPECT_EQ(gemm_environment_warning(nullptr, false), "");
  EXPECT_EQ(gemm_environment_warning("Haswell", false), "");
  // The warning of this process names the variable whenever it is non-empty.
  const std::string w = gemm_environment_warning();
  if (!w.empty()) {
    EXPECT_NE(w.find("OPENBLAS_CORETYPE"), std::string::npos);
  }
}

}  // namespace
}  // namespace piper::kernels
