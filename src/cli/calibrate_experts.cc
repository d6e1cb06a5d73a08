#include "piper/cli/calibrate_experts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "piper/cli/calibrate_fit.h"
#include "piper/cost/layer_cost.h"
#include "piper/kernels/cpu/ops.h"

namespace piper::cli {

const char* const kExpertTaskNames[3] = {"forward", "backward_input", "backward_weight"};

namespace {

// tiny-moe's experts (hidden 128, SwiGLU width 256, 8 experts, top 2): the shape whose microbatch count the
// figure was wanted for (docs/calibration.md, session 30). Rows per expert: one sequence of 128 tokens a
// microbatch gives 32, four 128, sixteen 512.
constexpr int64_t kHidden = 128, kWidth = 256, kExperts = 8, kTopK = 2;
const std::vector<int64_t> kRowsPerExpert = {32, 128, 512};
// Weights cycled through: more than the build machine's 32 MiB last-level cache, so each call reads its expert's
// weights from memory, as a step's call does after the other layers and microbatches ran.
constexpr double kCycledBytes = 48.0 * 1024 * 1024;

// The weights, weight gradients and activations of `layers` layers of experts (activations shared: a step's
// microbatch finds its own in cache too).
struct ExpertLayers {
  int64_t layers = 0;
  std::vector<float> wg, wu, wd, dwg, dwu, dwd;  // [layers, E, f, h] / [layers, E, h, f]
  int64_t at = 0;                                // the layer the next call runs
  const float* w(const std::vector<float>& v) const { return v.data() + at * kExperts * kWidth * kHidden; }
  float* g(std::vector<float>& v) { return v.data() + at * kExperts * kWidth * kHidden; }
  void next() { at = (at + 1) % layers; }
};

// A fitted figure of task k within the calibration file's limit, else Unavailable naming both.
Status check_figure(int k, const char* per, double value_s, double limit_s) {
  if (value_s <= limit_s) return ok_status();
  return unavailable("the expert kernels' " + std::string(kExpertTaskNames[k]) + " measured " +
                     std::to_string(1e6 * value_s) + " us " + per + " beyond their FLOPs, more than the " +
                     std::to_string(1e6 * limit_s) +
                     " us a calibration file accepts: the kernels did not run at this core's speed; calibrate again "
                     "when the machine is idle");
}

// The line with a >= 0 and b >= 0 that a file can hold, from the least-squares (a, b): a negative intercept refits
// the line through the origin (the slope would otherwise carry the intercept that clamping drops); a negative
// slope leaves the mean as a cost per call.
void fit_nonnegative(const std::vector<double>& x, const std::vector<double>& y, double* a, double* b) {
  if (*a < 0) {
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      sxx += x[i] * x[i];
      sxy += x[i] * y[i];
    }
    *a = 0;
    *b = sxy / sxx;
  }
  if (*b < 0) {
    double sy = 0;
    for (double v : y) sy += v;
    *a = std::max(0.0, sy / static_cast<double>(y.size()));
    *b = 0;
  }
}

Result<ExpertRowsPoint> measure_rows(const cost::DeviceModel& device, int64_t rows_per_expert, ExpertLayers& layers,
                                     const std::function<double(const std::function<void()>&)>& time_call) {
  const int64_t h = kHidden, f = kWidth, rows = kExperts * rows_per_expert, n = rows / kTopK;
  // Token t's slot j goes to expert (t k + j) mod E: every expert gets rows_per_expert rows, a token's two slots
  // two experts.
  std::vector<int32_t> topk(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) topk[static_cast<size_t>(i)] = static_cast<int32_t>(i % kExperts);
  const kernels::Routing r =
      kernels::build_routing(topk.data(), n, static_cast<int>(kTopK), static_cast<int>(kExperts));
  std::vector<float> x(static_cast<size_t>(n * h)), topk_w(static_cast<size_t>(rows), 0.5f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 89);
  std::vector<float> xp(static_cast<size_t>(rows * h)), yp(xp.size()), dyp(xp.size()), dxp(xp.size());
  std::vector<float> g(static_cast<size_t>(rows * f)), u(g.size()), hh(g.size()), dg(g.size()), du(g.size());
  std::vector<float> y(x.size()), dy(x.size(), 0.01f), dx(x.size()), dtopk_w(topk_w.size());
  ExpertRowsPoint p;
  p.rows_per_expert = rows_per_expert;
  p.measured_s[0] = time_call([&] {
    kernels::permute_forward(xp.data(), x.data(), r, h);
    kernels::expert_swiglu_forward(yp.data(), g.data(), u.data(), hh.data(), xp.data(), layers.w(layers.wg),
                                   layers.w(layers.wu), layers.w(layers.wd), r, h, f);
    kernels::unpermute_forward(y.data(), yp.data(), topk_w.data(), r, h);
    layers.next();
  });
  p.measured_s[1] = time_call([&] {
    kernels::unpermute_backward_input(dyp.data(), dtopk_w.data(), dy.data(), yp.data(), topk_w.data(), r, h);
    kernels::expert_swiglu_backward_input(dxp.data(), dg.data(), du.data(), dyp.data(), g.data(), u.data(),
                                          layers.w(layers.wg), layers.w(layers.wu), layers.w(layers.wd), r, h, f);
    kernels::permute_backward_input(dx.data(), dxp.data(), r, h);
    layers.next();
  });
  p.measured_s[2] = time_call([&] {
    kernels::expert_swiglu_backward_weight(layers.g(layers.dwg), layers.g(layers.dwu), layers.g(layers.dwd), dyp.data(),
                                           xp.data(), hh.data(), dg.data(), du.data(), r, h, f);
    layers.next();
  });
  for (double s : p.measured_s) {
    if (!std::isfinite(s)) {
      return unavailable("no call of the expert kernels at " + std::to_string(rows_per_expert) +
                         " rows per expert ran undisturbed: the machine is too loaded");
    }
  }
  // The model's price of the same layer: Part::kExperts at these tokens, fp32 throughout, no per-call cost.
  cost::PartTable table;
  table.hidden = static_cast<double>(h);
  table.top_k = static_cast<double>(kTopK);
  table.num_experts = static_cast<double>(kExperts);
  table.expert_width = static_cast<double>(f);
  table.expert_params = 3.0 * static_cast<double>(h * f);
  cost::PartShape shape;
  shape.tokens = static_cast<double>(n);
  shape.act_bytes = shape.param_bytes = shape.grad_bytes = 4;
  const cost::PartCost c = cost::part_cost(table, cost::Part::kExperts, shape);
  const cost::TaskCost* tasks[3] = {&c.f, &c.b, &c.w};
  for (int k = 0; k < 3; ++k) {
    p.priced_s[k] = cost::task_time_s(*tasks[k], device);
    p.excess_per_call_s[k] = (p.measured_s[k] - p.priced_s[k]) / static_cast<double>(kExperts);
  }
  return p;
}

}  // namespace

