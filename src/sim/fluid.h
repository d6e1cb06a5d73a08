// FluidNet: the incremental form of FlowSim for a discrete-event simulator that learns about transfers as it
// goes. A *transfer* (one send/recv pair or one collective) is a small DAG of flows given by a FlowTemplate; it is
// started at the current time, its flows become ready when the flows they wait for are done, pay their latency,
// then share links max-min fairly (flow_sim.h's max_min_rates, with the same aggregate-flow hop weights) with every
// other flow in flight, whichever transfer it belongs to. The caller alternates next_time() and advance(): rates are
// recomputed lazily, only after the set of transferring flows changed.
//
// Local recomputation (the default; `local_rates` = false keeps the reference, a progressive filling over every
// flow in flight each time). The max-min fair allocation is the unique one in which every flow has a bottleneck:
// a saturated link on which no flow gets more. So when flows start or end, only the flows connected to them
// through links that were saturated can change rate: rates are recomputed for that component alone, on the
// capacity the other flows leave. A link shared with flows outside the component that was not saturated (the
// fabric link every inter-node flow crosses) keeps the others' rates valid as long as it stays unsaturated;
// if the component's new rates saturate it, the whole allocation is recomputed as in the reference. Both give
// the same rates up to floating-point rounding (tests/sim/fluid_test.cc compares them; docs/simulator.md).
//
// Bytes of a template are per unit of payload; start() scales them, so one template serves every transfer of the
// same shape. A transfer with no flows (or only empty ones) completes at its start time.
// Thread-safety: none.
#pragma once

#include <cstdint>
#include <limits>
#include <queue>
#include <vector>

#include "piper/sim/flow_sim.h"

namespace piper::sim {

struct FlowTemplate {
  struct Flow {
    std::vector<Hop> hops;
    double bytes = 0;  // per unit of payload (scaled by start())
    double latency_s = 0;
    std::vector<int> after;     // indices of earlier flows of the same template
    std::vector<int> children;  // filled by finalize(): flows that wait for this one
  };
  std::vector<Flow> flows;
  // Fills every flow's children from the `after` lists. Call once after building, before the first start().
  void finalize();
};

class FluidNet {
 public:
  // due_filter = false: advance() tests every flow in flight in full (the reference for the filter, tests only).
  explicit FluidNet(std::vector<double> link_bw_bytes_per_s, bool local_rates = true, bool due_filter = true);

  // Starts a transfer at time `now` (>= the last advance time). `tmpl` must outlive the transfer. `token` is
  // returned by advance() when the transfer completes.
  void start(const FlowTemplate* tmpl, double payload, double now, int64_t token);

  // Earliest time at which a flow finishes or becomes ready; +infinity when nothing is in flight.
  double next_time();
  // Moves time forward to t (<= next_time()) and appends the tokens of the transfers that completed by t.
  void advance(double t, std::vector<int64_t>* completed);

  bool idle() const { return live_transfers_ == 0 && done_tokens_.empty(); }
  int64_t flows_started() const { return flows_started_; }
  int64_t rate_updates() const { return rate_updates_; }
  // Of rate_updates(): how many the local form had to widen to every flow (a shared link saturated).
  int64_t full_rate_updates() const { return full_rate_updates_; }

 private:
  struct Transfer {
    const FlowTemplate* tmpl = nullptr;
    double payload = 0;
    int64_t token = 0;
    int flows_left = 0;
    std::vector<int> waiting;  // per template flow: dependencies not yet done
  };
  struct Active {
    int transfer = 0;
    int flow = 0;
    double left = 0;                         // bytes, as of the last change of `rate`
    const std::vector<Hop>* hops = nullptr;  // the template flow's
    std::vector<int> member_pos;             // per hop: its index in members_[hop's link]
    bool fresh = true;                       // started since the last rate computation
  };
  // Per active_ slot, apart from Active so that the scans over every flow in flight read dense arrays:
  // recompute_rates() the earliest finish_ and due_, advance() due_ (and the done test's fields for the few flows
  // that can pass it).
  std::vector<double> rate_;        // bytes/s per member flow (0: not computed yet)
  std::vector<double> finish_;      // absolute time it completes at its rate
  std::vector<double> due_;         // when it passes advance()'s done test at its rate
  std::vector<double> done_bytes_;  // kDoneFraction x its size: advance()'s done test
  struct Member {
    int flow = 0;  // index into active_
    int hop = 0;   // index into the flow's hops
    double weight = 0;
  };
  using Timer = std::pair<double, std::pair<int, int>>;  // (ready time, (transfer, flow))

  int new_transfer();
  void flow_ready(int transfer, int flow, double t);  // latency paid: starts transferring (or completes)
  void flow_done(int transfer, int flow, double t);
  void recompute_rates();
  void recompute_all();
  bool recompute_local();  // false: a shared link saturated, recompute_all() must run instead
  bool fill(size_t unfrozen, const std::vector<int>& links);
  void apply_rates();  // new_rate_ of component_flows_
  void add_active(int transfer, int flow, double bytes);
  void remove_active(size_t i);
  void set_slot(size_t i, size_t from);  // copies slot `from`'s per-slot arrays into slot i
  static const std::vector<Hop>& hops_of(const Active& a) { return *a.hops; }

  std::vector<double> link_bw_;
  std::vector<Transfer> transfers_;
  std::vector<int> free_transfers_;
  int live_transfers_ = 0;
  std::vector<Active> active_;  // the first num_active_ are in flight
  size_t num_active_ = 0;
  bool dirty_ = false;
  double now_ = 0;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers_;
  std::vector<int64_t> done_tokens_;
  int64_t flows_started_ = 0;
  int64_t rate_updates_ = 0;
  int64_t full_rate_updates_ = 0;
  bool local_rates_ = true;
  bool due_filter_ = true;
  double next_finish_ = std::numeric_limits<double>::infinity();  // earliest finish of an active flow
  double next_due_ = std::numeric_limits<double>::infinity();     // earliest time a flow passes the done test
  std::vector<std::pair<int, int>> finished_;
  // Per link (dense over all links): the active flows crossing it, kept up to date by add_active/remove_active;
  // its position in links_ (-1 when no active flow crosses it); progressive-filling weight and capacity left.
  std::vector<std::vector<Member>> members_;
  std::vector<int> link_pos_;
  std::vector<int> links_;          // links with at least one active flow
  std::vector<double> weight_sum_;  // weight of its members
  std::vector<double> weight_, left_;
  std::vector<char> frozen_;      // per active flow
  std::vector<double> new_rate_;  // per active flow
  std::vector<size_t> just_frozen_;
  std::vector<size_t> saturated_;
  // Local recomputation: saturated in the last allocation, per link; load (bytes/s of all flows) per link;
  // flows started and saturated links left by ended flows since then; the component's flows and links.
  std::vector<char> saturated_link_;
  std::vector<double> load_;
  std::vector<int> fresh_;
  std::vector<int> seed_links_;
  std::vector<int> link_mark_;  // >= mark_epoch_: visited in this component search; mark_epoch_ + 1: shared
  std::vector<int> inside_count_;  // per component link: its member flows in the component, and their load
  std::vector<double> inside_load_;
  int mark_epoch_ = 0;
  std::vector<int> component_links_;
  std::vector<size_t> component_flows_;
};

}  // namespace piper::sim
