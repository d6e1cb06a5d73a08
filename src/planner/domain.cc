#include "piper/planner/domain.h"

namespace piper::planner {

int ep_stride(const Strategy& s) {
  if (s.fold) return 1;
  int stride = 1;
  for (const auto& axis : s.order) {
    if (axis == "ep") return stride;
    if (axis == "tp") stride *= s.tp;
    if (axis == "dp") stride *= s.edp();
    if (axis == "pp") stride *= s.pp;
  }
  return stride;
}

bool ep_inside_domain(const Strategy& s, const ClusterSpec& cluster) {
  if (s.ep <= 1) return true;
  const int64_t block = static_cast<int64_t>(ep_stride(s)) * s.ep;
  return cluster.devices_per_domain() % block == 0;
}

bool ep_fits_domain(const Strategy& s, const ClusterSpec& cluster) {
  if (s.ep <= 1) return true;
  return cluster.devices_per_domain() % (static_cast<int64_t>(s.tp) * s.ep) == 0;
}

}  // namespace piper::planner
