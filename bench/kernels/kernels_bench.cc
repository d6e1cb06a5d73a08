// kernels_bench: a tiny-moe-shaped transformer layer (attention + MoE, 8 experts top-2, d = 128, seq 128),
// forward + backward (B and W), and its achieved FLOP/s as a fraction of the same GEMM library's square sgemm
// FLOP/s measured in the same run, for each GEMM backend and thread count. Goal: ratio >= 0.5.
//
// Usage: kernels_bench [--batch B] [--iters N] [--threads T,T,...] [--backends onednn,openblas]
// On a shared machine run with OMP_WAIT_POLICY=passive (spinning OpenMP threads fight for the cores).
// Layer FLOPs are model FLOPs: matmuls counted once (2·m·n·k; backward = 2× forward), attention scores and
// values counted for the causal half only, element-wise work not counted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "piper/kernels/cpu/gemm.h"
#include "piper/kernels/cpu/ops.h"
#include "piper/tensor/rng.h"

namespace piper::kernels {
namespace {

using FVec = std::vector<float>;

FVec random_vec(int64_t n, uint64_t seed, float scale) {
  FVec v(static_cast<size_t>(n));
  fill_normal(v.data(), n, Rng(seed), 0, 0.0f, scale);
  return v;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU seconds of the whole process (all threads). On a shared machine the wall time includes waiting for a core;
// the CPU time does not, so the ratio of CPU-time rates is the steadier efficiency measure.
double cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Seconds {
  double wall = 1e30, cpu = 1e30;
  void keep_best(const Seconds& o) {
    wall = std::min(wall, o.wall);
    cpu = std::min(cpu, o.cpu);
  }
};

// Seconds of one square sgemm of the given size (the caller keeps the best of several).
Seconds square_sgemm_seconds(int64_t size) {
  static FVec a, b, c;
  if (static_cast<int64_t>(a.size()) != size * size) {
    a = random_vec(size * size, 1, 1.0f);
    b = random_vec(size * size, 2, 1.0f);
    c.assign(static_cast<size_t>(size * size), 0.0f);
  }
  const double t0 = now_s(), c0 = cpu_s();
  sgemm(false, false, size, size, size, 1.0f, a.data(), size, b.data(), size, 0.0f, c.data(), size);
  return {now_s() - t0, cpu_s() - c0};
}

struct Layer {
  // tiny-moe shapes
  int64_t batch, seq = 128, d = 128, q_heads = 4, kv_heads = 2, hd = 32, f = 256;
  RouterConfig cfg{8, 2, ScoreFunc::kSoftmax, true, 0.01};
  int64_t n() const { return batch * seq; }
  int64_t qkv() const { return (q_heads + 2 * kv_heads) * hd; }

  double flops() const {
    const double tokens = static_cast<double>(n());
    const double fwd_matmul =
        2.0 * tokens * (d * qkv() + q_heads * hd * d + d * cfg.num_experts + cfg.top_k * 3.0 * d * f);
    const double fwd_attn = 2.0 * 2.0 * static_cast<double>(batch * q_heads * hd) * (seq * (seq + 1) / 2.0);
    return 3.0 * (fwd_matmul + fwd_attn);
  }
};

// Runs the layer forward + backward `1 + repeats` times (the first warms up) and returns the best step time.
// Buffers are allocated and filled once, outside the timed region.
Seconds layer_seconds(const Layer& L, int repeats, const std::function<void()>& between) {
  const int64_t n = L.n(), d = L.d, f = L.f, E = L.cfg.num_experts, rows = n * L.cfg.top_k, qkv = L.qkv();
  const int64_t nq = n * L.q_heads * L.hd, nk = n * L.kv_heads * L.hd;
  const AttentionShape as{L.batch, L.seq, L.q_heads, L.kv_heads, L.hd};
  const FVec x = random_vec(n * d, 3, 1.0f), w_norm1(d, 1.0f), w_norm2(d, 1.0f);
  const FVec w_qkv = random_vec(qkv * d, 4, 0.08f), w_o = random_vec(d * L.q_heads * L.hd, 5, 0.08f);
  const FVec w_r = random_vec(E * d, 6, 0.08f), wg = random_vec(E * f * d, 7, 0.08f);
  const FVec wu = random_vec(E * f * d, 8, 0.08f), wd = random_vec(E * d * f, 9, 0.06f),
             dy = random_vec(n * d, 10, 1.0f);
  // activations
  FVec h1(n * d), rstd1(n), qkv_out(n * qkv), q(nq), k(nk), v(nk), attn(nq), probs(L.batch * L.q_heads * L.seq * L.seq);
  FVec x2(n * d), h2(n * d), rstd2(n), scores(n * E), topk_w(rows), xp(rows * d), g(rows * f), u(rows * f),
      hh(rows * f);
  FVec yp(rows * d), y(n * d), aux(1);
  std::vector<int32_t> idx(rows);
  // gradients
  FVec dyp(rows * d), dtw(rows), dxp(rows * d), dg(rows * f), du(rows * f), dh2(n * d), dh2b(n * d), dlog(n * E);
  FVec dx2(n * d), dattn(nq), dq(nq), dk(nk), dv(nk), dqkv(n * qkv), dh1(n * d), dx(n * d);
  FVec gwg(E * f * d), gwu(E * f * d), gwd(E * d * f), gwr(E * d), gwqkv(qkv * d), gwo(d * L.q_heads * L.hd);
  FVec gn1(d), gn2(d);

  Seconds best;
  for (int it = 0; it < repeats + 1; ++it) {
    if (it > 0) between();
    const double t0 = now_s(), c0 = cpu_s();
    // ---- forward: attention block
    rmsnorm_forward(h1.data(), rstd1.data(), x.data(), w_norm1.data(), n, d, 1e-5);
    linear_forward(qkv_out.data(), h1.data(), w_qkv.data(), n, d, qkv);
    for (int64_t t = 0; t < n; ++t) {  // split the fused projection into q, k, v
      std::memcpy(&q[t * L.q_heads * L.hd], &qkv_out[t * qkv], sizeof(float) * L.q_heads * L.hd);
      std::memcpy(&k[t * L.kv_heads * L.hd], &qkv_out[t * qkv + L.q_heads * L.hd], sizeof(float) * L.kv_heads * L.hd);
      std::memcpy(&v[t * L.kv_heads * L.hd], &qkv_out[t * qkv + (L.q_heads + L.kv_heads) * L.hd],
                  sizeof(float) * L.kv_heads * L.hd);
    }
    rotary_forward(q.data(), q.data(), L.batch, L.seq, L.q_heads, L.hd, 10000.0);
    rotary_forward(k.data(), k.data(), L.batch, L.seq, L.kv_heads, L.hd, 10000.0);
    attention_forward(attn.data(), probs.data(), q.data(), k.data(), v.data(), as);
    linear_forward(x2.data(), attn.data(), w_o.data(), n, L.q_heads * L.hd, d);
    for (int64_t i = 0; i < n * d; ++i) x2[i] += x[i];
    // ---- forward: MoE block
    rmsnorm_forward(h2.data(), rstd2.data(), x2.data(), w_norm2.data(), n, d, 1e-5);
    router_forward(scores.data(), idx.data(), topk_w.data(), aux.data(), h2.data(), w_r.data(), nullptr, n, d, L.cfg);
    const Routing r = build_routing(idx.data(), n, L.cfg.top_k, static_cast<int>(E));
    permute_forward(xp.data(), h2.data(), r, d);
    expert_swiglu_forward(yp.data(), g.data(), u.data(), hh.data(), xp.data(), wg.data(), wu.data(), wd.data(), r, d,
                          f);
    unpermute_forward(y.data(), yp.data(), topk_w.data(), r, d);
    // ---- backward (B then W per op), upstream gradient dy on the layer output y + x2
    unpermute_backward_input(dyp.data(), dtw.data(), dy.data(), yp.data(), topk_w.data(), r, d);
    expert_swiglu_backward_input(dxp.data(), dg.data(), du.data(), dyp.data(), g.data(), u.data(), wg.data(), wu.data(),
                                 wd.data(), r, d, f);
    expert_swiglu_backward_weight(gwg.data(), gwu.data(), gwd.data(), dyp.data(), xp.data(), hh.data(), dg.data(),
                                  du.data(), r, d, f);
    permute_backward_input(dh2.data(), dxp.data(), r, d);
    router_backward_input(dh2b.data(), dlog.data(), dtw.data(), scores.data(), idx.data(), topk_w.data(), w_r.data(), n,
                          d, L.cfg);
    router_backward_weight(gwr.data(), dlog.data(), h2.data(), n, d, L.cfg);
    for (int64_t i = 0; i < n * d; ++i) dh2[i] += dh2b[i];
    rmsnorm_backward_input(dx2.data(), dh2.data(), x2.data(), w_norm2.data(), rstd2.data(), n, d);
    rmsnorm_backward_weight(gn2.data(), dh2.data(), x2.data(), rstd2.data(), n, d);
    for (int64_t i = 0; i < n * d; ++i) dx2[i] += dy[i];
    linear_backward_input(dattn.data(), dx2.data(), w_o.data(), n, L.q_heads * L.hd, d);
    linear_backward_weight(gwo.data(), dx2.data(), attn.data(), n, L.q_heads * L.hd, d);
    attention_backward_input(dq.data(), dk.data(), dv.data(), dattn.data(), q.data(), k.data(), v.data(), probs.data(),
                             as);
    rotary_backward_input(dq.data(), dq.data(), L.batch, L.seq, L.q_heads, L.hd, 10000.0);
    rotary_backward_input(dk.data(), dk.data(), L.batch, L.seq, L.kv_heads, L.hd, 10000.0);
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(&dqkv[t * qkv], &dq[t * L.q_heads * L.hd], sizeof(float) * L.q_heads * L.hd);
      std::memcpy(&dqkv[t * qkv + L.q_heads * L.hd], &dk[t * L.kv_heads * L.hd], sizeof(float) * L.kv_heads * L.hd);
      std::memcpy(&dqkv[t * qkv + (L.q_heads + L.kv_heads) * L.hd], &dv[t * L.kv_heads * L.hd],
                  sizeof(float) * L.kv_heads * L.hd);
    }
    linear_backward_input(dh1.data(), dqkv.data(), w_qkv.data(), n, d, qkv);
    linear_backward_weight(gwqkv.data(), dqkv.data(), h1.data(), n, d, qkv);
    rmsnorm_backward_input(dx.data(), dh1.data(), x.data(), w_norm1.data(), rstd1.data(), n, d);
    rmsnorm_backward_weight(gn1.data(), dh1.data(), x.data(), rstd1.data(), n, d);
    if (it > 0) best.keep_best({now_s() - t0, cpu_s() - c0});
  }
  return best;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int run(int argc, char** argv) {
  int64_t batch = 8;
  int iters = 5;
  std::string threads_arg = "1,2", backends_arg = "onednn,openblas";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--batch")
      batch = std::atoll(argv[i + 1]);
    else if (flag == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (flag == "--threads")
      threads_arg = argv[i + 1];
    else if (flag == "--backends")
      backends_arg = argv[i + 1];
    else {
      std::fprintf(stderr, "kernels_bench: unknown flag %s (use --batch, --iters, --threads, --backends)\n", argv[i]);
      return 2;
    }
  }
  warn_gemm_environment();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  std::printf(
      "kernels_bench: tiny-moe layer (attention + MoE 8x top-2, d=128, seq=128, batch=%lld), "
      "OPENBLAS_CORETYPE=%s, load average %.1f\n",
      static_cast<long long>(batch), coretype ? coretype : "(unset)", load);
  std::printf("%-9s %7s %14s %14s %12s %8s %10s\n", "backend", "threads", "sgemm_gflops", "layer_gflops", "layer_ms",
              "ratio", "ratio_cpu");
  Layer layer{batch};
  for (const std::string& name : split(backends_arg)) {
    Result<GemmBackend> backend = parse_gemm_backend(name);
    if (!backend.ok()) {
      std::fprintf(stderr, "kernels_bench: %s\n", backend.status().message().c_str());
      return 2;
    }
    if (!set_gemm_backend(*backend).ok()) {
      std::printf("%-9s (not built in)\n", name.c_str());
      continue;
    }
    for (const std::string& t : split(threads_arg)) {
      set_kernel_threads(std::max(1, std::atoi(t.c_str())));
      // Baseline and layer alternate, so that a change in machine load hits both; best of `iters` each.
      constexpr int64_t kSquare = 1024;
      (void)square_sgemm_seconds(kSquare);  // warm-up
      Seconds base;
      const Seconds step = layer_seconds(layer, iters, [&] { base.keep_best(square_sgemm_seconds(kSquare)); });
      const double sgemm_flops = 2.0 * kSquare * kSquare * kSquare;
      const double sgemm = sgemm_flops / base.wall / 1e9, layer_gflops = layer.flops() / step.wall / 1e9;
      const double ratio_cpu = (layer.flops() / step.cpu) / (sgemm_flops / base.cpu);
      std::printf("%-9s %7s %14.1f %14.1f %12.2f %8.2f %10.2f\n", name.c_str(), t.c_str(), sgemm, layer_gflops,
                  step.wall * 1e3, layer_gflops / sgemm, ratio_cpu);
    }
  }
  return 0;
}

}  // namespace
}  // namespace piper::kernels

int main(int argc, char** argv) { return piper::kernels::run(argc, argv); }
