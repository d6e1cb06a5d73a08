// What `piper plan` (and the Python module's piper.plan) says when no plan comes back.
#pragma once

#include "piper/base/status.h"
#include "piper/planner/search.h"
#include "piper/spec/cluster_spec.h"

namespace piper::cli {

// The error of a search whose `top` is empty: the compiler rejected every fitting plan (failed precondition), no
// valid strategy exists (failed precondition), or none fits in memory_fraction of the device (resource exhausted,
// naming the closest plan and what it needs).
Status nothing_fits(const ClusterSpec& cluster, double memory_fraction, const planner::SearchResult& r);

}  // namespace piper::cli
