#include "piper/cost/gemm_table.h"

#include <cmath>

namespace piper::cost {
namespace {

// H100 SXM, BF16 x BF16 -> BF16, batch 1: OpenXLA's measured matmul table for sm_90
// (github.com/openxla/xla, xla/service/gpu/model/matmul_interpolator_data.h, kDefaultMatmulPTable, key "sm_90",
// flops "BF16xBF16->BF16"; the file's first version, 2025, which holds sm_90 only). Shapes (m, n, k) with the
// other two dimensions 4096; values in TFLOP/s as the file gives FLOP/s.
const GemmTable kH100Sxm{
    "NVIDIA H100 SXM 80GB",
    "OpenXLA xla/service/gpu/model/matmul_interpolator_data.h, sm_90, BF16xBF16->BF16, b = 1",
    {
        {256, 435.771844155844, 398.863976225854, 393.024093704246},   // (256,4096,4096) (4096,256,4096) (4096,4096,256)
        {512, 653.127630170316, 655.520039072039, 543.391611336032},   // (512,4096,4096) ...
        {1024, 742.303369512616, 740.767039668851, 681.092181414525},  // (1024,4096,4096) ...
        {2048, 760.440385269121, 764.093096602028, 739.873780534022},  // (2048,4096,4096) ...
        {4096, 786.048187408492, 786.048187408492, 786.048187408492},  // (4096,4096,4096)
    },
};

double mean_tflops(const GemmTablePoint& p) { return (p.tflops_m + p.tflops_n + p.tflops_k) / 3; }

}  // namespace

double GemmTable::efficiency(double min_dim, double peak_flops) const {
  const auto eff = [&](const GemmTablePoint& p) { return mean_tflops(p) * 1e12 / peak_flops; };
  const GemmTablePoint& lo = points.front();
  const GemmTablePoint& hi = points.back();
  if (min_dim <= lo.min_dim) {
    constexpr double kHalfDim = 64;  // the curve's shape below the table [inferred]
    return eff(lo) * (min_dim / (min_dim + kHalfDim)) / (lo.min_dim / (lo.min_dim + kHalfDim));
  }
  if (min_dim >= hi.min_dim) return eff(hi);
  for (size_t i = 1; i < points.size(); ++i) {
    if (min_dim > points[i].min_dim) continue;
    const GemmTablePoint& a = points[i - 1];
    const GemmTablePoint& b = points[i];
    const double t = std::log2(min_dim / a.min_dim) / std::log2(b.min_dim / a.min_dim);
    return eff(a) + t * (eff(b) - eff(a));
  }
  return eff(hi);
}

const GemmTable* find_gemm_table(const DeviceSpec& device, DType compute_dtype) {
  if (compute_dtype != DType::kBF16 && compute_dtype != DType::kFP16) return nullptr;
  if (device.name == kH100Sxm.device) return &kH100Sxm;
  return nullptr;
}

}  // namespace piper::cost
