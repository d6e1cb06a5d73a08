// Finite-difference checks (double) of the MoE kernels: routers (softmax/sigmoid, normalised or not, aux loss,
// bias, ties), permutation, grouped expert GEMMs with experts that receive no tokens.
#include <gtest/gtest.h>

#include "fd_util.h"
#include "piper/kernels/cpu/moe_reference.h"

namespace piper::kernels {
namespace {

using testing::dot;
using testing::expect_grad;
using testing::RandomSource;
using testing::Vec;

struct RouterCase {
  ScoreFunc score;
  bool norm_topk;
  double aux;
  bool bias;
};

class RouterGradTest : public ::testing::TestWithParam<RouterCase> {};

TEST_P(RouterGradTest, InputAndWeight) {
  const RouterCase c = GetParam();
  const int64_t n = 6, d = 5;
  RouterConfig cfg{4, 2, c.score, c.norm_topk, c.aux};
  RandomSource rs(11);
  Vec x = rs.normal(n * d), wr = rs.normal(cfg.num_experts * d), r = rs.normal(n * cfg.top_k);
  std::vector<float> bias = {0.3f, -0.2f, 0.0f, 0.1f};
  const float* bias_ptr = c.bias ? bias.data() : nullptr;
  Vec scores(n * cfg.num_experts), topk_w(n * cfg.top_k);
  std::vector<int32_t> idx(n * cfg.top_k);
  auto loss = [&] {
    double aux = 0;
    ref::router_forward(scores.data(), idx.data(), topk_w.data(), &aux, x.data(), wr.data(), bias_ptr, n, d, cfg);
    return dot(topk_w, r) + aux;
  };
  loss();
  const std::vector<int32_t> idx0 = idx;
  Vec dx(n * d), dlogits(n * cfg.num_experts), dwr(cfg.num_experts * d, 0.0);
  ref::router_backward_input(dx.data(), dlogits.data(), r.data(), scores.data(), idx.data(), topk_w.data(), wr.data(),
                             n, d, cfg);
  ref::router_backward_weight(dwr.data(), dlogits.data(), x.data(), n, d, cfg);
  expect_grad("dx", &x, dx, loss);
  expect_grad("dwr", &wr, dwr, loss);
  loss();
  EXPECT_EQ(idx, idx0) << "the perturbations changed the selection; the case is not testing what it should";
  if (c.norm_topk) {
    for (int64_t t = 0; t < n; ++t) EXPECT_NEAR(topk_w[t * 2] + topk_w[t * 2 + 1], 1.0, 1e-12);
  }
}

INSTANTIATE_TEST_SUITE_P(Routers, RouterGradTest,
                         ::testing::Values(RouterCase{ScoreFunc::kSoftmax, true, 0.0, false},
                                           RouterCase{ScoreFunc::kSoftmax, false, 0.01, false},
                                           RouterCase{ScoreFunc::kSoftmax, true, 0.1, true},
                                           RouterCase{ScoreFunc::kSigmoid, true, 0.0, true},
                                           RouterCase{ScoreFunc::kSigmoid, false, 0.05, false}),
                         [](const ::testing::TestParamInfo<RouterCase>& param_info) {
                           const RouterCase& c = param_info.param;
                           return std::string(c.score == ScoreFunc::kSoftmax ? "Softmax" : "Sigmoid") +
                                  (c.norm_topk ? "Norm" : "Raw") + (c.aux > 0 ? "Aux" : "") + (c.bias ? "Bias" : "");
                         });

TEST(RouterTest, TiesPickTheLowerExpertAndGradientsHold) {
  // Experts 1 and 2 have identical router rows: every token ties between them, and both are always selected
  // (large scores), so the selection is stable under perturbation; slot 0 must be expert 1.
  const int64_t n = 4, d = 3;
  RouterConfig cfg{4, 2, ScoreFunc::kSoftmax, true, 0.01};
  RandomSource rs(12);
  Vec x = rs.normal(n * d, 0.1);
  for (int64_t t = 0; t < n; ++t) x[t * d] = 1.0 + 0.1 * static_cast<double>(t);
  Vec wr = {-1, 0.1, 0, 3, 0.2, 0.1, 3, 0.2, 0.1, -1, -0.1, 0.3};
  // The loss weighs both slots of a token equally, so it is symmetric in the tied pair even when a
  // perturbation of wr breaks the tie.
  Vec r(n * 2);
  for (int64_t t = 0; t < n; ++t) r[t * 2] = r[t * 2 + 1] = 0.5 + static_cast<double>(t);
  Vec scores(n * 4), topk_w(n * 2);
  std::vector<int32_t> idx(n * 2);
  auto loss = [&] {
    double aux = 0;
    ref::router_forward(scores.data(), idx.data(), topk_w.data(), &aux, x.data(), wr.data(), nullptr, n, d, cfg);
    return dot(topk_w, r) + aux;
  };
  loss();
  for (int64_t t = 0; t < n; ++t) {
    EXPECT_EQ(idx[t * 2], 1);
    EXPECT_EQ(idx[t * 2 + 1], 2);
    EXPECT_DOUBLE_EQ(topk_w[t * 2], 0.5);
  }
  Vec dx(n * d), dlogits(n * 4), dwr(4 * d, 0.0);
  ref::router_backward_input(dx.data(), dlogits.data(), r.data(), scores.data(), idx.data(), topk_w.data(), wr.data(),
                             n, d, cfg);
  ref::router_backward_weight(dwr.data(), dlogits.data(), x.data(), n, d, cfg);
  expect_grad("dx", &x, dx, loss);
  expect_grad("dwr", &wr, dwr, loss);
}

TEST(RouterTest, BiasChangesSelectionNotWeights) {
  const int64_t n = 1, d = 1;
  RouterConfig cfg{3, 1, ScoreFunc::kSigmoid, false, 0.0};
  Vec x = {1.0}, wr = {2.0, 1.0, 0.0};
  Vec scores(3), w(1);
  std::vector<int32_t> idx(1);
  double aux = 0;
  ref::router_forward(scores.data(), idx.data(), w.data(), &aux, x.data(), wr.data(), nullptr, n, d, cfg);
  EXPECT_EQ(idx[0], 0);
  const std::vector<float> bias = {0.0f, 0.0f, 1.0f};  // sigmoid(0) + 1 > sigmoid(2)
  ref::router_forward(scores.data(), idx.data(), w.data(), &aux, x.data(), wr.data(), bias.data(), n, d, cfg);
  EXPECT_EQ(idx[0], 2);
  EXPECT_DOUBLE_EQ(w[0], 0.5);  // the unbiased score of expert 2
}

TEST(RouterTest, UpdateBiasMovesTowardBalance) {
  std::vector<float> bias = {0, 0, 0, 0};
  const std::vector<int64_t> counts = {10, 2, 4, 0};  // mean 4
  router_update_bias(bias.data(), counts.data(), 4, 0.01);
  EXPECT_FLOAT_EQ(bias[0], -0.01f);
  EXPECT_FLOAT_EQ(bias[1], 0.01f);
  EXPECT_FLOAT_EQ(bias[2], 0.0f);
  EXPECT_FLOAT_EQ(bias[3], 0.01f);
}

// 5 tokens, top-2 over 5 experts; expert 3 receives no token.
const std::vector<int32_t> kTopk = {0, 1, 4, 0, 2, 1, 1, 0, 4, 2};

TEST(RoutingTest, CountingSortIsStableAndEmptyExpertsWork) {
  const Routing r = build_routing(kTopk.data(), 5, 2, 5);
  EXPECT_EQ(r.expert_offsets, (std::vector<int64_t>{0, 3, 6, 8, 8, 10}));
  EXPECT_EQ(r.count(3), 0);
  EXPECT_EQ(r.token_of_row, (std::vector<int64_t>{0, 1, 3, 0, 2, 3, 2, 4, 1, 4}));
  for (int64_t s = 0; s < 10; ++s) EXPECT_EQ(r.token_of_row[r.row_of_slot[s]], s / 2);
}

TEST(GradMoeTest, PermuteAndUnpermute) {
  const int64_t n = 5, d = 3, k = 2;
  const Routing r = build_routing(kTopk.data(), n, k, 5);
  RandomSource rs(13);
  Vec x = rs.normal(n * d), rp = rs.normal(n * k * d);
  auto ploss = [&] {
    Vec xp(n * k * d);
    ref::permute_forward(xp.data(), x.data(), r, d);
    return dot(xp, rp);
  };
  Vec dx(n * d);
  ref::permute_backward_input(dx.data(), rp.data(), r, d);
  expect_grad("permute dx", &x, dx, ploss);

  Vec yp = rs.normal(n * k * d), w = rs.normal(n * k), ry = rs.normal(n * d);
  auto uloss = [&] {
    Vec y(n * d);
    ref::unpermute_forward(y.data(), yp.data(), w.data(), r, d);
    return dot(y, ry);
  };
  Vec dyp(n * k * d), dw(n * k);
  ref::unpermute_backward_input(dyp.data(), dw.data(), ry.data(), yp.data(), w.data(), r, d);
  expect_grad("unpermute dyp", &yp, dyp, uloss);
  expect_grad("unpermute dtopk_w", &w, dw, uloss);
}

TEST(GradMoeTest, GroupedLinearWithAnEmptyExpert) {
  const int64_t n = 5, k = 2, in = 3, out = 4, rows = n * k, E = 5;
  const Routing r = build_routing(kTopk.data(), n, k, E);
  RandomSource rs(14);
  Vec x = rs.normal(rows * in), w = rs.normal(E * out * in), ry = rs.normal(rows * out);
  auto loss = [&] {
    Vec y(rows * out);
    ref::grouped_linear_forward(y.data(), x.data(), w.data(), r, in, out);
    return dot(y, ry);
  };
  Vec dx(rows * in), dw(E * out * in, 0.0);
  ref::grouped_linear_backward_input(dx.data(), ry.data(), w.data(), r, in, out);
  ref::grouped_linear_backward_weight(dw.data(), ry.data(), x.data(), r, in, out);
  expect_grad("dx", &x, dx, loss);
  expect_grad("dw", &w, dw, loss);
  for (int64_t i = 3 * out * in; i < 4 * out * in; ++i) EXPECT_EQ(dw[i], 0.0);
}

TEST(GradMoeTest, ExpertSwigluWithAnEmptyExpert) {
  const int64_t n = 5, k = 2, d = 3, f = 4, rows = n * k, E = 5;
  const Routing r = build_routing(kTopk.data(), n, k, E);
  RandomSource rs(15);
  Vec xp = rs.normal(rows * d), wg = rs.normal(E * f * d), wu = rs.normal(E * f * d), wd = rs.normal(E * d * f);
  Vec ry = rs.normal(rows * d);
  Vec yp(rows * d), g(rows * f), u(rows * f), h(rows * f);
  auto loss = [&] {
    ref::expert_swiglu_forward(yp.data(), g.data(), u.data(), h.data(), xp.data(), wg.data(), wu.data(), wd.data(), r,
                               d, f);
    return dot(yp, ry);
  };
  loss();
  Vec dxp(rows * d), dg(rows * f), du(rows * f), dwg(E * f * d, 0.0), dwu(E * f * d, 0.0), dwd(E * d * f, 0.0);
  ref::expert_swiglu_backward_input(dxp.data(), dg.data(), du.data(), ry.data(), g.data(), u.data(), wg.data(),
                                    wu.data(), wd.data(), r, d, f);
  ref::expert_swiglu_backward_weight(dwg.data(), dwu.data(), dwd.data(), ry.data(), xp.data(), h.data(), dg.data(),
                                     du.data(), r, d, f);
  expect_grad("dxp", &xp, dxp, loss);
  expect_grad("dwg", &wg, dwg, loss);
  expect_grad("dwu", &wu, dwu, loss);
  expect_grad("dwd", &wd, dwd, loss);
}

// The whole routed-expert path composed as the executor will run it: the gradient of x arrives by two routes
// (through the experts and through the router weights), and W of router and experts use what B saved.
TEST(GradMoeTest, ComposedMoeLayer) {
  const int64_t n = 7, d = 4, f = 3;
  RouterConfig cfg{4, 2, ScoreFunc::kSoftmax, true, 0.02};
  const int E = cfg.num_experts, K = cfg.top_k;
  const int64_t rows = n * K;
  RandomSource rs(16);
  Vec x = rs.normal(n * d), wr = rs.normal(E * d), wg = rs.normal(E * f * d), wu = rs.normal(E * f * d);
  Vec wd = rs.normal(E * d * f), ry = rs.normal(n * d);
  Vec scores(n * E), topk_w(rows), xp(rows * d), yp(rows * d), g(rows * f), u(rows * f), h(rows * f), y(n * d);
  std::vector<int32_t> idx(rows);
  Routing r;
  auto loss = [&] {
    double aux = 0;
    ref::router_forward(scores.data(), idx.data(), topk_w.data(), &aux, x.data(), wr.data(), nullptr, n, d, cfg);
    r = build_routing(idx.data(), n, K, E);
    ref::permute_forward(xp.data(), x.data(), r, d);
    ref::expert_swiglu_forward(yp.data(), g.data(), u.data(), h.data(), xp.data(), wg.data(), wu.data(), wd.data(), r,
                               d, f);
    ref::unpermute_forward(y.data(), yp.data(), topk_w.data(), r, d);
    return dot(y, ry) + aux;
  };
  loss();
  const std::vector<int32_t> idx0 = idx;
  Vec dyp(rows * d), dtw(rows), dxp(rows * d), dg(rows * f), du(rows * f), dx(n * d), dx_router(n * d), dlog(n * E);
  Vec dwr(E * d, 0.0), dwg(E * f * d, 0.0), dwu(E * f * d, 0.0), dwd(E * d * f, 0.0);
  ref::unpermute_backward_input(dyp.data(), dtw.data(), ry.data(), yp.data(), topk_w.data(), r, d);
  ref::expert_swiglu_backward_input(dxp.data(), dg.data(), du.data(), dyp.data(), g.data(), u.data(), wg.data(),
                                    wu.data(), wd.data(), r, d, f);
  ref::permute_backward_input(dx.data(), dxp.data(), r, d);
  ref::router_backward_input(dx_router.data(), dlog.data(), dtw.data(), scores.data(), idx.data(), topk_w.data(),
                             wr.data(), n, d, cfg);
  for (int64_t i = 0; i < n * d; ++i) dx[i] += dx_router[i];
  ref::router_backward_weight(dwr.data(), dlog.data(), x.data(), n, d, cfg);
  ref::expert_swiglu_backward_weight(dwg.data(), dwu.data(), dwd.data(), dyp.data(), xp.data(), h.data(), dg.data(),
                                     du.data(), r, d, f);
  expect_grad("dx", &x, dx, loss);
  expect_grad("dwr", &wr, dwr, loss);
  expect_grad("dwg", &wg, dwg, loss);
  expect_grad("dwu", &wu, dwu, loss);
  expect_grad("dwd", &wd, dwd, loss);
  loss();
  EXPECT_EQ(idx, idx0) << "a perturbation changed the selection; pick another seed";
}

}  // namespace
}  // namespace piper::kernels
