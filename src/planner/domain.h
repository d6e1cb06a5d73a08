// Where a strategy's expert-parallel groups sit relative to the cluster's scale-up domains (ClusterSpec::
// ScaleUpSpec: 72 GPUs of a GB200 NVL72 behind one NVLink switch fabric, or one 8-GPU node elsewhere).
//
// Ranks are numbered with the strategy's mesh order, first axis innermost (strategy.h), and fill a domain's
// devices before the next domain's. An EP group is `ep` ranks `stride` apart, where stride is the product of
// the axes inside ep; the groups tile aligned blocks of stride * ep ranks. Every group lies inside one domain
// exactly when that block divides the domain's ranks (devices_per_domain). The planner keeps such placements
// first: its cost model charges an EP group that straddles domains the NIC bandwidth of its worst-aligned copy
// (cost/network.h), and `piper plan` reports the placement of every plan. Pure functions, thread-safe.
#pragma once

#include "piper/spec/cluster_spec.h"
#include "piper/strategy/strategy.h"

namespace piper::planner {

// Ranks between consecutive members of an EP group (1 with parallel folding, whose expert groups are ep
// consecutive ranks of a stage).
int ep_stride(const Strategy& s);

// True when ep <= 1, or every EP group lies inside one scale-up domain.
bool ep_inside_domain(const Strategy& s, const ClusterSpec& cluster);

// True when some mesh order would put every EP group inside one domain (ep * tp, ep's tightest block when tp
// stays innermost, divides the domain's ranks).
bool ep_fits_domain(const Strategy& s, const ClusterSpec& cluster);

}  // namespace piper::planner
