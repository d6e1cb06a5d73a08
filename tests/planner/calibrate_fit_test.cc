// `piper calibrate`'s GEMM curve fit (src/cli/calibrate_fit.h), and the command end to end.
#include "piper/cli/calibrate_fit.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "calibrate_cli.h"
#include "piper/cli/calibrate_attention.h"
#include "piper/cli/calibrate_experts.h"
#include "piper/cli/calibration_file.h"
#include "piper/cost/device_model.h"
#include "piper/cost/layer_cost.h"

namespace piper::cli {
namespace {

TEST(CalibrateFitTest, RecoversTheCurveFromExactPoints) {
  std::vector<GemmPoint> points;
  for (double d : {8.0, 16.0, 64.0, 256.0, 1024.0}) points.push_back({d, 0.7 * d / (d + 48.0)});
  auto c = fit_gemm_curve(points);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_NEAR(c->gemm_efficiency, 0.7, 1e-12);
  EXPECT_NEAR(c->gemm_half_dim, 48.0, 1e-9);
}

TEST(CalibrateFitTest, LeastSquaresLine) {
  const Line exact = least_squares({32, 128, 512}, {2 + 3 * 32.0, 2 + 3 * 128.0, 2 + 3 * 512.0});
  EXPECT_NEAR(exact.a, 2.0, 1e-9);
  EXPECT_NEAR(exact.b, 3.0, 1e-12);
  // Points off a line: the fit splits the residuals (mean of y at the mean of x).
  const Line noisy = least_squares({0, 1, 2, 3}, {1, 0, 3, 2});
  EXPECT_NEAR(noisy.b, 0.6, 1e-12);
  EXPECT_NEAR(noisy.a + noisy.b * 1.5, 1.5, 1e-12);
}

TEST(CalibrateFitTest, RefusesPointsThatCannotBeFitted) {
  EXPECT_FALSE(fit_gemm_curve({{64, 0.5}}).ok());             // one size
  EXPECT_FALSE(fit_gemm_curve({{64, 0.5}, {64, 0.6}}).ok());  // one distinct size
  EXPECT_FALSE(fit_gemm_curve({{64, 0.0}, {128, 0.6}}).ok());
  // Efficiency falling with size: no curve of this form; the message says to rerun on an idle machine.
  // (Falling by a factor of 3 is not "flat within noise", below.)
  auto falling = fit_gemm_curve({{16, 0.9}, {256, 0.3}});
  ASSERT_FALSE(falling.ok());
  EXPECT_NE(falling.status().message().find("too noisy"), std::string::npos) << falling.status().message();
}

// Points that do not rise with size but stay within 15 % of their harmonic mean: a flat curve (h = 0).
TEST(CalibrateFitTest, FlatWithinNoiseIsACurveWithoutAKnee) {
  auto c = fit_gemm_curve({{8, 1.05}, {64, 0.98}, {512, 0.95}});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->gemm_half_dim, 0.0);
  EXPECT_NEAR(c->gemm_efficiency, 3.0 / (1 / 1.05 + 1 / 0.98 + 1 / 0.95), 1e-12);
  EXPECT_FALSE(fit_gemm_curve({{8, 1.3}, {64, 0.98}, {512, 0.95}}).ok());  // 8: 23 % above the harmonic mean
}

// Four processes on two cores, each doing 80 calls per CPU second and 40 per wall second, against one alone at 100
// per CPU and per wall second: 0.8 of its speed per CPU second, 0.4 / (100 x 0.5) = 0.8 per wall second.
TEST(CalibrateFitTest, SharingEfficiencyAgainstOneAlone) {
  const ShareSample alone{100, 1.0, 1.0};
  const std::vector<ShareSample> four(4, ShareSample{40, 0.5, 1.0});
  auto e = sharing_efficiency(alone, four, 2);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_DOUBLE_EQ(e->per_cpu, 0.8);
  EXPECT_DOUBLE_EQ(e->per_wall, 0.8);
  // Two on two cores: the wall figure is against the full speed; the mean over the processes.
  e = sharing_efficiency(alone, {{90, 1.0, 1.0}, {70, 1.0, 1.0}}, 2);
  ASSERT_TRUE(e.ok());
  EXPECT_DOUBLE_EQ(e->per_cpu, 0.8);
  EXPECT_DOUBLE_EQ(e->per_wall, 0.8);
  EXPECT_FALSE(sharing_efficiency(alone, {}, 2).ok());
  EXPECT_FALSE(sharing_efficiency(alone, {{0, 1.0, 1.0}}, 2).ok());  // no calls: too short a window
  EXPECT_FALSE(sharing_efficiency({100, 0.0, 1.0}, four, 2).ok());
}

// A calibration file from before session 25 (one core's figures only) loads as it did: no thread figures, no
// sharing (1 for any n), and a rank on t cores gets t x one core's figures.
TEST(CalibrationFileTest, AnOldFileMeansWhatItMeant) {
  auto c = cost::Calibration::from_json(
      Json::parse(R"({"peak_flops_fp32": 1.1e11, "gemm_efficiency": 1, "gemm_half_dim": 0.5,
                      "memory_bw_bytes_per_s": 1.7e10, "memory_bw_efficiency": 1, "gemm_table": false,
                      "workspace_bytes": 0, "source": "piper calibrate at 2026-12-05"})"),
      "old.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->thread_figures.empty());
  EXPECT_TRUE(c->core_sharing.empty());
  EXPECT_EQ(c->sharing_efficiency(4), 1.0);
  cost::Calibration two = *c;
  EXPECT_FALSE(scale_to_rank_cores(&two, 2));
  EXPECT_EQ(two.peak_flops_fp32, 2.2e11);
  EXPECT_EQ(two.memory_bw_bytes_per_s, 3.4e10);
  EXPECT_EQ(two.gemm_half_dim, 0.5);
}

const char* kNewFile = R"({"peak_flops_fp32": 1.1e11, "gemm_efficiency": 1, "gemm_half_dim": 0.5,
  "memory_bw_bytes_per_s": 1.7e10, "memory_bw_efficiency": 1, "gemm_table": false, "workspace_bytes": 0,
  "thread_figures": [
    {"threads": 1, "peak_flops_fp32": 1.1e11, "gemm_half_dim": 0.5, "memory_bw_bytes_per_s": 1.7e10,
     "task_overhead_s": 4e-7},
    {"threads": 2, "peak_flops_fp32": 1.6e11, "gemm_half_dim": 3.0, "memory_bw_bytes_per_s": 2.0e10,
     "task_overhead_s": 1.3e-6}],
  "core_sharing": [{"ranks": 2, "efficiency": 0.99, "stream_efficiency": 0.9}, {"ranks": 3, "efficiency": 0.95},
                   {"ranks": 4, "efficiency": 0.9, "wall_efficiency": 0.45, "stream_wall_efficiency": 0.4}]})";

