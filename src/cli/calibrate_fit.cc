#include "piper/cli/calibrate_fit.h"

#include <cmath>
#include <cstdio>
#include <set>
#include <string>

namespace piper::cli {

namespace {
constexpr double kFlatTolerance = 0.15;  // +-15 %: the spread of one-round medians on the loaded 2-core machine
}  // namespace

Result<GemmCurve> fit_gemm_curve(const std::vector<GemmPoint>& points) {
  std::set<double> dims;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const GemmPoint& p : points) {
    if (p.min_dim <= 0 || p.efficiency <= 0) {
      return invalid_argument("calibrate: a GEMM point needs d > 0 and efficiency > 0, got d=" +
                              std::to_string(p.min_dim) + ", efficiency=" + std::to_string(p.efficiency));
    }
    dims.insert(p.min_dim);
    const double x = 1.0 / p.min_dim, y = 1.0 / p.efficiency;
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  if (dims.size() < 2) return invalid_argument("calibrate: fitting the GEMM curve needs two or more distinct sizes");
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  const double intercept = (sy - slope * sx) / n;
  if (intercept <= 0 || slope < 0) {
    // Efficiency that does not rise with size. Flat within noise (every point within kFlatTolerance of the mean):
    // the curve with h = 0 (a CPU core's GEMM at n = k = 512 is near its peak from d = 8 on; on the loaded build
    // machine the fitted h came out as -0.9 on points 8..512). Anything else is noise, not a curve.
    const double mean_y = sy / n;
    bool flat = true;
    for (const GemmPoint& p : points) flat = flat && std::abs(p.efficiency * mean_y - 1.0) <= kFlatTolerance;
    if (flat) return GemmCurve{1.0 / mean_y, 0.0};
    std::string measured;
    for (const GemmPoint& p : points) {
      char buf[48];
      std::snprintf(buf, sizeof(buf), "%s%.3f at d=%.0f", measured.empty() ? "" : ", ", p.efficiency, p.min_dim);
      measured += buf;
    }
    return invalid_argument("calibrate: the measured GEMM efficiency does not rise with size (" + measured +
                            "; 1/eff = " + std::to_string(intercept) + " + " + std::to_string(slope) +
                            " / d); the machine is too noisy to fit: rerun it when idle");
  }
  GemmCurve c;
  c.gemm_efficiency = 1.0 / intercept;
  c.gemm_half_dim = slope / intercept;
  return c;
}

}  // namespace piper::cli
