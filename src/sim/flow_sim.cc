#include "piper/sim/flow_sim.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <utility>

#include "piper/base/check.h"

namespace piper::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Relative slack when deciding that a link is saturated or that flows finish at the same instant.
constexpr double kRelEps = 1e-12;

}  // namespace

std::vector<double> max_min_rates(const std::vector<double>& capacity,
                                  const std::vector<const std::vector<Hop>*>& flows) {
  // Progressive filling, organised by link: every unfrozen flow has rate `level`; each round raises the level
  // to the next saturation and freezes the flows of the saturated links. Cost O(links^2 + flows * hops).
  const int nf = static_cast<int>(flows.size());
  std::vector<double> rate(nf, kInf);
  std::vector<bool> frozen(nf, true);
  std::vector<int> slot(capacity.size(), -1);  // link -> index into the touched-link arrays
  std::vector<int> links;                      // touched links
  std::vector<double> weight, left;            // per touched link: unfrozen weight, capacity left at `level`
  std::vector<std::vector<int>> members;       // per touched link: flows crossing it
  int unfrozen = 0;
  for (int f = 0; f < nf; ++f) {
    if (flows[f]->empty()) continue;
    frozen[f] = false;
    ++unfrozen;
    for (const Hop& h : *flows[f]) {
      if (slot[h.link] < 0) {
        slot[h.link] = static_cast<int>(links.size());
        links.push_back(h.link);
        weight.push_back(0);
        left.push_back(capacity[h.link]);
        members.emplace_back();
      }
      weight[slot[h.link]] += h.weight;
      members[slot[h.link]].push_back(f);
    }
  }
  double level = 0;
  std::vector<int> saturated;
  while (unfrozen > 0) {
    double inc = kInf;
    for (size_t i = 0; i < links.size(); ++i) {
      if (weight[i] > 0) inc = std::min(inc, left[i] / weight[i]);
    }
    PIPER_CHECK(std::isfinite(inc), "an unfrozen flow crosses no loaded link");
    level += inc;
    saturated.clear();
    for (size_t i = 0; i < links.size(); ++i) {
      if (weight[i] <= 0) continue;
      left[i] -= inc * weight[i];
      if (left[i] <= kRelEps * 4 * capacity[links[i]]) saturated.push_back(static_cast<int>(i));
    }
    for (int i : saturated) {
      for (int f : members[i]) {
        if (frozen[f]) continue;
        frozen[f] = true;
        rate[f] = level;
        --unfrozen;
        for (const Hop& h : *flows[f]) weight[slot[h.link]] -= h.weight;
      }
      weight[i] = 0;  // guards against rounding leaving a tiny positive weight
    }
  }
  return rate;
}

FlowSim::FlowSim(std::vector<double> link_bw_bytes_per_s) : link_bw_(std::move(link_bw_bytes_per_s)) {
  for (double bw : link_bw_) PIPER_CHECK(std::isfinite(bw) && bw > 0, "link bandwidth ", bw);
}

Result<int> FlowSim::add(FlowSpec spec) {
  const std::string where = "flow " + std::to_string(flows_.size()) + ": ";
  for (const Hop& h : spec.hops) {
    if (h.link < 0 || h.link >= static_cast<int>(link_bw_.size())) {
      return out_of_range(where + "link " + std::to_string(h.link) + " outside [0, " + std::to_string(link_bw_.size()) +
                          ")");
    }
    if (!std::isfinite(h.weight) || h.weight <= 0) {
      return invalid_argument(where + "hop weight " + std::to_string(h.weight) + " must be > 0 (member flows)");
    }
  }
  for (double x : {spec.bytes, spec.latency_s, spec.release_s}) {
    if (!std::isfinite(x) || x < 0) return invalid_argument(where + "bytes, latency_s and release_s must be >= 0");
  }
  for (int dep : spec.after) {
    if (dep < 0 || dep >= static_cast<int>(flows_.size())) {
      return invalid_argument(where + "waits for flow " + std::to_string(dep) + ", which is not an earlier flow");
    }
  }
  flows_.push_back(std::move(spec));
  return static_cast<int>(flows_.size()) - 1;
}

std::vector<double> FlowSim::run(Stats* stats) const {
  const int n = num_flows();
  std::vector<double> done(n, kInf);
  std::vector<int> waiting(n, 0);
  std::vector<double> ready(n, 0.0);  // latest completion among dependencies
  std::vector<std::vector<int>> children(n);
  for (int f = 0; f < n; ++f) {
    waiting[f] = static_cast<int>(flows_[f].after.size());
    for (int dep : flows_[f].after) children[dep].push_back(f);
  }
  using Event = std::pair<double, int>;  // (activation time, flow)
  std::priority_queue<Event, std::vector<Event>, std::greater<>> starts;
  auto schedule = [&](int f) { starts.emplace(std::max(ready[f], flows_[f].release_s) + flows_[f].latency_s, f); };
  for (int f = 0; f < n; ++f) {
    if (waiting[f] == 0) schedule(f);
  }
  std::vector<int> active;
  std::vector<double> left(n, 0.0);
  auto complete = [&](int f, double t) {
    done[f] = t;
    for (int c : children[f]) {
      ready[c] = std::max(ready[c], t);
      if (--waiting[c] == 0) schedule(c);
    }
  };
  double now = 0;
  while (!active.empty() || !starts.empty()) {
    if (active.empty()) now = std::max(now, starts.top().first);
    // Activate everything due now; flows with nothing to transfer finish at once (possibly releasing others).
    while (!starts.empty() && starts.top().first <= now * (1 + kRelEps)) {
      const int f = starts.top().second;
      starts.pop();
      if (flows_[f].hops.empty() || flows_[f].bytes == 0) {
        complete(f, now);
      } else {
        left[f] = flows_[f].bytes;
        active.push_back(f);
      }
    }
    if (active.empty()) continue;
    std::vector<const std::vector<Hop>*> paths;
    for (int f : active) paths.push_back(&flows_[f].hops);
    const std::vector<double> rate = max_min_rates(link_bw_, paths);
    if (stats != nullptr) ++stats->rate_updates;
    double dt = starts.empty() ? kInf : starts.top().first - now;
    for (size_t i = 0; i < active.size(); ++i) dt = std::min(dt, left[active[i]] / rate[i]);
    const double finish_slack = dt * (1 + 1e-9);
    std::vector<int> still;
    for (size_t i = 0; i < active.size(); ++i) {
      const int f = active[i];
      if (left[f] / rate[i] <= finish_slack) {
        left[f] = 0;
      } else {
        left[f] -= rate[i] * dt;
        still.push_back(f);
      }
    }
    now += dt;
    for (size_t i = 0; i < active.size(); ++i) {
      if (left[active[i]] == 0) complete(active[i], now);
    }
    active = std::move(still);
  }
  return done;
}

}  // namespace piper::sim
