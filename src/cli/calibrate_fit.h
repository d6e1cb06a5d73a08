// `piper calibrate`'s fits (cmd_calibrate.cc, calibrate_share.cc): the device model's GEMM curve
// eff(d) = a * d / (d + h) (cost/device_model.h) through measured (d, efficiency) points, and the efficiency of
// processes sharing the cores. Pure; tested in tests/planner/calibrate_fit_test.cc.
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

// The least-squares line y = a + b x through (x, y) points (x.size() == y.size() >= 2, two distinct x); shared by
// the GEMM curve and the experts' cost per call (calibrate_experts.cc).
struct Line {
  double a = 0, b = 0;
};
Line least_squares(const std::vector<double>& x, const std::vector<double>& y);

// Least squares on the linearised curve 1/eff = 1/a + (h/a) * (1/d). Needs >= 2 points with distinct d and positive
// efficiency. When 1/eff does not fall with 1/d (a <= 0 or h < 0): a flat curve (h = 0, a = the harmonic mean) if
// every point is within 15 % of it, else InvalidArgument (too noisy to fit).
Result<GemmCurve> fit_gemm_curve(const std::vector<GemmPoint>& points);

// What one process did in a window of a concurrent run: kernel calls completed and the CPU and wall seconds they
// took (its own CPU time, CLOCK_PROCESS_CPUTIME_ID).
struct ShareSample {
  double calls = 0;
  double cpu_s = 0;
  double wall_s = 0;
};

struct SharingEfficiency {
  // Mean over the n processes of (calls / cpu_s) / (alone's calls / cpu_s): the speed each keeps per second it
  // runs (caches, memory bandwidth and context switches shared), whatever else the machine ran meanwhile.
  double per_cpu = 0;
  // Mean of (calls / wall_s) / (alone's calls / wall_s * min(1, cores / n)): the same per wall second against
  // ideal processor sharing of `cores` cores; other load on the machine lowers it.
  double per_wall = 0;
};

// n = together.size() >= 1 processes that ran at once against one process alone on a machine of `cores` cores.
// InvalidArgument when a sample has no calls or no time.
Result<SharingEfficiency> sharing_efficiency(const ShareSample& alone, const std::vector<ShareSample>& together,
                                             double cores);

}  // namespace piper::cli
