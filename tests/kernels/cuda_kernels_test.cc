// Every CUDA kernel against the CPU reference (kernels/cpu), on random inputs. Without a GPU every test skips
// with the reason. Tolerances (docs/gpu.md) come from kernels/cuda/host_plan.h:
//   bf16 GEMMs: bf16_gemm_tolerance(Σ|a||b|, k) = (2·2^-8 + 2^-16 + 2.02·k·2^-24)·Σ|a||b| per output element:
//     both operands rounded to bf16 (8 significant bits), then fp32 sums of length k on the GPU and the CPU;
//   fp32 kernels: fp32_tolerance(S, len, ref, ulps) = 2.02·len·2^-24·S + ulps·2^-24·|ref|: reductions of length
//     len in different orders (S = the sum of the magnitudes reduced) plus a few ulps for expf/logf/sqrtf and FMA
//     contraction;
//   gathers and in-order sums without multiplications (embedding, permute backward, column sums): exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fd_util.h"
#include "piper/kernels/cpu/ops.h"
#include "piper/kernels/cpu/optimizer.h"
#include "piper/kernels/cuda/cuda_api.h"
#include "piper/tensor/rng.h"

namespace piper::kernels::cuda {
namespace {

using FVec = std::vector<float>;

using testing::random_vec;

double max_abs(const FVec& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

FVec get(const DeviceBuffer& b, int64_t n) { return download<float>(b.get(), n); }

void expect_within(const FVec& got, const FVec& want, double scale, int64_t len, double ulps, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = fp32_tolerance(scale, len, want[i], ulps);
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), tol)
        << what << "[" << i << "]: gpu " << got[i] << " cpu " << want[i];
  }
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status s = device_status();
    if (!s.ok()) GTEST_SKIP() << s.message();
  }
};

// ---------------------------------------------------------------- GEMMs
TEST_F(CudaKernels, GemmBf16AllTransposesWithBeta) {
  const int64_t m = 67, n = 45, k = 129;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const FVec a = random_vec(m * k, 1 + ta), b = random_vec(k * n, 3 + tb), c0 = random_vec(m * n, 5);
      const int64_t lda = ta ? m : k, ldb = tb ? k : n;
      FVec want = c0, sum_abs(static_cast<size_t>(m * n));
      ref::gemm<float>(ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.5f, want.data(), n);
      FVec aa(a.size()), ab(b.size());
      for (size_t i = 0; i < a.size(); ++i) aa[i] = std::fabs(a[i]);
      for (size_t i = 0; i < b.size(); ++i) ab[i] = std::fabs(b[i]);
      ref::gemm<float>(ta, tb, m, n, k, 1.0f, aa.data(), lda, ab.data(), ldb, 0.0f, sum_abs.data(), n);
      DeviceBuffer da = upload(to_bf16(a)), db = upload(to_bf16(b)), dc = upload(c0);
      gemm_bf16(ta, tb, m, n, k, 1.0f, da.as<Bf16>(), lda, db.as<Bf16>(), ldb, 0.5f, dc.as<float>(), n);
      const FVec got = get(dc, m * n);
      for (int64_t i = 0; i < m * n; ++i) {
        const double tol = bf16_gemm_tolerance(sum_abs[i], k) + 4 * kFp32Unit * std::fabs(c0[i]);
        ASSERT_LE(std::fabs(got[i] - want[i]), tol) << "ta=" << ta << " tb=" << tb << " element " << i;
      }
    }
  }
}

TEST_F(CudaKernels, GemmF32MatchesTheReference) {
  const int64_t m = 33, n = 70, k = 50;
  const FVec a = random_vec(m * k, 11), b = random_vec(n * k, 12);
  FVec want(static_cast<size_t>(m * n));
  ref::gemm<float>(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, want.data(), n);
  DeviceBuffer da = upload(a), db = upload(b), dc = device_array<float>(m * n);
  gemm_f32(false, true, m, n, k, 1.0f, da.as<float>(), k, db.as<float>(), k, 0.0f, dc.as<float>(), n);
  expect_within(get(dc, m * n), want, 4.0 * k, k, 4, "gemm_f32");  // Σ|a||b| <= ~k·E|a||b| for normal inputs
}