Result<ExpertFit> measure_experts(const cost::DeviceModel& device,
                                  const std::function<double(const std::function<void()>&)>& time_call) {
  ExpertFit fit;
  fit.hidden = kHidden;
  fit.width = kWidth;
  fit.experts = kExperts;
  fit.top_k = kTopK;
  const double layer_bytes = 3.0 * kExperts * kWidth * kHidden * sizeof(float);
  ExpertLayers layers;
  layers.layers = static_cast<int64_t>(std::ceil(kCycledBytes / layer_bytes));
  fit.layers = layers.layers;
  fit.weight_bytes = layer_bytes * static_cast<double>(layers.layers);
  const size_t per_matrix = static_cast<size_t>(layers.layers * kExperts * kWidth * kHidden);
  for (std::vector<float>* v : {&layers.wg, &layers.wu, &layers.wd}) {
    v->resize(per_matrix);
    for (size_t i = 0; i < per_matrix; ++i) (*v)[i] = 0.001f * static_cast<float>(i % 61) - 0.03f;
  }
  for (std::vector<float>* v : {&layers.dwg, &layers.dwu, &layers.dwd}) v->assign(per_matrix, 0.0f);
  std::vector<double> x;
  std::vector<double> y[3];
  for (int64_t rows : kRowsPerExpert) {
    std::fprintf(stderr,
                 "calibrate: experts at %lld rows each (%lld SwiGLU experts of %lld x %lld, %lld layers' "
                 "weights cycled, 1 thread)\n",
                 static_cast<long long>(rows), static_cast<long long>(kExperts), static_cast<long long>(kHidden),
                 static_cast<long long>(kWidth), static_cast<long long>(layers.layers));
    PIPER_ASSIGN_OR_RETURN(ExpertRowsPoint p, measure_rows(device, rows, layers, time_call));
    fit.points.push_back(p);
    x.push_back(static_cast<double>(rows));
    for (int k = 0; k < 3; ++k) y[k].push_back(p.excess_per_call_s[k]);
  }
  for (int k = 0; k < 3; ++k) {
    const Line line = least_squares(x, y[k]);
    double a = line.a, b = line.b;
    fit.fitted_a[k] = a;
    fit.fitted_b[k] = b;
    fit_nonnegative(x, y[k], &a, &b);
    fit.call_s[k] = a;
    fit.per_row_s[k] = b;
    // The calibration file accepts at most these: a figure beyond them is refused here, not written.
    PIPER_RETURN_IF_ERROR(check_figure(k, "per row", fit.per_row_s[k], cost::kMaxExpertRowS));
    PIPER_RETURN_IF_ERROR(check_figure(k, "per expert call", fit.call_s[k], cost::kMaxExpertCallS));
  }
  return fit;
}

}  // namespace piper::cli
