#include "piper/cli/calibrate_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

namespace piper::cli {

namespace {
constexpr double kFlatTolerance = 0.15;  // +-15 %: the spread of one-round medians on the loaded 2-core machine
}  // namespace

Line least_squares(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  Line l;
  l.b = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  l.a = (sy - l.b * sx) / n;
  return l;
}

Result<GemmCurve> fit_gemm_curve(const std::vector<GemmPoint>& points) {
  std::set<double> dims;
  std::vector<double> xs, ys;
  for (const GemmPoint& p : points) {
    if (p.min_dim <= 0 || p.efficiency <= 0) {
      return invalid_argument("calibrate: a GEMM point needs d > 0 and efficiency > 0, got d=" +
                              std::to_string(p.min_dim) + ", efficiency=" + std::to_string(p.efficiency));
    }
    dims.insert(p.min_dim);
    xs.push_back(1.0 / p.min_dim);
    ys.push_back(1.0 / p.efficiency);
  }
  if (dims.size() < 2) return invalid_argument("calibrate: fitting the GEMM curve needs two or more distinct sizes");
  const Line line = least_squares(xs, ys);
  const double slope = line.b, intercept = line.a;
  if (intercept <= 0 || slope < 0) {
    // Efficiency that does not rise with size. Flat within noise (every point within kFlatTolerance of the mean):
    // the curve with h = 0 (a CPU core's GEMM at n = k = 512 is near its peak from d = 8 on; on the loaded build
    // machine the fitted h came out as -0.9 on points 8..512). Anything else is noise, not a curve.
    double mean_y = 0;
    for (double y : ys) mean_y += y / static_cast<double>(ys.size());
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

namespace {

Status check_sample(const ShareSample& s, const std::string& what) {
  if (s.calls > 0 && s.cpu_s > 0 && s.wall_s > 0) return ok_status();
  return invalid_argument("calibrate: " + what + " did " + std::to_string(s.calls) + " calls in " +
                          std::to_string(s.cpu_s) + " CPU s, " + std::to_string(s.wall_s) +
                          " wall s; every process needs calls > 0 and time > 0 (a longer window)");
}

}  // namespace

Result<SharingEfficiency> sharing_efficiency(const ShareSample& alone, const std::vector<ShareSample>& together,
                                             double cores) {
  PIPER_RETURN_IF_ERROR(check_sample(alone, "the process alone"));
  if (together.empty() || !(cores > 0)) {
    return invalid_argument("calibrate: sharing needs one or more processes and cores > 0, got " +
                            std::to_string(together.size()) + " and " + std::to_string(cores));
  }
  const double n = static_cast<double>(together.size());
  const double share = std::min(1.0, cores / n);
  SharingEfficiency e;
  for (size_t i = 0; i < together.size(); ++i) {
    const ShareSample& s = together[i];
    PIPER_RETURN_IF_ERROR(check_sample(s, "process " + std::to_string(i) + " of " + std::to_string(together.size())));
    e.per_cpu += (s.calls / s.cpu_s) / (alone.calls / alone.cpu_s) / n;
    e.per_wall += (s.calls / s.wall_s) / (alone.calls / alone.wall_s * share) / n;
  }
  return e;
}

}  // namespace piper::cli
