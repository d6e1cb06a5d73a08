// GPU benchmark (needs a GPU; prints one JSON object and writes it to argv[1] when given):
//   kernels:   per-kernel throughput (TFLOP/s for GEMMs and attention, GB/s for memory-bound kernels);
//   grouped:   the experts' grouped GEMM (cublasGemmGroupedBatchedEx, and one cuBLASLt call per expert) against
//              ONE dense cuBLASLt GEMM of the same total FLOPs, measured in the same run (ratio = grouped / dense);
//   moe_layer: a DeepSeek-V3-sized routed-expert slice (hidden 7168, expert width 2048, 32 of the 256 experts,
//              top-8 of 8192 tokens routed to the slice, uniform) forward + backward (B and W) through the same
//              kernel calls as the GPU trainer; MFU = model FLOPs / time / 989 TFLOP/s (H200 dense bf16 peak).
// Times are wall-clock over `iters` runs after warm-up, with the stream synchronised around them.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "piper/kernels/cuda/cuda_api.h"

namespace cu = piper::kernels::cuda;
using cu::Bf16;
using cu::DeviceBuffer;
using Json = nlohmann::ordered_json;

namespace {

constexpr double kPeakBf16 = 989e12;

double time_s(const std::function<void()>& fn, int iters) {
  fn();
  fn();
  cu::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  cu::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

DeviceBuffer random_bf16(int64_t n, float scale) {
  std::vector<float> h(static_cast<size_t>(n));
  uint32_t s = 12345u + static_cast<uint32_t>(n);
  for (auto& x : h) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f);
  }
  return cu::upload(cu::to_bf16(h));
}
DeviceBuffer random_f32(int64_t n, float scale) {
  std::vector<float> h(static_cast<size_t>(n));
  uint32_t s = 777u + static_cast<uint32_t>(n);
  for (auto& x : h) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f);
  }
  return cu::upload(h);
}

Json bench_kernels() {
  Json j;
  {  // dense GEMM 8192^3
    const int64_t m = 8192, n = 8192, k = 8192;
    DeviceBuffer a = random_bf16(m * k, 1), b = random_bf16(k * n, 1), c = cu::device_array<float>(m * n);
    const double t = time_s(
        [&] { cu::gemm_bf16(false, true, m, n, k, 1, a.as<Bf16>(), k, b.as<Bf16>(), k, 0, c.as<float>(), n); }, 10);
    j["gemm_bf16_8192_tflops"] = 2.0 * m * n * k / t / 1e12;
  }
  {  // RMSNorm forward, 16384 x 7168
    const int64_t n = 16384, d = 7168;
    DeviceBuffer x = random_f32(n * d, 1), w = random_f32(d, 1), y = cu::device_array<float>(n * d);
    DeviceBuffer yb = cu::device_array<Bf16>(n * d), r = cu::device_array<float>(n);
    const double t = time_s(
        [&] {
          cu::rmsnorm_forward(y.as<float>(), yb.as<Bf16>(), r.as<float>(), x.as<float>(), w.as<float>(), n, d, 1e-6);
        },
        20);
    j["rmsnorm_forward_gbps"] = static_cast<double>(n * d) * (4 + 4 + 2) / t / 1e9;
  }
  {  // AdamW over 256M parameters
    const int64_t n = 256LL << 20;
    DeviceBuffer p = random_f32(n, 1), g = random_f32(n, 1), m = cu::device_array<float>(n, true);
    DeviceBuffer v = cu::device_array<float>(n, true), pb = cu::device_array<Bf16>(n);
    cu::AdamWArgs a;
    a.lr = 1e-4f, a.b1 = 0.9f, a.b2 = 0.95f, a.bc1 = 0.1f, a.bc2 = 0.05f, a.eps = 1e-8f, a.wd = 0.1f;
    const double t =
        time_s([&] { cu::adamw(p.as<float>(), pb.as<Bf16>(), g.as<float>(), m.as<float>(), v.as<float>(), n, a); }, 10);
    j["adamw_gbps"] = static_cast<double>(n) * (4 * 7 + 2) / t / 1e9;
  }
  {  // attention forward + backward, batch 4, seq 2048, 32 q heads, 8 kv heads, head_dim 128 (fp32 CUDA cores)
    cu::AttnShape s{4, 2048, 32, 8, 128};
    const int64_t qn = s.batch * s.seq * s.q_heads * s.head_dim, kn = s.batch * s.seq * s.kv_heads * s.head_dim;
    DeviceBuffer q = random_f32(qn, 1), k = random_f32(kn, 1), v = random_f32(kn, 1), o = cu::device_array<float>(qn);
    DeviceBuffer l = cu::device_array<float>(s.batch * s.q_heads * s.seq), dq = cu::device_array<float>(qn);
    DeviceBuffer dk = cu::device_array<float>(kn), dv = cu::device_array<float>(kn), d_o = random_f32(qn, 1);
    const double tf = time_s(
        [&] { cu::attention_forward(o.as<float>(), l.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(), s); },
        3);
    const double tb = time_s(
        [&] {
          cu::attention_backward(dq.as<float>(), dk.as<float>(), dv.as<float>(), d_o.as<float>(), o.as<float>(),
                                 l.as<float>(), q.as<float>(), k.as<float>(), v.as<float>(), s);
        },
        3);
    const double causal_flops = 2.0 * 2.0 * s.batch * s.q_heads * s.seq * s.seq * s.head_dim / 2;  // QK and PV, half
    j["attention_forward_tflops"] = causal_flops / tf / 1e12;
    j["attention_backward_tflops"] = 2.5 * causal_flops / tb / 1e12;
  }
  {  // permute forward 65536 rows x 7168 (gather to bf16)
    const int64_t n = 8192, k = 8, d = 7168, rows = n * k;
    DeviceBuffer x = random_f32(n * d, 1), xp = cu::device_array<Bf16>(rows * d);
    std::vector<int64_t> tor(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) tor[r] = (r * 7919) % n;
    DeviceBuffer t = cu::upload(tor);
    const double tt =
        time_s([&] { cu::permute_forward(nullptr, xp.as<Bf16>(), x.as<float>(), t.as<int64_t>(), rows, d); }, 10);
    j["permute_forward_gbps"] = static_cast<double>(rows * d) * (4 + 2) / tt / 1e9;
  }
  return j;
}

