// Measured GEMM throughput per device, indexed by the GEMM's smallest dimension: the efficiency DeviceModel uses
// instead of its curve on a device that has a table (the curve stays the fallback for the others).
//
// A table holds, per smallest dimension d, the measured TFLOP/s of the three GEMMs (m, n, k) whose smallest
// dimension is d and whose other two are the largest measured (m = d, n = d, k = d); the efficiency at d is their
// mean over the device's peak. Between points: linear in log2 d. Above the largest d: the largest point's
// efficiency (no extrapolation past the measured maximum). Below the smallest d: that point's efficiency scaled by
// the curve's shape, (d / (d + 64)) / (d0 / (d0 + 64)) [inferred: no measurement below d0].
//
// Keyed by DeviceSpec::name and the compute dtype (BF16 and FP16 only). Every point names its source.
#pragma once

#include <string>
#include <vector>

#include "piper/spec/cluster_spec.h"

namespace piper::cost {

struct GemmTablePoint {
  double min_dim;
  double tflops_m, tflops_n, tflops_k;  // measured, with m, n or k the small dimension
};

struct GemmTable {
  std::string device;  // DeviceSpec::name it applies to
  std::string source;  // where the measurements are from
  std::vector<GemmTablePoint> points;  // ascending min_dim

  // Fraction of `peak_flops` at smallest dimension `min_dim` (> 0).
  double efficiency(double min_dim, double peak_flops) const;
};

// The table for this device and compute dtype, or nullptr (the curve applies).
const GemmTable* find_gemm_table(const DeviceSpec& device, DType compute_dtype);

}  // namespace piper::cost
