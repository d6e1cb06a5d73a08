#include "piper/sim/fluid.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "piper/base/check.h"

namespace piper::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// A flow with less than this fraction of its bytes left is done (rounding of left - rate * dt).
constexpr double kDoneFraction = 1e-9;
// Relative clock resolution: transfers this close to their end count as finished.
constexpr double kClockSlack = 1e-12;

}  // namespace

void FlowTemplate::finalize() {
  for (Flow& f : flows) f.children.clear();
  for (size_t i = 0; i < flows.size(); ++i) {
    for (int a : flows[i].after) {
      PIPER_CHECK(a >= 0 && static_cast<size_t>(a) < i, "flow ", i, " waits for flow ", a, " that is not earlier");
      flows[static_cast<size_t>(a)].children.push_back(static_cast<int>(i));
    }
  }
}

FluidNet::FluidNet(std::vector<double> link_bw_bytes_per_s) : link_bw_(std::move(link_bw_bytes_per_s)) {
  for (double bw : link_bw_) PIPER_CHECK(std::isfinite(bw) && bw > 0, "link bandwidth ", bw);
}

int FluidNet::new_transfer() {
  ++live_transfers_;
  if (!free_transfers_.empty()) {
    int id = free_transfers_.back();
    free_transfers_.pop_back();
    return id;
  }
  transfers_.emplace_back();
  return static_cast<int>(transfers_.size()) - 1;
}

void FluidNet::start(const FlowTemplate* tmpl, double payload, double now, int64_t token) {
  PIPER_CHECK(now >= now_ - 1e-12 * std::max(1.0, now_), "transfer started in the past: ", now, " < ", now_);
  const int id = new_transfer();
  Transfer& tr = transfers_[static_cast<size_t>(id)];
  tr.tmpl = tmpl;
  tr.payload = payload;
  tr.token = token;
  tr.flows_left = static_cast<int>(tmpl->flows.size());
  tr.waiting.resize(tmpl->flows.size());
  if (tr.flows_left == 0) {
    done_tokens_.push_back(token);
    transfers_[static_cast<size_t>(id)].tmpl = nullptr;
    free_transfers_.push_back(id);
    --live_transfers_;
    return;
  }
  for (size_t f = 0; f < tmpl->flows.size(); ++f) {
    tr.waiting[f] = static_cast<int>(tmpl->flows[f].after.size());
    if (tr.waiting[f] == 0) timers_.push({now + tmpl->flows[f].latency_s, {id, static_cast<int>(f)}});
  }
}

void FluidNet::flow_ready(int transfer, int flow, double t) {
  const Transfer& tr = transfers_[static_cast<size_t>(transfer)];
  const FlowTemplate::Flow& f = tr.tmpl->flows[static_cast<size_t>(flow)];
  const double bytes = f.bytes * tr.payload;
  ++flows_started_;
  if (f.hops.empty() || bytes <= 0) {
    flow_done(transfer, flow, t);
    return;
  }
  active_.push_back({transfer, flow, bytes, 0.0});
  dirty_ = true;
}

void FluidNet::flow_done(int transfer, int flow, double t) {
  Transfer& tr = transfers_[static_cast<size_t>(transfer)];
  const FlowTemplate::Flow& f = tr.tmpl->flows[static_cast<size_t>(flow)];
  for (int c : f.children) {
    if (--tr.waiting[static_cast<size_t>(c)] == 0) {
      timers_.push({t + tr.tmpl->flows[static_cast<size_t>(c)].latency_s, {transfer, c}});
    }
  }
  if (--tr.flows_left == 0) {
    done_tokens_.push_back(tr.token);
    tr.tmpl = nullptr;
    free_transfers_.push_back(transfer);
    --live_transfers_;
  }
}

