// The communication calibration (`plan --comm-calibration FILE`, written by `bench comm --calibration-out`):
// parse_json + apply_comm_calibration (load_comm_calibration) onto the dgx-h100 preset, two nodes.
#include <cstdint>

#include "fuzz_common.h"
#include "piper/base/json.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/comm_calibration.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ClusterSpec preset = *load_cluster("dgx-h100", 2);
  Result<Json> j = parse_json(fuzz::as_text(data, size), "comm_calibration.json");
  if (!j.ok()) return 0;
  ClusterSpec cluster = preset;
  (void)apply_comm_calibration(*j, "comm_calibration.json", &cluster);
  return 0;
}