struct MoeSlice {
  int64_t tokens = 8192, top_k = 8, experts = 32, hidden = 7168, width = 2048;
  int64_t rows() const { return tokens * top_k; }
};

Json bench_grouped_and_layer() {
  const MoeSlice m;
  const int64_t rows = m.rows(), h = m.hidden, f = m.width, E = m.experts;
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1));
  for (int64_t e = 0; e <= E; ++e) offsets[e] = rows * e / E;
  DeviceBuffer xpb = random_bf16(rows * h, 1), wg = random_bf16(E * f * h, 0.02f), wu = random_bf16(E * f * h, 0.02f);
  DeviceBuffer wd = random_bf16(E * h * f, 0.02f), g = cu::device_array<float>(rows * f),
               u = cu::device_array<float>(rows * f);
  DeviceBuffer hh = cu::device_array<float>(rows * f), hhb = cu::device_array<Bf16>(rows * f);
  DeviceBuffer yp = cu::device_array<float>(rows * h);
  Json j;
  const double flops = 2.0 * rows * h * f;
  const auto probs = cu::expert_forward_problems(offsets, xpb.as<Bf16>(), wg.as<Bf16>(), g.as<float>(), h, f);
  const double t_grouped = time_s([&] { cu::grouped_gemm_bf16(probs, cu::GroupedMode::kGrouped); }, 10);
  const double t_loop = time_s([&] { cu::grouped_gemm_bf16(probs, cu::GroupedMode::kLoop); }, 10);
  // The same FLOPs as one dense GEMM: all rows against the first expert's weight.
  const double t_dense = time_s(
      [&] { cu::gemm_bf16(false, true, rows, f, h, 1, xpb.as<Bf16>(), h, wg.as<Bf16>(), h, 0, g.as<float>(), f); }, 10);
  j["grouped"] = {{"problem", "32 experts x [2048 x 7168] -> [2048 x 2048] rows each (65536 rows)"},
                  {"grouped_tflops", flops / t_grouped / 1e12},
                  {"loop_tflops", flops / t_loop / 1e12},
                  {"dense_tflops", flops / t_dense / 1e12},
                  {"grouped_over_dense", t_dense / t_grouped},
                  {"loop_over_dense", t_dense / t_loop}};

  // The routed-expert slice of a DeepSeek-V3 MoE layer, forward + backward (B and W), as the GPU trainer runs it.
  DeviceBuffer x = random_f32(m.tokens * h, 1), tw = random_f32(m.tokens * m.top_k, 0.25f),
               y = cu::device_array<float>(m.tokens * h);
  std::vector<int64_t> tor(static_cast<size_t>(rows)), ros(static_cast<size_t>(rows));
  for (int64_t e = 0, r = 0; e < E; ++e) {
    for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i, ++r) tor[r] = (i * 7919) % m.tokens;
  }
  // row_of_slot: slot s = t·k + j of the row whose token_of_row is t, in row order per token.
  std::vector<int64_t> fill(static_cast<size_t>(m.tokens), 0);
  std::vector<int64_t> slot_rows(static_cast<size_t>(rows), -1);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = tor[r];
    if (fill[t] < m.top_k) slot_rows[t * m.top_k + fill[t]++] = r;
  }
  for (int64_t s = 0; s < rows; ++s) ros[s] = slot_rows[s] >= 0 ? slot_rows[s] : 0;
  DeviceBuffer TOR = cu::upload(tor), ROS = cu::upload(ros);
  DeviceBuffer dg = cu::device_array<float>(rows * f), du = cu::device_array<float>(rows * f);
  DeviceBuffer dgb = cu::device_array<Bf16>(rows * f), dub = cu::device_array<Bf16>(rows * f);
  DeviceBuffer dyp = cu::device_array<float>(rows * h), dypb = cu::device_array<Bf16>(rows * h);
  DeviceBuffer dxp = cu::device_array<float>(rows * h), dx = cu::device_array<float>(m.tokens * h);
  DeviceBuffer dtw = cu::device_array<float>(m.tokens * m.top_k), dy = random_f32(m.tokens * h, 1);
  DeviceBuffer gwg = cu::device_array<float>(E * f * h, true), gwu = cu::device_array<float>(E * f * h, true);
  DeviceBuffer gwd = cu::device_array<float>(E * h * f, true);
  const int K = static_cast<int>(m.top_k);
  auto layer = [&] {
    cu::permute_forward(nullptr, xpb.as<Bf16>(), x.as<float>(), TOR.as<int64_t>(), rows, h);
    cu::grouped_gemm_bf16(cu::expert_forward_problems(offsets, xpb.as<Bf16>(), wg.as<Bf16>(), g.as<float>(), h, f));
    cu::grouped_gemm_bf16(cu::expert_forward_problems(offsets, xpb.as<Bf16>(), wu.as<Bf16>(), u.as<float>(), h, f));
    cu::swiglu_act_forward(hh.as<float>(), hhb.as<Bf16>(), g.as<float>(), u.as<float>(), rows * f);
    cu::grouped_gemm_bf16(cu::expert_forward_problems(offsets, hhb.as<Bf16>(), wd.as<Bf16>(), yp.as<float>(), f, h));
    cu::unpermute_forward(y.as<float>(), yp.as<float>(), tw.as<float>(), ROS.as<int64_t>(), x.as<float>(), 1.0f,
                          m.tokens, K, h);
    cu::unpermute_backward(dyp.as<float>(), dypb.as<Bf16>(), dtw.as<float>(), dy.as<float>(), yp.as<float>(),
                           tw.as<float>(), ROS.as<int64_t>(), 1.0f, m.tokens, K, h);
    cu::grouped_gemm_bf16(
        cu::expert_backward_input_problems(offsets, dypb.as<Bf16>(), wd.as<Bf16>(), dg.as<float>(), f, h, 0.0f));
    cu::grouped_gemm_bf16(
        cu::expert_backward_weight_problems(offsets, dypb.as<Bf16>(), hhb.as<Bf16>(), gwd.as<float>(), f, h));
    cu::swiglu_act_backward(dg.as<float>(), du.as<float>(), dg.as<float>(), g.as<float>(), u.as<float>(), rows * f);
    cu::cast_to_bf16(dgb.as<Bf16>(), dg.as<float>(), rows * f);
    cu::cast_to_bf16(dub.as<Bf16>(), du.as<float>(), rows * f);
    cu::grouped_gemm_bf16(
        cu::expert_backward_input_problems(offsets, dgb.as<Bf16>(), wg.as<Bf16>(), dxp.as<float>(), h, f, 0.0f));
    cu::grouped_gemm_bf16(
        cu::expert_backward_input_problems(offsets, dub.as<Bf16>(), wu.as<Bf16>(), dxp.as<float>(), h, f, 1.0f));
    cu::grouped_gemm_bf16(
        cu::expert_backward_weight_problems(offsets, dgb.as<Bf16>(), xpb.as<Bf16>(), gwg.as<float>(), h, f));
    cu::grouped_gemm_bf16(
        cu::expert_backward_weight_problems(offsets, dub.as<Bf16>(), xpb.as<Bf16>(), gwu.as<float>(), h, f));
    cu::permute_backward(dx.as<float>(), dxp.as<float>(), ROS.as<int64_t>(), nullptr, m.tokens, K, h);
  };
  const double t_layer = time_s(layer, 5);
  const double layer_flops = 3 * 3 * flops;  // 3 GEMMs, each forward + B + W
  j["moe_layer"] = {{"slice", "DeepSeek-V3 routed experts: hidden 7168, width 2048, 32 experts, 8192 tokens x top-8"},
                    {"seconds", t_layer},
                    {"tflops", layer_flops / t_layer / 1e12},
                    {"mfu_vs_989", layer_flops / t_layer / kPeakBf16}};
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  const piper::Status st = cu::device_status();
  if (!st.ok()) {
    std::fprintf(stderr, "piper_gpu_bench: %s\n", st.message().c_str());
    return 2;
  }
  try {
    Json out;
    out["device"] = cu::device_description();
    out["kernels"] = bench_kernels();
    const Json g = bench_grouped_and_layer();
    out["grouped"] = g["grouped"];
    out["moe_layer"] = g["moe_layer"];
    const std::string text = out.dump(2);
    std::printf("%s\n", text.c_str());
    if (argc > 1) std::ofstream(argv[1]) << text << "\n";
  } catch (const cu::CudaError& e) {
    std::fprintf(stderr, "piper_gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
