#include "piper/cli/plan_outcome.h"

#include <string>

#include "piper/base/units.h"

namespace piper::cli {

Status nothing_fits(const ClusterSpec& cluster, double memory_fraction, const planner::SearchResult& r) {
  const std::string device = format_bytes(static_cast<double>(cluster.device.memory_bytes) * memory_fraction);
  if (r.stats.fitting > 0) {
    return failed_precondition("plan: " + std::to_string(r.stats.fitting) +
                               " strategies fit by the closed-form model, but the compiler rejected the " +
                               std::to_string(r.stats.verify_failed) +
                               " best of them (first: " + r.stats.first_verify_failure +
                               "); try more with --verify-attempts, or see the "
                               "closed-form ranking with --no-verify");
  }
  if (!r.has_smallest) {
    return failed_precondition("plan: no valid strategy in the space (" + std::to_string(r.stats.rejected_total()) +
                               " rejected by rule; see --json rejected_by_rule); check that --global-batch is a "
                               "multiple of the data-parallel size and the model has enough layers and heads");
  }
  const auto& p = r.smallest;
  return resource_exhausted("plan: no strategy fits in " + device + " per device (--memory-fraction of " +
                            format_bytes(static_cast<double>(cluster.device.memory_bytes)) + "); the smallest needs " +
                            format_bytes(p.peak_memory_bytes()) + " on pipeline rank " +
                            std::to_string(p.estimate.worst_rank) + " (closest plan: " + p.strategy.to_string() +
                            "); add nodes, use a cluster with more device memory, or lower --seq/--global-batch");
}

}  // namespace piper::cli
