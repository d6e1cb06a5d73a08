// `piper calibrate`'s fit (cmd_calibrate.cc): the device model's GEMM curve eff(d) = a * d / (d + h)
// (cost/device_model.h) through measured (d, efficiency) points. Pure; tested in tests/planner/calibrate_fit_test.cc.
#pragma once

#include <vector>

#include "piper/base/status.h"

namespace piper::cli {

struct GemmPoint {
  double min_dim = 0;     // the GEMM's smallest dimension
  double efficiency = 0;  // measured FLOP/s over the device's peak
};

struct GemmCurve {
  double gemm_efficiency = 0;  // a: the large-GEMM limit
  double gemm_half_dim = 0;    // h: the dimension at which a GEMM reaches a / 2
};

// Least squares on the linearised curve 1/eff = 1/a + (h/a) * (1/d). Needs >= 2 points with distinct d and positive
// efficiency. When 1/eff does not fall with 1/d (a <= 0 or h < 0): a flat curve (h = 0, a = the harmonic mean) if
// every point is within 15 % of it, else InvalidArgument (too noisy to fit).
Result<GemmCurve> fit_gemm_curve(const std::vector<GemmPoint>& points);

}  // namespace piper::cli
