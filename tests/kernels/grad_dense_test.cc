// Finite-difference checks (double) of every dense kernel: B and W separately, odd shapes.
#include <gtest/gtest.h>

#include "fd_util.h"
#include "piper/kernels/cpu/reference.h"

namespace piper::kernels {
namespace {

using testing::dot;
using testing::expect_grad;
using testing::RandomSource;
using testing::Vec;

TEST(GradDenseTest, EmbeddingWeight) {
  const int64_t n = 5, vocab = 7, d = 3;
  RandomSource rs(1);
  Vec table = rs.normal(vocab * d), r = rs.normal(n * d);
  const std::vector<int32_t> ids = {3, 0, 3, 6, 2};  // repeated id 3
  auto loss = [&] {
    Vec out(n * d);
    ref::embedding_forward(out.data(), ids.data(), table.data(), n, vocab, d);
    return dot(out, r);
  };
  Vec dtable(vocab * d, 0.0);
  ref::embedding_backward_weight(dtable.data(), r.data(), ids.data(), n, vocab, d);
  expect_grad("dtable", &table, dtable, loss);
  // W accumulates.
  Vec twice = dtable;
  ref::embedding_backward_weight(twice.data(), r.data(), ids.data(), n, vocab, d);
  for (size_t i = 0; i < twice.size(); ++i) EXPECT_DOUBLE_EQ(twice[i], 2 * dtable[i]);
}

TEST(GradDenseTest, RmsNormInputAndWeight) {
  const int64_t n = 3, d = 5;
  RandomSource rs(2);
  Vec x = rs.normal(n * d), w = rs.normal(d), r = rs.normal(n * d);
  auto loss = [&] {
    Vec y(n * d), rstd(n);
    ref::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, d, 1e-5);
    return dot(y, r);
  };
  Vec y(n * d), rstd(n), dx(n * d), dw(d, 0.0);
  ref::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), n, d, 1e-5);
  ref::rmsnorm_backward_input(dx.data(), r.data(), x.data(), w.data(), rstd.data(), n, d);
  ref::rmsnorm_backward_weight(dw.data(), r.data(), x.data(), rstd.data(), n, d);
  expect_grad("dx", &x, dx, loss);
  expect_grad("dw", &w, dw, loss);
}

TEST(GradDenseTest, RotaryInput) {
  for (int64_t hd : {4, 6}) {
    const int64_t b = 2, seq = 3, heads = 2, n = b * seq * heads * hd;
    RandomSource rs(3);
    Vec x = rs.normal(n), r = rs.normal(n);
    auto loss = [&] {
      Vec out(n);
      ref::rotary_forward(out.data(), x.data(), b, seq, heads, hd, 10000.0);
      return dot(out, r);
    };
    Vec dx(n);
    ref::rotary_backward_input(dx.data(), r.data(), b, seq, heads, hd, 10000.0);
    expect_grad("dx", &x, dx, loss);
    // Position 0 is not rotated; the rotation keeps norms.
    Vec out(n);
    ref::rotary_forward(out.data(), x.data(), b, seq, heads, hd, 10000.0);
    for (int64_t c = 0; c < heads * hd; ++c) EXPECT_DOUBLE_EQ(out[c], x[c]);
    EXPECT_NEAR(dot(out, out), dot(x, x), 1e-9);
  }
}

void check_attention(int64_t q_heads, int64_t kv_heads) {
  const AttentionShape s{2, 5, q_heads, kv_heads, 3};
  const int64_t nq = s.batch * s.seq * q_heads * s.head_dim, nk = s.batch * s.seq * kv_heads * s.head_dim;
  RandomSource rs(4 + q_heads * 10 + kv_heads);
  Vec q = rs.normal(nq), k = rs.normal(nk), v = rs.normal(nk), r = rs.normal(nq);
  Vec probs(s.batch * q_heads * s.seq * s.seq);
  auto loss = [&] {
    Vec out(nq);
    ref::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
    return dot(out, r);
  };
  loss();
  Vec dq(nq), dk(nk), dv(nk);
  ref::attention_backward_input(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), probs.data(),
                                s);
  expect_grad("dq", &q, dq, loss);
  expect_grad("dk", &k, dk, loss);
  expect_grad("dv", &v, dv, loss);
  // Causality: the first query attends only to the first key.
  EXPECT_DOUBLE_EQ(probs[0], 1.0);
  EXPECT_DOUBLE_EQ(probs[1], 0.0);
}

TEST(GradDenseTest, AttentionMha) { check_attention(2, 2); }
TEST(GradDenseTest, AttentionGqa) { check_attention(4, 2); }
TEST(GradDenseTest, AttentionMqa) { check_attention(3, 1); }