// A file with each thread count's figures: a rank computing on 2 threads is priced with the 2-thread entry, not
// 2 x one core; a thread count without an entry (3) with t x one core; the sharing by ranks computing together,
// the last entry for more ranks than measured.
TEST(CalibrationFileTest, ThreadFiguresAndSharingAreUsed) {
  auto c = cost::Calibration::from_json(Json::parse(kNewFile), "new.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->thread_figures.size(), 2u);
  EXPECT_EQ(c->figures_for_threads(2)->task_overhead_s, 1.3e-6);
  EXPECT_EQ(c->figures_for_threads(3), nullptr);
  EXPECT_EQ(c->sharing_efficiency(1), 1.0);
  EXPECT_EQ(c->sharing_efficiency(2), 0.99);
  EXPECT_EQ(c->sharing_efficiency(4), 0.9);
  EXPECT_EQ(c->sharing_efficiency(9), 0.9);
  cost::Calibration two = *c, three = *c, one = *c;
  EXPECT_TRUE(scale_to_rank_cores(&two, 2));
  EXPECT_EQ(two.peak_flops_fp32, 1.6e11);
  EXPECT_EQ(two.gemm_half_dim, 3.0);
  EXPECT_EQ(two.memory_bw_bytes_per_s, 2.0e10);
  EXPECT_FALSE(scale_to_rank_cores(&three, 3));
  EXPECT_EQ(three.peak_flops_fp32, 3.3e11);
  EXPECT_TRUE(scale_to_rank_cores(&one, 1));
  EXPECT_EQ(one.peak_flops_fp32, 1.1e11);
}

// The attention stage's fit: whatever the kernels take beyond the model's price of their FLOPs, as bytes per score
// element at the calibrated bandwidth, forward once and backward twice; the file gets the mean over the lengths.
TEST(CalibrateAttentionTest, FitsTheTimeBeyondTheFlopsAsBytesPerScore) {
  auto cal = cost::Calibration::from_json(
      Json::parse(R"({"peak_flops_fp32": 1e11, "gemm_efficiency": 1, "gemm_half_dim": 0, "memory_bw_bytes_per_s": 1e10,
                      "memory_bw_efficiency": 1})"),
      "test");
  ASSERT_TRUE(cal.ok()) << cal.status().to_string();
  const cost::DeviceModel device(DeviceSpec{}, DType::kFP32, *cal, 1.0);
  int calls = 0;
  auto fit = measure_attention(device, [&calls](const std::function<void()>&) {
    ++calls;
    return 0.01;  // 10 ms a call, forward and backward alike: no kernel runs
  });
  ASSERT_TRUE(fit.ok()) << fit.status().to_string();
  EXPECT_EQ(calls, 4);  // forward and backward at each of two lengths
  ASSERT_EQ(fit->points.size(), 2u);
  double mean = 0;
  for (const AttentionShapePoint& p : fit->points) {
    const double L = static_cast<double>(p.seq), tokens = static_cast<double>(fit->batch) * L;
    const double forward_flops = tokens * 2 * fit->heads * 2 * fit->head_dim * L / 2;
    EXPECT_DOUBLE_EQ(p.flops_s, 3 * forward_flops / 1e11) << p.seq;  // efficiency 1 at every dimension
    const double scores = tokens * fit->heads * L;
    EXPECT_NEAR(p.bytes_per_score, std::max(0.0, 0.02 - p.flops_s) * 1e10 / (3 * scores), 1e-9) << p.seq;
    mean += p.bytes_per_score / 2;
  }
  EXPECT_GT(fit->points[0].bytes_per_score, fit->points[1].bytes_per_score);  // same time, more scores
  EXPECT_NEAR(fit->bytes_per_score, mean, 1e-12);
  // A kernel that never ran undisturbed (the caller's timing says infinity) is an error, not a figure.
  auto loaded = measure_attention(device, [](const std::function<void()>&) { return HUGE_VAL; });
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("too loaded"), std::string::npos) << loaded.status().message();
  // A figure that a calibration file would refuse (over kMaxAttentionScoreBytes) is refused here, not written.
  auto slow = measure_attention(device, [](const std::function<void()>&) { return 1e3; });
  ASSERT_FALSE(slow.ok());
  EXPECT_NE(slow.status().message().find("calibrate again"), std::string::npos) << slow.status().message();
}