TEST_F(CudaKernels, GroupedExpertGemmsBothModes) {
  const int64_t n = 300, in = 64, out = 96;
  const int k = 2, E = 8;
  std::vector<int32_t> idx(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k; ++i) idx[i] = static_cast<int32_t>((i * 5 + i / 7) % E == 3 ? 4 : (i * 5 + i / 7) % E);
  const Routing r = build_routing(idx.data(), n, k, E);  // expert 3 gets no rows
  const int64_t rows = n * k;
  const FVec x = round_bf16(random_vec(rows * in, 21)), w = round_bf16(random_vec(E * out * in, 22, 0.2f));
  const FVec dy = round_bf16(random_vec(rows * out, 23));
  FVec y_ref(static_cast<size_t>(rows * out)), dx_ref(static_cast<size_t>(rows * in));
  FVec dw_ref(static_cast<size_t>(E * out * in), 0.0f);
  ref::grouped_linear_forward<float>(y_ref.data(), x.data(), w.data(), r, in, out);
  ref::grouped_linear_backward_input<float>(dx_ref.data(), dy.data(), w.data(), r, in, out);
  ref::grouped_linear_backward_weight<float>(dw_ref.data(), dy.data(), x.data(), r, in, out);
  DeviceBuffer dx_b = upload(to_bf16(x)), dw_b = upload(to_bf16(w)), ddy_b = upload(to_bf16(dy));
  for (GroupedMode mode : {GroupedMode::kGrouped, GroupedMode::kLoop}) {
    DeviceBuffer y = device_array<float>(rows * out), dxo = device_array<float>(rows * in, true);
    DeviceBuffer dw = device_array<float>(E * out * in, true);
    grouped_gemm_bf16(
        expert_forward_problems(r.expert_offsets, dx_b.as<Bf16>(), dw_b.as<Bf16>(), y.as<float>(), in, out), mode);
    grouped_gemm_bf16(expert_backward_input_problems(r.expert_offsets, ddy_b.as<Bf16>(), dw_b.as<Bf16>(),
                                                     dxo.as<float>(), in, out, 0.0f),
                      mode);
    grouped_gemm_bf16(
        expert_backward_weight_problems(r.expert_offsets, ddy_b.as<Bf16>(), dx_b.as<Bf16>(), dw.as<float>(), in, out),
        mode);
    // Operands already bf16: only the fp32 accumulation order differs (|terms| ~ 0.2 each for these scales).
    expect_within(get(y, rows * out), y_ref, 0.2 * in, in, 4, "grouped forward");
    expect_within(get(dxo, rows * in), dx_ref, 0.2 * out, out, 4, "grouped backward input");
    expect_within(get(dw, E * out * in), dw_ref, 0.2 * rows, rows, 4, "grouped backward weight");
  }
}

// ---------------------------------------------------------------- dense element-wise
TEST_F(CudaKernels, EmbeddingForwardAndBackwardAreExact) {
  const int64_t n = 97, vocab = 50, d = 40;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 13 + 7) % 37);
  const FVec table = random_vec(vocab * d, 31), dout = random_vec(n * d, 32);
  FVec out_ref(static_cast<size_t>(n * d)), dt_ref = random_vec(vocab * d, 33);
  const FVec dt0 = dt_ref;
  ref::embedding_forward<float>(out_ref.data(), ids.data(), table.data(), n, vocab, d);
  ref::embedding_backward_weight<float>(dt_ref.data(), dout.data(), ids.data(), n, vocab, d);
  const EmbeddingPlan plan = build_embedding_plan(ids.data(), n, vocab);
  DeviceBuffer dids = upload(ids), dtab = upload(table), dout_d = upload(dout), dt = upload(dt0);
  DeviceBuffer off = upload(plan.offsets), tok = upload(plan.tokens), out = device_array<float>(n * d);
  embedding_forward(out.as<float>(), dids.as<int32_t>(), dtab.as<float>(), n, d);
  embedding_backward_weight(dt.as<float>(), dout_d.as<float>(), off.as<int64_t>(), tok.as<int64_t>(), vocab, d);
  EXPECT_EQ(get(out, n * d), out_ref);
  EXPECT_EQ(get(dt, vocab * d), dt_ref);
}

