// The compute calibration (`plan --calibration FILE`): parse_json + cost::Calibration::from_json
// (Calibration::load); a calibration that loads must give finite, positive device times.
#include <cmath>
#include <cstdint>

#include "fuzz_common.h"
#include "piper/base/json.h"
#include "piper/cost/device_model.h"
#include "piper/spec/cluster_loader.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ClusterSpec preset = *load_cluster("dgx-h100", 1);
  Result<Json> j = parse_json(fuzz::as_text(data, size), "calibration.json");
  if (!j.ok()) return 0;
  Result<cost::Calibration> c = cost::Calibration::from_json(*j, "calibration.json");
  if (!c.ok()) return 0;
  const cost::DeviceModel device(preset.device, DType::kBF16, *c);
  const double t = device.time_s(1e12, 1e9, 4096);
  fuzz::require(std::isfinite(t) && t > 0, "a loaded calibration gives a finite positive time", std::to_string(t));
  return 0;
}