// The experts stage's fit: per task, (measured - the model's price of the layer) / experts against the rows per
// expert, a least-squares line whose intercept is the file's expert_call_*_s and whose slope its expert_row_*_s,
// each clamped at 0. The injected timings are the model's price plus a known intercept and slope per call (and,
// for the forward, a wobble that the least squares average out); the fit gives them back.
TEST(CalibrateExpertsTest, FitsTheTimeBeyondThePriceAsACostPerExpertCall) {
  auto cal = cost::Calibration::from_json(
      Json::parse(R"({"peak_flops_fp32": 1e11, "gemm_efficiency": 1, "gemm_half_dim": 0, "memory_bw_bytes_per_s": 1e10,
                      "memory_bw_efficiency": 1})"),
      "test");
  ASSERT_TRUE(cal.ok()) << cal.status().to_string();
  const cost::DeviceModel device(DeviceSpec{}, DType::kFP32, *cal, 1.0);
  // The layer the stage times (tiny-moe's experts), priced as the stage must price it.
  cost::PartTable table;
  table.hidden = 128;
  table.top_k = 2;
  table.num_experts = 8;
  table.expert_width = 256;
  table.expert_params = 3 * 128 * 256;
  auto priced = [&](int64_t rows_per_expert, int task) {
    cost::PartShape shape;
    shape.tokens = static_cast<double>(rows_per_expert * 8 / 2);
    shape.act_bytes = shape.param_bytes = shape.grad_bytes = 4;
    const cost::PartCost c = cost::part_cost(table, cost::Part::kExperts, shape);
    return cost::task_time_s(task == 0 ? c.f : task == 1 ? c.b : c.w, device);
  };
  const double intercept[3] = {25e-6, -5e-6, 15e-6};  // the input gradient's below 0: refitted through 0
  const double slope[3] = {1e-8, 3e-8, -2e-8};        // the weight gradient's below 0: the mean, slope 0
  const std::vector<int64_t> rows = {32, 128, 512};
  // +1, -2, +1 us per call at the three row counts on the forward: the least-squares line moves by the line of
  // these (computed below), not through any one point.
  const double wobble[3] = {1e-6, -2e-6, 1e-6};
  int calls = 0;
  auto fit = measure_experts(device, [&](const std::function<void()>&) {
    const int task = calls % 3;
    const size_t at = static_cast<size_t>(calls / 3);
    ++calls;
    return priced(rows[at], task) +
           8 * (intercept[task] + slope[task] * static_cast<double>(rows[at]) + (task == 0 ? wobble[at] : 0.0));
  });
  ASSERT_TRUE(fit.ok()) << fit.status().to_string();
  EXPECT_EQ(calls, 9);  // three tasks at each of three row counts
  ASSERT_EQ(fit->points.size(), 3u);
  EXPECT_EQ(fit->experts, 8);
  EXPECT_GT(fit->weight_bytes, 32.0 * 1024 * 1024);  // more than the build machine's last-level cache
  // The forward's wobble by least squares: x = 32, 128, 512 (mean 224), y = +1, -2, +1 us.
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < 3; ++i) {
    sxx += (static_cast<double>(rows[i]) - 224) * (static_cast<double>(rows[i]) - 224);
    sxy += (static_cast<double>(rows[i]) - 224) * wobble[i];
  }
  const double wobble_b = sxy / sxx, wobble_a = 0 - wobble_b * 224;
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(fit->points[i].priced_s[k], priced(rows[i], k), 1e-15) << k;
    const double a = intercept[k] + (k == 0 ? wobble_a : 0.0), b = slope[k] + (k == 0 ? wobble_b : 0.0);
    EXPECT_NEAR(fit->fitted_a[k], a, 1e-12) << k;
    EXPECT_NEAR(fit->fitted_b[k], b, 1e-14) << k;
  }
  EXPECT_NEAR(fit->call_s[0], intercept[0] + wobble_a, 1e-12);
  EXPECT_NEAR(fit->per_row_s[0], slope[0] + wobble_b, 1e-14);
  // The input gradient's line through the origin: b = sum(x y) / sum(x^2), not the clamped line's slope.
  double x2 = 0, xy = 0, y_mean = 0;
  for (size_t i = 0; i < 3; ++i) {
    const double x = static_cast<double>(rows[i]);
    x2 += x * x;
    xy += x * (intercept[1] + slope[1] * x);
    y_mean += (intercept[2] + slope[2] * x) / 3;
  }
  EXPECT_EQ(fit->call_s[1], 0);
  EXPECT_NEAR(fit->per_row_s[1], xy / x2, 1e-14);
  EXPECT_LT(fit->per_row_s[1], slope[1]);  // the origin line is flatter than the clamped one would be
  // The weight gradient's mean as its cost per call, slope 0.
  EXPECT_NEAR(fit->call_s[2], y_mean, 1e-12);
  EXPECT_EQ(fit->per_row_s[2], 0);
  // Falling and below 0 everywhere: nothing to charge.
  auto falling = measure_experts(device, [&, n = 0](const std::function<void()>&) mutable {
    const int task = n % 3;
    const double x = static_cast<double>(rows[static_cast<size_t>(n / 3)]);
    ++n;
    return priced(rows[static_cast<size_t>((n - 1) / 3)], task) + 8 * (-1e-6 - 1e-9 * x);
  });
  ASSERT_TRUE(falling.ok()) << falling.status().to_string();
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(falling->call_s[k], 0) << k;
    EXPECT_EQ(falling->per_row_s[k], 0) << k;
  }
  // A kernel that never ran undisturbed is an error, not a figure.
  auto loaded = measure_experts(device, [](const std::function<void()>&) { return HUGE_VAL; });
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("too loaded"), std::string::npos) << loaded.status().message();
  // A figure that a calibration file would refuse (over kMaxExpertCallS) is refused here, not written.
  auto slow = measure_experts(device, [](const std::function<void()>&) { return 1.0; });  // 1 s a layer
  ASSERT_FALSE(slow.ok());
  EXPECT_NE(slow.status().message().find("calibrate again"), std::string::npos) << slow.status().message();
}