TEST_F(CudaKernels, RmsNormForwardBackward) {
  const int64_t n = 19, d = 300;
  const FVec x = random_vec(n * d, 41), w = random_vec(d, 42), dy = random_vec(n * d, 43), res = random_vec(n * d, 44);
  FVec y(static_cast<size_t>(n * d)), rstd(static_cast<size_t>(n)), dx(y.size()), dw = random_vec(d, 45);
  const FVec dw0 = dw;
  ref::rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), w.data(), n, d, 1e-5);
  ref::rmsnorm_backward_input<float>(dx.data(), dy.data(), x.data(), w.data(), rstd.data(), n, d);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] += res[i];
  ref::rmsnorm_backward_weight<float>(dw.data(), dy.data(), x.data(), rstd.data(), n, d);
  DeviceBuffer dxin = upload(x), dwt = upload(w), ddy = upload(dy), dres = upload(res), ddw = upload(dw0);
  DeviceBuffer gy = device_array<float>(n * d), gyb = device_array<Bf16>(n * d), gr = device_array<float>(n);
  DeviceBuffer gdx = device_array<float>(n * d);
  rmsnorm_forward(gy.as<float>(), gyb.as<Bf16>(), gr.as<float>(), dxin.as<float>(), dwt.as<float>(), n, d, 1e-5);
  rmsnorm_backward_input(gdx.as<float>(), ddy.as<float>(), dxin.as<float>(), dwt.as<float>(), gr.as<float>(),
                         dres.as<float>(), n, d);
  rmsnorm_backward_weight(ddw.as<float>(), ddy.as<float>(), dxin.as<float>(), gr.as<float>(), n, d);
  const FVec gyv = get(gy, n * d);
  expect_within(gyv, y, max_abs(y), d, 16, "rmsnorm y");
  expect_within(get(gr, n), rstd, max_abs(rstd), d, 16, "rmsnorm rstd");
  expect_within(get(gdx, n * d), dx, 4 * max_abs(dx), d, 16, "rmsnorm dx");
  expect_within(get(ddw, d), dw, 4 * max_abs(dw), n, 16, "rmsnorm dw");
  const auto yb = download<Bf16>(gyb.get(), n * d);
  for (int64_t i = 0; i < n * d; ++i) ASSERT_EQ(yb[i], to_bf16(gyv[i])) << "bf16 copy " << i;
}

TEST_F(CudaKernels, RotaryForwardBackward) {
  const int64_t batch = 2, seq = 29, heads = 3, hd = 16;
  const FVec x = random_vec(batch * seq * heads * hd, 51);
  FVec f(x.size()), b(x.size());
  ref::rotary_forward<float>(f.data(), x.data(), batch, seq, heads, hd, 10000.0);
  ref::rotary_backward_input<float>(b.data(), x.data(), batch, seq, heads, hd, 10000.0);
  DeviceBuffer dx = upload(x), out = device_array<float>(static_cast<int64_t>(x.size()));
  rotary(out.as<float>(), dx.as<float>(), batch, seq, heads, hd, 10000.0, 1.0);
  expect_within(get(out, static_cast<int64_t>(x.size())), f, max_abs(x), 2, 8, "rotary forward");
  rotary(dx.as<float>(), dx.as<float>(), batch, seq, heads, hd, 10000.0, -1.0);  // in place
  expect_within(get(dx, static_cast<int64_t>(x.size())), b, max_abs(x), 2, 8, "rotary backward");
}

