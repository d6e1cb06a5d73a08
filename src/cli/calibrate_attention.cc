#include "piper/cli/calibrate_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "piper/kernels/cpu/ops.h"

namespace piper::cli {
namespace {

// A small model's attention (GQA, two query heads per kv head) at two lengths: the fitted figure is per score
// element, and a short row costs more per element than a long one, so the file takes the mean and the report
// shows both.
constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kHeadDim = 64;
const std::vector<int64_t> kSeqs = {128, 512};

// The model's FLOPs of the causal core's forward (docs/counting.md: Q K^T and P V over the mean context s / 2).
double forward_flops(int64_t seq) {
  const double tokens = static_cast<double>(kBatch * seq);
  return tokens * 2.0 * kHeads * (2.0 * kHeadDim) * (static_cast<double>(seq) / 2.0);
}

Result<AttentionShapePoint> measure_length(const cost::DeviceModel& device, int64_t seq,
                                           const std::function<double(const std::function<void()>&)>& time_call) {
  const kernels::AttentionShape s{kBatch, seq, kHeads, kKvHeads, kHeadDim};
  const size_t nq = static_cast<size_t>(kBatch * seq * kHeads * kHeadDim);
  const size_t nk = static_cast<size_t>(kBatch * seq * kKvHeads * kHeadDim);
  std::vector<float> q(nq, 0.01f), k(nk, 0.02f), v(nk, 0.03f), out(nq), dout(nq, 0.01f), dq(nq), dk(nk), dv(nk);
  std::vector<float> probs(static_cast<size_t>(kBatch * kHeads * seq * seq));
  for (size_t i = 0; i < nq; ++i) q[i] = 0.01f * static_cast<float>(i % 97);  // scores that differ by row
  AttentionShapePoint p;
  p.seq = seq;
  p.forward_s = time_call([&] { kernels::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s); });
  p.backward_s = time_call([&] {
    kernels::attention_probs(probs.data(), q.data(), k.data(), s);
    kernels::attention_backward_input(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                      probs.data(), s);
  });
  if (!std::isfinite(p.forward_s) || !std::isfinite(p.backward_s)) {
    return unavailable("no call of the attention kernels at seq " + std::to_string(seq) +
                       " ran undisturbed: the machine is too loaded");
  }
  // Forward once, backward twice the forward's FLOPs when the scores are materialised (Part::kAttentionCore).
  const double f = forward_flops(seq);
  p.flops_s = device.time_s(f, 0, kHeadDim, true) + device.time_s(2.0 * f, 0, kHeadDim, true);
  const double scores = static_cast<double>(kBatch * seq) * kHeads * static_cast<double>(seq);
  const double beyond_s = std::max(0.0, p.forward_s + p.backward_s - p.flops_s);
  p.bytes_per_score = device.memory_time_s(1.0) > 0 ? beyond_s / (3.0 * scores * device.memory_time_s(1.0)) : 0;
  return p;
}

}  // namespace

Result<AttentionFit> measure_attention(const cost::DeviceModel& device,
                                       const std::function<double(const std::function<void()>&)>& time_call) {
  AttentionFit fit;
  fit.batch = kBatch;
  fit.heads = kHeads;
  fit.kv_heads = kKvHeads;
  fit.head_dim = kHeadDim;
  for (int64_t seq : kSeqs) {
    std::fprintf(stderr, "calibrate: attention core at seq %lld (%lld heads of %lld, 1 thread)\n",
                 static_cast<long long>(seq), static_cast<long long>(kHeads), static_cast<long long>(kHeadDim));
    PIPER_ASSIGN_OR_RETURN(AttentionShapePoint p, measure_length(device, seq, time_call));
    fit.points.push_back(p);
    fit.bytes_per_score += p.bytes_per_score / static_cast<double>(kSeqs.size());
  }
  // The calibration file accepts at most kMaxAttentionScoreBytes (cost/device_model.h): a file beyond it could not
  // be loaded, so such a measurement is refused here rather than written.
  if (fit.bytes_per_score > cost::kMaxAttentionScoreBytes) {
    return unavailable("the attention kernels measured " + std::to_string(fit.bytes_per_score) +
                       " B per score element beyond their FLOPs, more than the " +
                       std::to_string(cost::kMaxAttentionScoreBytes) +
                       " a calibration file accepts: the kernels did not run at this core's speed; calibrate again "
                       "when the machine is idle");
  }
  return fit;
}

}  // namespace piper::cli