void FluidNet::recompute_rates() {
  // Progressive filling (flow_sim.h's max_min_rates) with buffers kept across calls: only the links the active
  // flows touch are visited, so a call costs O(active flows x hops + touched links x rounds), not O(all links).
  if (slot_.size() != link_bw_.size()) slot_.assign(link_bw_.size(), -1);
  touched_.clear();
  const size_t nf = active_.size();
  frozen_.assign(nf, 0);
  for (size_t f = 0; f < nf; ++f) {
    const auto& hops = hops_of(active_[f]);
    for (const Hop& h : hops) {
      int& s = slot_[static_cast<size_t>(h.link)];
      if (s < 0) {
        s = static_cast<int>(touched_.size());
        touched_.push_back(h.link);
        if (weight_.size() < touched_.size()) {
          weight_.resize(touched_.size());
          left_.resize(touched_.size());
          members_.resize(touched_.size());
        }
        weight_[static_cast<size_t>(s)] = 0;
        left_[static_cast<size_t>(s)] = link_bw_[static_cast<size_t>(h.link)];
        members_[static_cast<size_t>(s)].clear();
      }
      weight_[static_cast<size_t>(s)] += h.weight;
      members_[static_cast<size_t>(s)].push_back(static_cast<int>(f));
    }
  }
  size_t unfrozen = nf;
  double level = 0;
  while (unfrozen > 0) {
    double inc = kInf;
    for (size_t i = 0; i < touched_.size(); ++i) {
      if (weight_[i] > 0) inc = std::min(inc, left_[i] / weight_[i]);
    }
    PIPER_CHECK(std::isfinite(inc), "an active flow crosses no loaded link");
    level += inc;
    saturated_.clear();
    for (size_t i = 0; i < touched_.size(); ++i) {
      if (weight_[i] <= 0) continue;
      left_[i] -= inc * weight_[i];
      if (left_[i] <= 4e-12 * link_bw_[static_cast<size_t>(touched_[i])]) saturated_.push_back(i);
    }
    for (size_t i : saturated_) {
      for (int f : members_[i]) {
        if (frozen_[static_cast<size_t>(f)]) continue;
        frozen_[static_cast<size_t>(f)] = 1;
        active_[static_cast<size_t>(f)].rate = level;
        --unfrozen;
        for (const Hop& h : hops_of(active_[static_cast<size_t>(f)])) {
          weight_[static_cast<size_t>(slot_[static_cast<size_t>(h.link)])] -= h.weight;
        }
      }
      weight_[i] = 0;
    }
  }
  for (int l : touched_) slot_[static_cast<size_t>(l)] = -1;
  dirty_ = false;
  ++rate_updates_;
}

double FluidNet::next_time() {
  if (!done_tokens_.empty()) return now_;
  if (dirty_) recompute_rates();
  double t = timers_.empty() ? kInf : timers_.top().first;
  for (const Active& a : active_) t = std::min(t, now_ + a.left / a.rate);
  return t;
}

void FluidNet::advance(double t, std::vector<int64_t>* completed) {
  if (dirty_) recompute_rates();
  const double dt = std::max(0.0, t - now_);
  now_ = std::max(now_, t);
  if (dt > 0 || !active_.empty()) {
    std::vector<std::pair<int, int>> finished;
    for (size_t i = 0; i < active_.size();) {
      Active& a = active_[i];
      a.left -= a.rate * dt;
      const Transfer& tr = transfers_[static_cast<size_t>(a.transfer)];
      const double bytes = tr.tmpl->flows[static_cast<size_t>(a.flow)].bytes * tr.payload;
      // Done when (almost) nothing is left, or when what is left cannot move time forward any more (it would
      // finish within rounding of the clock: without this the loop could stall on a zero-length step).
      if (a.left <= kDoneFraction * bytes || a.left <= a.rate * kClockSlack * std::max(1.0, now_)) {
        finished.emplace_back(a.transfer, a.flow);
        active_[i] = active_.back();
        active_.pop_back();
        dirty_ = true;
      } else {
        ++i;
      }
    }
    for (auto [tr, f] : finished) flow_done(tr, f, now_);
  }
  const double slack = kClockSlack * std::max(1.0, now_);
  while (!timers_.empty() && timers_.top().first <= now_ + slack) {
    auto [tr, f] = timers_.top().second;
    timers_.pop();
    flow_ready(tr, f, now_);
  }
  completed->insert(completed->end(), done_tokens_.begin(), done_tokens_.end());
  done_tokens_.clear();
}

}  // namespace piper::sim
