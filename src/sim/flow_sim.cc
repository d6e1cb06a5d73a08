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
  const size_t nf = flows.size();
  std::vector<double> rate(nf, 0.0);
  std::vector<bool> frozen(nf, false);
  std::vector<double> left = capacity;
  std::vector<double> weight(capacity.size(), 0.0);
  size_t unfrozen = 0;
  for (size_t f = 0; f < nf; ++f) {
    if (flows[f]->empty()) {
      rate[f] = kInf;
      frozen[f] = true;
    } else {
      ++unfrozen;
    }
  }
  std::vector<int> touched;  // links crossed by some flow, in first-seen order
  for (size_t f = 0; f < nf; ++f) {
    for (const Hop& h : *flows[f]) {
      if (weight[h.link] == 0) touched.push_back(h.link);
      weight[h.link] += h.weight;
    }
  }
  while (unfrozen > 0) {
    double inc = kInf;
    for (int l : touched) {
      if (weight[l] > 0) inc = std::min(inc, left[l] / weight[l]);
    }
    PIPER_CHECK(std::isfinite(inc), "an unfrozen flow crosses no loaded link");
    for (size_t f = 0; f < nf; ++f) {
      if (!frozen[f]) rate[f] += inc;
    }
    std::vector<bool> saturated(capacity.size(), false);
    for (int l : touched) {
      if (weight[l] <= 0) continue;
      left[l] -= inc * weight[l];
      if (left[l] <= kRelEps * capacity[l] * 4) saturated[l] = true;
    }
    for (size_t f = 0; f < nf; ++f) {
      if (frozen[f]) continue;
      bool hit = false;
      for (const Hop& h : *flows[f]) hit = hit || saturated[h.link];
      if (!hit) continue;
      frozen[f] = true;
      --unfrozen;
      for (const Hop& h : *flows[f]) weight[h.link] -= h.weight;
    }
    for (int l : touched) {
      if (saturated[l]) weight[l] = 0;  // guards against rounding leaving a tiny positive weight
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