// The expert-call figures round-trip through a calibration file; a negative or absurd one is refused, naming it.
TEST(CalibrationFileTest, ExpertCallFigures) {
  auto c = cost::Calibration::from_json(
      Json::parse(
          R"({"expert_shape": {"hidden": 128, "ffn": 256}, "expert_call_forward_s": 2.5e-5, "expert_call_backward_input_s": 3e-5,
                      "expert_call_backward_weight_s": 1e-5})"),
      "cal.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->expert_call_forward_s, 2.5e-5);
  EXPECT_EQ(c->expert_call_backward_input_s, 3e-5);
  EXPECT_EQ(c->expert_call_backward_weight_s, 1e-5);
  EXPECT_EQ(c->expert_shape_hidden, 128);
  EXPECT_EQ(c->expert_shape_ffn, 256);
  auto rows = cost::Calibration::from_json(
      Json::parse(
          R"({"expert_shape": {"hidden": 128, "ffn": 256}, "expert_row_forward_s": 3e-7, "expert_row_backward_input_s": 0,
                      "expert_row_backward_weight_s": 1e-7})"),
      "cal.json");
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  EXPECT_EQ(rows->expert_row_forward_s, 3e-7);
  EXPECT_EQ(rows->expert_row_backward_weight_s, 1e-7);
  auto none = cost::Calibration::from_json(Json::parse("{}"), "cal.json");  // presets and older files: 0
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->expert_call_forward_s + none->expert_call_backward_input_s + none->expert_call_backward_weight_s, 0);
  auto bad = [](const std::string& text) {
    auto r = cost::Calibration::from_json(Json::parse(text), "cal.json");
    return r.ok() ? std::string() : r.status().message();
  };
  // The figures without the shape they were measured at, or a bad shape: refused, naming the field.
  EXPECT_NE(bad(R"({"expert_call_forward_s": 2e-5})").find("expert_shape: missing"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_row_backward_weight_s": 1e-7})").find("expert_shape"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_shape": {"hidden": 128}})").find("expert_shape.ffn"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_shape": {"hidden": 0, "ffn": 256}})").find("expert_shape.hidden"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_shape": {"hidden": 128, "ffn": 256, "experts": 8}})").find("experts"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_call_forward_s": -1e-6})").find("expert_call_forward_s"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_call_backward_input_s": -1})").find("expert_call_backward_input_s"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_call_backward_weight_s": 0.5})").find("expert_call_backward_weight_s"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_call_forward_s": "25us"})").find("expert_call_forward_s"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_row_forward_s": -1e-9})").find("expert_row_forward_s"), std::string::npos);
  EXPECT_NE(bad(R"({"expert_row_backward_weight_s": 1e-3})").find("expert_row_backward_weight_s"), std::string::npos);
}

