#include "piper/cli/calibrate_fit.h"

#include <set>
#include <string>

namespace piper::cli {

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
    return invalid_argument("calibrate: the measured GEMM efficiency does not rise with size (1/eff = " +
                            std::to_string(intercept) + " + " + std::to_string(slope) +
                            " / d); the machine is too noisy to fit: rerun it when idle");
  }
  GemmCurve c;
  c.gemm_efficiency = 1.0 / intercept;
  c.gemm_half_dim = slope / intercept;
  return c;
}

}  // namespace piper::cli