TEST_F(CudaKernels, SwigluActivation) {
  const int64_t count = 5000;
  const FVec g = random_vec(count, 61, 3.0f), u = random_vec(count, 62), dh = random_vec(count, 63);
  FVec h(count), dg(count), du(count);
  for (int64_t i = 0; i < count; ++i) {  // the formulas of ref::swiglu_forward / swiglu_backward_input
    const float sig = 1.0f / (1.0f + std::exp(-g[i]));
    h[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    du[i] = dh[i] * g[i] * sig;
    dg[i] = dh[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  }
  DeviceBuffer G = upload(g), U = upload(u), DH = upload(dh), H = device_array<float>(count);
  DeviceBuffer HB = device_array<Bf16>(count), DG = device_array<float>(count), DU = device_array<float>(count);
  swiglu_act_forward(H.as<float>(), HB.as<Bf16>(), G.as<float>(), U.as<float>(), count);
  swiglu_act_backward(DG.as<float>(), DU.as<float>(), DH.as<float>(), G.as<float>(), U.as<float>(), count);
  expect_within(get(H, count), h, 0, 1, 32, "swiglu h");
  expect_within(get(DG, count), dg, max_abs(dg), 2, 64, "swiglu dg");  // 1 + g(1 - sig) cancels: absolute slack
  expect_within(get(DU, count), du, 0, 1, 32, "swiglu du");
}

// ---------------------------------------------------------------- attention
void check_attention(const AttnShape s, uint64_t seed) {
  const int64_t qn = s.batch * s.seq * s.q_heads * s.head_dim, kn = s.batch * s.seq * s.kv_heads * s.head_dim;
  const FVec q = random_vec(qn, seed), k = random_vec(kn, seed + 1), v = random_vec(kn, seed + 2);
  const FVec dout = random_vec(qn, seed + 3);
  const AttentionShape cs{s.batch, s.seq, s.q_heads, s.kv_heads, s.head_dim};
  FVec out(qn), probs(static_cast<size_t>(s.batch * s.q_heads * s.seq * s.seq)), dq(qn), dk(kn), dv(kn);
  ref::attention_forward<float>(out.data(), probs.data(), q.data(), k.data(), v.data(), cs);
  ref::attention_backward_input<float>(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                       probs.data(), cs);
  DeviceBuffer Q = upload(q), K = upload(k), V = upload(v), DO = upload(dout), O = device_array<float>(qn);
  DeviceBuffer L = device_array<float>(s.batch * s.q_heads * s.seq), DQ = device_array<float>(qn);
  DeviceBuffer DK = device_array<float>(kn), DV = device_array<float>(kn);
  attention_forward(O.as<float>(), L.as<float>(), Q.as<float>(), K.as<float>(), V.as<float>(), s);
  attention_backward(DQ.as<float>(), DK.as<float>(), DV.as<float>(), DO.as<float>(), O.as<float>(), L.as<float>(),
                     Q.as<float>(), K.as<float>(), V.as<float>(), s);
  // Scores are hd-long dot products, outputs and gradients sums over up to seq · group keys or queries; the
  // magnitudes reduced are bounded by a few times the largest input or output.
  const int64_t group = s.q_heads / s.kv_heads, len = s.seq * group + s.head_dim;
  const double S = 4 * std::max({max_abs(v), max_abs(dout), max_abs(out), max_abs(dq), max_abs(dk), max_abs(dv)});
  expect_within(get(O, qn), out, S, len, 256, "attention out");
  expect_within(get(DQ, qn), dq, S, len, 256, "attention dq");
  expect_within(get(DK, kn), dk, S, len, 256, "attention dk");
  expect_within(get(DV, kn), dv, S, len, 256, "attention dv");
  // Determinism: the backward again gives the same bits.
  const FVec dk1 = get(DK, kn);
  attention_backward(DQ.as<float>(), DK.as<float>(), DV.as<float>(), DO.as<float>(), O.as<float>(), L.as<float>(),
                     Q.as<float>(), K.as<float>(), V.as<float>(), s);
  EXPECT_EQ(get(DK, kn), dk1);
}

TEST_F(CudaKernels, AttentionCausalGqa) { check_attention({2, 37, 4, 2, 32}, 71); }
TEST_F(CudaKernels, AttentionOddHeadDimMqa) { check_attention({1, 50, 3, 1, 80}, 81); }
TEST_F(CudaKernels, AttentionMhaLongHead) { check_attention({1, 20, 2, 2, 256}, 91); }

// ---------------------------------------------------------------- router, permutation
TEST_F(CudaKernels, RouterSelectAndDlogits) {
  const int64_t n = 200;
  const int E = 16, K = 3;
  for (int variant = 0; variant < 2; ++variant) {
    RouterConfig cfg;
    cfg.num_experts = E, cfg.top_k = K;
    cfg.score = variant == 0 ? ScoreFunc::kSoftmax : ScoreFunc::kSigmoid;
    cfg.norm_topk = variant == 0;
    cfg.aux_loss_coef = 0.01;
    const FVec logits = random_vec(n * E, 101 + variant, 2.0f), dtw = random_vec(n * K, 103);
    const FVec bias = variant == 1 ? random_vec(E, 105, 0.05f) : FVec();
    FVec scores = logits, topk_w(static_cast<size_t>(n * K)), dl(static_cast<size_t>(n * E));
    std::vector<int32_t> idx(static_cast<size_t>(n * K));
    float aux = 0;
    ref::router_select<float>(scores.data(), idx.data(), topk_w.data(), &aux, bias.empty() ? nullptr : bias.data(), n,
                              cfg);
    ref::router_dlogits<float>(dl.data(), dtw.data(), scores.data(), idx.data(), topk_w.data(), n, cfg);
    std::vector<int64_t> counts(E, 0);
    for (int32_t e : idx) ++counts[e];
    FVec aux_ds(E);
    for (int e = 0; e < E; ++e) {
      aux_ds[e] = static_cast<float>(cfg.aux_loss_coef * E) * static_cast<float>(counts[e]) /
                  static_cast<float>(n * K) / static_cast<float>(n);
    }
    DeviceBuffer S = upload(logits), I = device_array<int32_t>(n * K), W = device_array<float>(n * K);
    DeviceBuffer B = upload(bias), DT = upload(dtw), AX = upload(aux_ds), DL = device_array<float>(n * E);
    router_select(S.as<float>(), I.as<int32_t>(), W.as<float>(), bias.empty() ? nullptr : B.as<float>(), n, E, K,
                  variant == 0, cfg.norm_topk);
    ASSERT_EQ(download<int32_t>(I.get(), n * K), idx) << "variant " << variant;
    expect_within(get(S, n * E), scores, 1.0, E, 16, "router scores");
    expect_within(get(W, n * K), topk_w, 1.0, K, 16, "router topk_w");
    router_dlogits(DL.as<float>(), DT.as<float>(), S.as<float>(), I.as<int32_t>(), W.as<float>(), AX.as<float>(), n, E,
                   K, variant == 0, cfg.norm_topk);
    expect_within(get(DL, n * E), dl, 4 * max_abs(dl), E + K, 32, "router dlogits");
  }
}

TEST_F(CudaKernels, ColumnSumsAreExactInRowOrder) {
  const int64_t rows = 333, cols = 7;
  const FVec x = random_vec(rows * cols, 111);
  std::vector<double> want(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) want[c] += static_cast<double>(x[r * cols + c]);
  }
  DeviceBuffer X = upload(x), O = device_array<double>(cols);
  column_sums(O.as<double>(), X.as<float>(), rows, cols);
  EXPECT_EQ(download<double>(O.get(), cols), want);
}

TEST_F(CudaKernels, PermuteAndUnpermute) {
  const int64_t n = 61, d = 130;
  const int K = 2, E = 6;
  std::vector<int32_t> idx(static_cast<size_t>(n * K));
  for (int64_t t = 0; t < n; ++t)
    idx[t * K] = static_cast<int32_t>(t % E), idx[t * K + 1] = static_cast<int32_t>((t * 5 + 1) % E);
  const Routing r = build_routing(idx.data(), n, K, E);
  const int64_t rows = n * K;
  const FVec x = random_vec(n * d, 121), yp = random_vec(rows * d, 122), tw = random_vec(n * K, 123);
  const FVec dy = random_vec(n * d, 124), dxp = random_vec(rows * d, 125), res = random_vec(n * d, 126);
  const float scale = 2.5f;
  FVec xp(static_cast<size_t>(rows * d)), dx(static_cast<size_t>(n * d)), y(dx.size());
  ref::permute_forward<float>(xp.data(), x.data(), r, d);
  ref::permute_backward_input<float>(dx.data(), dxp.data(), r, d);
  ref::unpermute_forward<float>(y.data(), yp.data(), tw.data(), r, d);
  for (int64_t i = 0; i < n * d; ++i) y[i] = res[i] + scale * y[i];  // the experts chunk's residual and scaling
  FVec dys(dy.size()), dyp(static_cast<size_t>(rows * d)), dtw(static_cast<size_t>(n * K));
  for (size_t i = 0; i < dy.size(); ++i) dys[i] = dy[i] * scale;
  ref::unpermute_backward_input<float>(dyp.data(), dtw.data(), dys.data(), yp.data(), tw.data(), r, d);

  DeviceBuffer X = upload(x), YP = upload(yp), TW = upload(tw), DY = upload(dy), DXP = upload(dxp), RES = upload(res);
  DeviceBuffer ROS = upload(r.row_of_slot), TOR = upload(r.token_of_row);
  DeviceBuffer XP = device_array<float>(rows * d), XPB = device_array<Bf16>(rows * d), DX = device_array<float>(n * d);
  DeviceBuffer Y = device_array<float>(n * d), DYP = device_array<float>(rows * d), DYPB = device_array<Bf16>(rows * d);
  DeviceBuffer DTW = device_array<float>(n * K);
  permute_forward(XP.as<float>(), XPB.as<Bf16>(), X.as<float>(), TOR.as<int64_t>(), rows, d);
  permute_backward(DX.as<float>(), DXP.as<float>(), ROS.as<int64_t>(), nullptr, n, K, d);
  unpermute_forward(Y.as<float>(), YP.as<float>(), TW.as<float>(), ROS.as<int64_t>(), RES.as<float>(), scale, n, K, d);
  unpermute_backward(DYP.as<float>(), DYPB.as<Bf16>(), DTW.as<float>(), DY.as<float>(), YP.as<float>(), TW.as<float>(),
                     ROS.as<int64_t>(), scale, n, K, d);
  EXPECT_EQ(get(XP, rows * d), xp);
  EXPECT_EQ(download<Bf16>(XPB.get(), rows * d), to_bf16(xp));
  EXPECT_EQ(get(DX, n * d), dx);  // K adds in slot order, no multiplication: exact
  expect_within(get(Y, n * d), y, scale * 4 * max_abs(yp), K + 1, 8, "unpermute forward");
  expect_within(get(DYP, rows * d), dyp, 0, 1, 8, "unpermute backward dyp");
  expect_within(get(DTW, n * K), dtw, scale * 4 * static_cast<double>(d), d, 16, "unpermute backward dtopk_w");
}

// ---------------------------------------------------------------- loss, optimizer
TEST_F(CudaKernels, LmHeadLoss) {
  const int64_t n = 45, d = 64, V = 1000;
  const FVec h = random_vec(n * d, 131), w = random_vec(V * d, 132, 0.2f);
  std::vector<int32_t> targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) targets[i] = static_cast<int32_t>((i * 97 + 5) % V);
  float loss = 0;
  FVec probs(static_cast<size_t>(n * V)), dh(static_cast<size_t>(n * d)), dl(probs.size());
  ref::lm_head_loss_forward<float>(&loss, probs.data(), h.data(), w.data(), targets.data(), n, d, V);
  ref::lm_head_loss_backward_input<float>(dh.data(), dl.data(), probs.data(), targets.data(), w.data(), 0.5f, n, d, V);
  DeviceBuffer H = upload(h), W = upload(w), T = upload(targets), P = device_array<float>(n * V);
  DeviceBuffer RL = device_array<float>(n), DL = device_array<float>(n * V), DLB = device_array<Bf16>(n * V);
  DeviceBuffer DH = device_array<float>(n * d);
  gemm_f32(false, true, n, V, d, 1.0f, H.as<float>(), d, W.as<float>(), d, 0.0f, P.as<float>(), V);
  softmax_xent_forward(P.as<float>(), RL.as<float>(), T.as<int32_t>(), n, V);
  softmax_xent_backward(DL.as<float>(), DLB.as<Bf16>(), P.as<float>(), T.as<int32_t>(), 0.5f / n, n, V);
  gemm_f32(false, false, n, d, V, 1.0f, DL.as<float>(), V, W.as<float>(), d, 0.0f, DH.as<float>(), d);
  double total = 0;
  for (float l : get(RL, n)) total += l;
  const double logit_scale = 0.2 * std::sqrt(static_cast<double>(d)) * 4;  // |logit| bound used for the tolerance
  EXPECT_NEAR(total / n, loss, fp32_tolerance(logit_scale + std::log(V), d + V, loss, 64));
  // probs: logits from d-long fp32 dot products, normalised by a V-long sum.
  expect_within(get(P, n * V), probs, max_abs(probs), d + V, 256, "probs");
  expect_within(get(DL, n * V), dl, max_abs(dl), d + V, 256, "dlogits");
  expect_within(get(DH, n * d), dh, 4 * max_abs(dh) + 0.5 / n, V + d, 256, "dh");
}