// Bad per-thread and sharing entries are refused, naming the entry and the fix.
TEST(CalibrationFileTest, BadEntriesAreNamed) {
  auto bad = [](const std::string& text) {
    auto c = cost::Calibration::from_json(Json::parse(text), "cal.json");
    return c.ok() ? std::string() : c.status().message();
  };
  EXPECT_NE(bad(R"({"thread_figures": [{"threads": 2, "peak_flops_fp32": 1e11, "gemm_half_dim": 0,
                    "memory_bw_bytes_per_s": 1e10}, {"threads": 1, "peak_flops_fp32": 1e11, "gemm_half_dim": 0,
                    "memory_bw_bytes_per_s": 1e10}]})")
                .find("ascending order"),
            std::string::npos);
  EXPECT_NE(bad(R"({"thread_figures": [{"threads": 1, "gemm_half_dim": 0, "memory_bw_bytes_per_s": 1e10}]})")
                .find("thread_figures[0].peak_flops_fp32"),
            std::string::npos);
  EXPECT_NE(bad(R"({"core_sharing": [{"ranks": 3, "efficiency": 0.9}]})").find("n = 2, 3, ... in turn"),
            std::string::npos);
  EXPECT_NE(bad(R"({"core_sharing": [{"ranks": 2, "efficiency": 0}]})").find("core_sharing[0].efficiency"),
            std::string::npos);
  EXPECT_NE(bad(R"({"core_sharing": {"ranks": 2}})").find("expected an array"), std::string::npos);
  EXPECT_NE(bad(R"({"copy_bw_bytes_per_s": 0})").find("copy_bw_bytes_per_s"), std::string::npos);
  EXPECT_NE(bad(R"({"copy_bw_bytes_per_s": "fast"})").find("copy_bw_bytes_per_s"), std::string::npos);
}


