// FlowSim: an event-driven fluid simulation of flows sharing links with max-min fairness.
//
// A flow moves `bytes` along a list of hops (links). It becomes ready when every flow in `after` has completed
// and `release_s` has passed, waits its latency (alpha), then transfers. While transferring it shares every link
// it crosses max-min fairly with the other transferring flows (progressive filling); rates are recomputed
// whenever a flow starts or ends. A flow with no hops (a device to itself) or no bytes completes when its
// latency has passed. run() returns every flow's completion time in seconds.
//
// Aggregate flows (simulating one representative of a class of identical ranks): a flow may stand for n
// identical member flows. Its per-hop weight says how many members cross that link: n on a link all members
// share (a group fabric), 1 on the representative's own link (its NIC). Every member gets the same rate r and a
// hop of weight w loads its link with w * r, so on symmetric cases an aggregate flow completes exactly when the
// n individual flows would. Completion time and bytes are per member.
//
// Flows may only wait for flows added before them (ids are increasing), so the dependency graph is acyclic.
// Thread-safety: none; build, then run (run is const and may be called again).
#pragma once

#include <vector>

#include "piper/base/status.h"

namespace piper::sim {

struct Hop {
  int link = 0;
  double weight = 1.0;  // member flows of this flow crossing the link (1 for a plain flow)
};

struct FlowSpec {
  std::vector<Hop> hops;
  double bytes = 0;        // per member flow
  double latency_s = 0;    // alpha, paid once before the bytes move
  double release_s = 0;    // earliest time the flow may start
  std::vector<int> after;  // ids of flows that must complete first
  int src_device = -1;     // endpoints when known (collectives.h sets them); informational, run() ignores them
  int dst_device = -1;
};

// Max-min fair rates (bytes/s per member flow) of flows sharing links of the given capacities, by progressive
// filling: raise every unfrozen flow's rate together, freeze the flows of each link that saturates. Flows without
// hops get +infinity. Precondition: capacities > 0, link ids valid, weights > 0.
std::vector<double> max_min_rates(const std::vector<double>& capacity_bytes_per_s,
                                  const std::vector<const std::vector<Hop>*>& flows);

class FlowSim {
 public:
  explicit FlowSim(std::vector<double> link_bw_bytes_per_s);

  // Returns the new flow's id. Errors: unknown link, weight <= 0, negative or non-finite bytes/latency/release,
  // an `after` id that is not an earlier flow.
  Result<int> add(FlowSpec spec);
  int num_flows() const { return static_cast<int>(flows_.size()); }
  const FlowSpec& flow(int id) const { return flows_[id]; }

  struct Stats {
    int rate_updates = 0;  // max-min recomputations (one per event time)
  };
  // Completion time of every flow, indexed by id.
  std::vector<double> run(Stats* stats = nullptr) const;

 private:
  std::vector<double> link_bw_;
  std::vector<FlowSpec> flows_;
};

}  // namespace piper::sim