TEST_F(CudaKernels, AdamWAndGradNorm) {
  const int64_t n = 10000;
  const FVec p0 = random_vec(n, 141), g = random_vec(n, 142, 0.1f), m0 = random_vec(n, 143, 0.01f);
  FVec v0 = random_vec(n, 144, 0.001f);
  for (float& x : v0) x = std::fabs(x);
  AdamWConfig cfg;
  cfg.lr = 1e-3, cfg.weight_decay = 0.1;
  FVec p = p0, m = m0, v = v0;
  adamw_step(p.data(), g.data(), m.data(), v.data(), n, cfg, 3, 0.7, true);
  AdamWArgs a;
  a.lr = static_cast<float>(cfg.lr), a.b1 = static_cast<float>(cfg.beta1), a.b2 = static_cast<float>(cfg.beta2);
  a.bc1 = static_cast<float>(1.0 - std::pow(cfg.beta1, 3.0)),
  a.bc2 = static_cast<float>(1.0 - std::pow(cfg.beta2, 3.0));
  a.eps = static_cast<float>(cfg.eps), a.wd = static_cast<float>(cfg.weight_decay), a.grad_scale = 0.7f;
  DeviceBuffer P = upload(p0), G = upload(g), M = upload(m0), Vv = upload(v0), PB = device_array<Bf16>(n);
  adamw(P.as<float>(), PB.as<Bf16>(), G.as<float>(), M.as<float>(), Vv.as<float>(), n, a);
  const FVec gp = get(P, n);
  // Two-term sums that may cancel (FMA contraction on the GPU): absolute slack of the inputs' size.
  expect_within(gp, p, max_abs(p), 2, 16, "adamw p");
  expect_within(get(M, n), m, max_abs(m), 2, 8, "adamw m");
  expect_within(get(Vv, n), v, max_abs(v), 2, 8, "adamw v");
  EXPECT_EQ(download<Bf16>(PB.get(), n), to_bf16(gp));
  const int64_t blocks = (n + kNormBlock - 1) / kNormBlock;
  DeviceBuffer parts = device_array<double>(blocks);
  sum_squares_blocks(parts.as<double>(), G.as<float>(), n);
  double total = 0;
  for (double x : download<double>(parts.get(), blocks)) total += x;
  const double want = grad_global_norm({{g.data(), n}});
  EXPECT_NEAR(std::sqrt(total), want, 1e-12 * want);
}

}  // namespace
}  // namespace piper::kernels::cuda