TEST(CalibrateCliTest, WritesACalibrationThatTheModelLoads) {
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("piper_calibrate_" + std::to_string(::getpid()) + ".json")).string();
  std::string text;
  const int rc = run_calibrate("", "--sharing-rounds 1 --model tiny-moe --out " + out, &text);
  if (rc != 0 && too_noisy(text)) {
    EXPECT_FALSE(std::filesystem::exists(out));  // a refused fit writes nothing
    GTEST_SKIP() << "the machine was too loaded to fit the GEMM curve three times: " << text;
  }
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("calibrate: GEMM 8 x 512 x 512"), std::string::npos) << text;  // progress lines
  auto c = cost::Calibration::load(out);
  ASSERT_TRUE(c.ok()) << c.status().to_string() << "\n" << text;
  EXPECT_EQ(c->gemm_efficiency, 1);  // of the measured peak below
  EXPECT_GT(c->peak_flops_fp32, 1e9);  // a core's fp32 GEMM: tens of GFLOP/s at least
  EXPECT_GT(c->memory_bw_bytes_per_s, 1e9);
  EXPECT_GT(c->copy_bw_bytes_per_s, 1e9);  // one thread's std::copy, the staging of dp collectives
  EXPECT_NE(text.find("calibrate: copy rate (1 thread, 64 MiB)"), std::string::npos) << text;
  EXPECT_FALSE(c->gemm_table);
  // Every thread count of this machine measured (one a loaded machine left unfitted is named as such), the first
  // being the one-core figures; the sharing of 2..2C ranks.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (text.find("not fitted") == std::string::npos) {
    EXPECT_EQ(c->thread_figures.size(), static_cast<size_t>(cores)) << text;
  }
  ASSERT_GE(c->thread_figures.size(), 1u) << text;
  EXPECT_EQ(c->thread_figures[0].threads, 1);
  EXPECT_EQ(c->thread_figures[0].peak_flops_fp32, c->peak_flops_fp32);
  EXPECT_EQ(c->thread_figures[0].memory_bw_bytes_per_s, c->memory_bw_bytes_per_s);
  for (const auto& f : c->thread_figures) EXPECT_GT(f.task_overhead_s, 0) << f.threads;
  EXPECT_EQ(c->core_sharing.size(), static_cast<size_t>(2 * cores - 1)) << text;
  EXPECT_NE(text.find("calibrate: core sharing, round 1 of 1"), std::string::npos) << text;
  // --model: the task profile, and the core sharing of the model's own steps for the same 2..2C processes (their
  // efficiency within what a file accepts), printed beside the GEMM's.
  // (A machine loaded from outside can leave every thread count's points out of the file, and so the profile.)
  EXPECT_NE(text.find("calibrate: core sharing of tiny-moe's own steps, round 1 of 1: 1.."), std::string::npos) << text;
  EXPECT_NE(text.find("tiny-moe's steps "), std::string::npos) << text;
  if (c->task_profiles.empty()) {
    EXPECT_NE(text.find("left out of the file"), std::string::npos) << text;
  }
  for (const cost::Calibration::TaskProfile& p : c->task_profiles) {
    EXPECT_EQ(p.model, "tiny-moe");
    EXPECT_EQ(p.sharing.size(), static_cast<size_t>(2 * cores - 1)) << text;
  }
  // The attention kernels' cost beyond their FLOPs: a few to tens of bytes per score element on a CPU.
  EXPECT_GT(c->attention_score_bytes, 0) << text;
  EXPECT_LT(c->attention_score_bytes, 1e3) << text;
  EXPECT_NE(text.find("B per score element (attention_score_bytes"), std::string::npos) << text;
  // The experts' cost per call beyond their FLOPs: written (>= 0; tens of us on this machine when written), within
  // what a file accepts, with its progress lines.
  EXPECT_GE(c->expert_call_forward_s, 0) << text;
  EXPECT_LE(c->expert_call_backward_weight_s, cost::kMaxExpertCallS) << text;
  EXPECT_NE(text.find("calibrate: experts at 32 rows each"), std::string::npos) << text;
  EXPECT_NE(text.find("(expert_call_*_s), and per row"), std::string::npos) << text;
  EXPECT_LE(c->expert_row_forward_s, cost::kMaxExpertRowS) << text;
  std::filesystem::remove(out);
}