TEST(GradDenseTest, LinearInputAndWeight) {
  const int64_t n = 3, in = 5, out = 4;
  RandomSource rs(5);
  Vec x = rs.normal(n * in), w = rs.normal(out * in), r = rs.normal(n * out);
  auto loss = [&] {
    Vec y(n * out);
    ref::linear_forward(y.data(), x.data(), w.data(), n, in, out);
    return dot(y, r);
  };
  Vec dx(n * in), dw(out * in, 0.0);
  ref::linear_backward_input(dx.data(), r.data(), w.data(), n, in, out);
  ref::linear_backward_weight(dw.data(), r.data(), x.data(), n, in, out);
  expect_grad("dx", &x, dx, loss);
  expect_grad("dw", &w, dw, loss);
}

TEST(GradDenseTest, SwigluInputAndWeight) {
  const int64_t n = 3, d = 5, f = 7;
  RandomSource rs(6);
  Vec x = rs.normal(n * d), wg = rs.normal(f * d, 0.5), wu = rs.normal(f * d, 0.5), wd = rs.normal(d * f, 0.5);
  Vec r = rs.normal(n * d);
  Vec y(n * d), g(n * f), u(n * f), h(n * f);
  auto loss = [&] {
    ref::swiglu_forward(y.data(), g.data(), u.data(), h.data(), x.data(), wg.data(), wu.data(), wd.data(), n, d, f);
    return dot(y, r);
  };
  loss();
  Vec dx(n * d), dg(n * f), du(n * f), dwg(f * d, 0.0), dwu(f * d, 0.0), dwd(d * f, 0.0);
  ref::swiglu_backward_input(dx.data(), dg.data(), du.data(), r.data(), g.data(), u.data(), wg.data(), wu.data(),
                             wd.data(), n, d, f);
  ref::swiglu_backward_weight(dwg.data(), dwu.data(), dwd.data(), r.data(), x.data(), h.data(), dg.data(), du.data(), n,
                              d, f);
  expect_grad("dx", &x, dx, loss);
  expect_grad("dwg", &wg, dwg, loss);
  expect_grad("dwu", &wu, dwu, loss);
  expect_grad("dwd", &wd, dwd, loss);
}

TEST(GradDenseTest, GeluMlpInputAndWeight) {
  const int64_t n = 4, d = 3, f = 5;
  RandomSource rs(7);
  Vec x = rs.normal(n * d), wu = rs.normal(f * d), wd = rs.normal(d * f), r = rs.normal(n * d);
  Vec y(n * d), a(n * f), h(n * f);
  auto loss = [&] {
    ref::gelu_mlp_forward(y.data(), a.data(), h.data(), x.data(), wu.data(), wd.data(), n, d, f);
    return dot(y, r);
  };
  loss();
  Vec dx(n * d), da(n * f), dwu(f * d, 0.0), dwd(d * f, 0.0);
  ref::gelu_mlp_backward_input(dx.data(), da.data(), r.data(), a.data(), wu.data(), wd.data(), n, d, f);
  ref::gelu_mlp_backward_weight(dwu.data(), dwd.data(), r.data(), x.data(), h.data(), da.data(), n, d, f);
  expect_grad("dx", &x, dx, loss);
  expect_grad("dwu", &wu, dwu, loss);
  expect_grad("dwd", &wd, dwd, loss);
}

TEST(GradDenseTest, LmHeadLossInputAndWeight) {
  const int64_t n = 4, d = 5, vocab = 7;
  RandomSource rs(8);
  Vec h = rs.normal(n * d), w = rs.normal(vocab * d);
  const std::vector<int32_t> targets = {0, 6, 3, 3};
  Vec probs(n * vocab);
  auto loss = [&] {
    double l = 0;
    ref::lm_head_loss_forward(&l, probs.data(), h.data(), w.data(), targets.data(), n, d, vocab);
    return 2.0 * l;  // the objective is 2 · loss, so dloss = 2
  };
  const double l0 = loss() / 2.0;
  EXPECT_GT(l0, 0.0);
  Vec dh(n * d), dlogits(n * vocab), dw(vocab * d, 0.0);
  ref::lm_head_loss_backward_input(dh.data(), dlogits.data(), probs.data(), targets.data(), w.data(), 2.0, n, d, vocab);
  ref::lm_head_loss_backward_weight(dw.data(), dlogits.data(), h.data(), n, d, vocab);
  expect_grad("dh", &h, dh, loss);
  expect_grad("dw", &w, dw, loss);
  // Zero weights: uniform prediction, loss = ln(vocab).
  Vec zero_w(vocab * d, 0.0);
  double lu = 0;
  ref::lm_head_loss_forward(&lu, probs.data(), h.data(), zero_w.data(), targets.data(), n, d, vocab);
  EXPECT_NEAR(lu, std::log(7.0), 1e-12);
}

}  // namespace
}  // namespace piper::kernels