std::string host() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// Commands on local-cpu use this machine's default file (XDG_CONFIG_HOME/piper/calibration/<host>.json) and say
// so, commands on another cluster do not, PIPER_CALIBRATION=none and PIPER_CALIBRATION=FILE override it, and a
// missing named file or a damaged default file is an error that names it and the way out.
TEST(CalibrateCliTest, DefaultLocationIsFoundForThisMachineOnly) {
  const auto dir = std::filesystem::temp_directory_path() / ("piper_xdg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "piper" / "calibration");
  const std::string file = (dir / "piper" / "calibration" / (host() + ".json")).string();
  { std::FILE* f = std::fopen(file.c_str(), "w"); std::fputs("{\"gemm_efficiency\": 0.5}", f); std::fclose(f); }
  const std::string env = "env -u PIPER_CALIBRATION XDG_CONFIG_HOME=" + dir.string();
  const std::string estimate = "estimate --model tiny-moe --nodes 1 --json --strategy dp=2 --cluster local-cpu";
  std::string text;
  ASSERT_EQ(run_piper(env, estimate, &text), 0) << text;
  EXPECT_NE(text.find("\"calibration\": \"" + file + " (this machine's default calibration)\""), std::string::npos)
      << text;
  const std::string with_file = text;
  ASSERT_EQ(run_piper("env PIPER_CALIBRATION=none XDG_CONFIG_HOME=" + dir.string(), estimate, &text), 0);
  EXPECT_NE(text.find("preset figures (no calibration file for this machine"), std::string::npos) << text;
  EXPECT_NE(text, with_file);  // gemm_efficiency 0.5 instead of the preset's 0.6: other step times
  ASSERT_EQ(run_piper("env PIPER_CALIBRATION=" + file, estimate, &text), 0) << text;
  EXPECT_NE(text.find(file + " (PIPER_CALIBRATION)"), std::string::npos) << text;
  ASSERT_EQ(run_piper(env, "estimate --model tiny-moe --nodes 1 --json --strategy dp=8 --cluster dgx-h100", &text), 0)
      << text;
  EXPECT_NE(text.find("\"calibration\": \"preset figures (no --calibration file)\""), std::string::npos) << text;

  EXPECT_NE(run_piper("env PIPER_CALIBRATION=" + (dir / "missing.json").string(), estimate, &text), 0);
  EXPECT_NE(text.find("PIPER_CALIBRATION"), std::string::npos) << text;
  { std::FILE* f = std::fopen(file.c_str(), "w"); std::fputs("{\"gemm_efficiency\": 7}", f); std::fclose(f); }
  EXPECT_NE(run_piper(env, estimate, &text), 0);
  EXPECT_NE(text.find("the default calibration file"), std::string::npos) << text;
  EXPECT_NE(text.find("PIPER_CALIBRATION=none"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

// `piper calibrate` without --out writes the default file (creating its folder). On a machine too loaded to fit
// the GEMM curve the command refuses to write anything, which this test accepts only with that message.
TEST(CalibrateCliTest, WritesTheDefaultFileWithoutOut) {
  const auto dir = std::filesystem::temp_directory_path() / ("piper_xdg_out_" + std::to_string(::getpid()));
  const std::string file = (dir / "piper" / "calibration" / (host() + ".json")).string();
  std::string text;
  const int rc =
      run_calibrate("env -u PIPER_CALIBRATION XDG_CONFIG_HOME=" + dir.string(), "--sharing-rounds 0", &text);
  if (rc != 0) {
    EXPECT_TRUE(too_noisy(text)) << text;
    EXPECT_FALSE(std::filesystem::exists(file));
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "the machine was too loaded to fit the GEMM curve";
  }
  EXPECT_TRUE(std::filesystem::is_regular_file(file)) << text;
  EXPECT_NE(text.find("written   " + file), std::string::npos) << text;
  EXPECT_TRUE(cost::Calibration::load(file).ok());
  std::filesystem::remove_all(dir);
}

void write(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

// The link calibration (piper calibrate --ranks R) is found like the device's: local-cpu commands use
// XDG_CONFIG_HOME/piper/calibration/<host>.links.json and name it on their `links` line (with its synchronisation
// costs, or why they do not apply), PIPER_CALIBRATION=none or PIPER_COMM_CALIBRATION=none turn it off,
// --comm-calibration FILE still works on any cluster, and a damaged default file is an error with the way out.
TEST(CalibrateCliTest, LinkCalibrationDefaultLocationAndFlag) {
  const auto dir = std::filesystem::temp_directory_path() / ("piper_xdg_links_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "piper" / "calibration");
  const std::string file = (dir / "piper" / "calibration" / (host() + ".links.json")).string();
  write(file, R"({"ranks_per_node": 2, "node": {"intra": {"latency_s": 1e-5, "bw_bytes_per_s": 1e8}},
                  "measured": {"sync_all_reduce": {"excess_s": 0.002}, "sync_all_to_all": {"excess_s": 0.003}}})");
  const std::string env = "env -u PIPER_CALIBRATION -u PIPER_COMM_CALIBRATION XDG_CONFIG_HOME=" + dir.string();
  const std::string estimate = "estimate --model tiny-moe --nodes 1 --json --strategy dp=2 --cluster local-cpu";
  std::string text;
  ASSERT_EQ(run_piper(env, estimate, &text), 0) << text;
  EXPECT_NE(text.find("\"links\": \"" + file +
                      " (this machine's default link calibration; synchronisation +3 ms "
                      "per all-to-all, +2 ms per other collective)\""),
            std::string::npos)
      << text;
  const std::string with_file = text;
  ASSERT_EQ(run_piper("env PIPER_CALIBRATION=none XDG_CONFIG_HOME=" + dir.string(), estimate, &text), 0);
  EXPECT_NE(text.find("preset figures (no link calibration for this machine"), std::string::npos) << text;
  EXPECT_NE(text, with_file);  // 0.1 GB/s instead of the preset's 3 GB/s: other step times
  ASSERT_EQ(run_piper(env + " PIPER_COMM_CALIBRATION=none", estimate, &text), 0);
  EXPECT_NE(text.find("preset figures (no link calibration for this machine"), std::string::npos) << text;
  ASSERT_EQ(run_piper("env PIPER_CALIBRATION=none", estimate + " --comm-calibration " + file, &text), 0) << text;
  EXPECT_NE(text.find(file + " (--comm-calibration; synchronisation"), std::string::npos) << text;
  ASSERT_EQ(run_piper(env, "estimate --model tiny-moe --nodes 1 --json --strategy dp=8 --cluster dgx-h100", &text), 0);
  EXPECT_NE(text.find("\"links\": \"preset figures (no --comm-calibration file)\""), std::string::npos) << text;
  write(file, R"({"node": {"intra": {"bw_bytes_per_s": -1}}})");
  EXPECT_NE(run_piper(env, estimate, &text), 0);
  EXPECT_NE(text.find("the default link calibration file"), std::string::npos) << text;
  EXPECT_NE(text.find("PIPER_COMM_CALIBRATION=none"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace piper::cli
